"""Meta-tools charge and time exactly what the formulas say."""

import asyncio

import pytest

from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.config import ModelAlias, ToolConfig
from orchestra_jax.tools.experts import prompts
from orchestra_jax.tools.experts.client import ExpertError, ExpertReply
from orchestra_jax.tools.registry import Backends, make_tools
from orchestra_jax.tools.retrieval.retrievers import BM25Retriever, Document
from orchestra_jax.tools.sandbox.registry import SandboxResult

TASK = Task("t", "Where is Zorbel Works headquartered?", "Quilton")


class FixedExpert:
    """Replies per role with fixed text, 1000 prompt / 200 completion tokens."""

    def __init__(self, fail=False):
        self.fail, self.calls = fail, []

    async def complete(self, messages, *, max_tokens, temperature, ctx=None):
        self.calls.append(messages)
        if self.fail:
            raise ExpertError("server down")
        text = {
            "query": "Zorbel Works headquarters",
            "code": "```python\nprint(2 + 2)\n```",
            "answer": "thinking...\nFinal answer: Quilton",
        }[prompts.role_of(messages)]
        return ExpertReply(text, prompt_tokens=1000, completion_tokens=200, latency_s=3.0)


def fake_sandbox(code, *, timeout_s):
    assert code.strip() == "print(2 + 2)" and timeout_s == 7.0
    return SandboxResult("4\n", "", 0, False, False, duration_s=2.0)


def setup(expert=None, *, charge_measured_time=True):
    aliases = (
        ModelAlias("search-1", "search", "m", 1.0, 10.0, 5.0),
        ModelAlias("reasoner-1", "enhance_reasoning", "m", 2.0, 4.0, 5.0),
        ModelAlias("answer-1", "answer", "m", 0.5, 1.5, 5.0),
    )
    config = ToolConfig(
        aliases=aliases,
        tools=("search", "enhance_reasoning", "answer", "python"),
        search_top_k=2,
        search_price_per_query=0.01,
        search_price_per_document=0.002,
        code_price_per_s=0.1,
        code_timeout_s=7.0,
    )
    docs = [
        Document("d1", "Zorbel Works is headquartered in Quilton.", "Zorbel Works"),
        Document("d2", "Pell Guild was founded in 1700.", "Pell Guild"),
        Document("d3", "Zorbel Works has 12 members.", "Zorbel Works"),
    ]
    backends = Backends(
        experts={"m": expert or FixedExpert()},
        retriever=BM25Retriever(docs),
        run_code=fake_sandbox,
        charge_measured_time=charge_measured_time,
    )
    return make_tools(config, backends), ToolContext(task=TASK, seed=0)


def test_search_cost_and_latency():
    tools, ctx = setup()
    r = asyncio.run(tools["search"]({"model": "search-1"}, ctx))
    tokens = (1000 * 1.0 + 200 * 10.0) / 1e6
    assert r.error is None and r.metadata["doc_ids"][0] == "d1"
    assert r.cost_usd == pytest.approx(tokens + 0.01 + 2 * 0.002)
    assert 3.0 <= r.latency_s < 3.0 + 1.0  # expert + measured retrieval
    assert len(ctx.documents) == 2 and "Quilton" in ctx.documents[0]


def test_enhance_reasoning_cost_and_latency():
    tools, ctx = setup()
    r = asyncio.run(tools["enhance_reasoning"]({"model": "reasoner-1"}, ctx))
    assert r.cost_usd == pytest.approx((1000 * 2.0 + 200 * 4.0) / 1e6 + 2.0 * 0.1)
    assert r.latency_s == pytest.approx(3.0 + 2.0)
    assert ctx.notes == ["4"] and "4" in r.text


def test_answer_ends_the_episode():
    tools, ctx = setup()
    r = asyncio.run(tools["answer"]({"model": "answer-1"}, ctx))
    assert r.is_final and r.final_answer == "Quilton"
    assert r.cost_usd == pytest.approx((1000 * 0.5 + 200 * 1.5) / 1e6)
    assert r.latency_s == 3.0


def test_python_tool_bills_per_second():
    tools, ctx = setup()
    r = asyncio.run(tools["python"]({"code": "print(2 + 2)"}, ctx))
    assert r.cost_usd == pytest.approx(0.2) and r.latency_s == 2.0
    assert not r.is_final


def test_measured_time_can_go_uncharged():
    """Offline runs charge no wall time: cost and latency repeat exactly."""
    tools, ctx = setup(charge_measured_time=False)
    r = asyncio.run(tools["search"]({"model": "search-1"}, ctx))
    assert r.latency_s == 3.0
    assert r.cost_usd == pytest.approx((1000 * 1.0 + 200 * 10.0) / 1e6 + 0.01 + 2 * 0.002)
    r = asyncio.run(tools["enhance_reasoning"]({"model": "reasoner-1"}, ctx))
    assert r.latency_s == 3.0 and r.metadata["code_seconds"] == 2.0
    assert r.cost_usd == pytest.approx((1000 * 2.0 + 200 * 4.0) / 1e6)
    r = asyncio.run(tools["python"]({"code": "print(2 + 2)"}, ctx))
    assert r.cost_usd == 0 and r.latency_s == 0 and ctx.notes == ["4", "4"]


def test_bad_arguments_and_failing_backends_become_errors():
    tools, ctx = setup()
    r = asyncio.run(tools["answer"]({"model": "answer-9"}, ctx))
    assert r.error and "answer-1" in r.text and r.cost_usd == 0
    r = asyncio.run(tools["python"]({}, ctx))
    assert r.error and "code" in r.error
    tools, ctx = setup(FixedExpert(fail=True))
    r = asyncio.run(tools["search"]({"model": "search-1"}, ctx))
    assert r.error and "server down" in r.text and not r.is_final


def test_make_tools_rejects_missing_backends():
    config = ToolConfig(
        aliases=(ModelAlias("answer-1", "answer", "nope", 1, 1, 1),), tools=("answer",)
    )
    with pytest.raises(ValueError, match="nope"):
        make_tools(config, Backends(experts={}))


def test_registered_function_tools_are_plain_tools():
    from orchestra_jax.tools import function_tools

    if not function_tools.is_plain_tool("test_word_count"):
        function_tools.register_function_tool(
            "test_word_count",
            "Counts words.",
            {"text": {"type": "string", "description": "the text"}},
            lambda text: len(text.split()),
        )
    with pytest.raises(ValueError, match="already registered"):
        function_tools.register_function_tool("python", "x", {}, print)
    config = ToolConfig(
        aliases=(ModelAlias("answer-1", "answer", "m", 1, 1, 1),),
        tools=("answer", "test_word_count"),
        preference={"tool:test_word_count": 0.5},
    )
    tools = make_tools(config, Backends(experts={"m": FixedExpert()}))
    ctx = ToolContext(task=TASK)
    r = asyncio.run(tools["test_word_count"]({"text": "a b c"}, ctx))
    assert r.text == "3" and r.cost_usd == 0 and r.error is None
    r = asyncio.run(tools["test_word_count"]({"txt": "a"}, ctx))
    assert r.error and "missing arguments ['text']" in r.error
    assert config.tool_schemas()[1]["function"]["name"] == "test_word_count"
