"""A search's cost as the release's `call_tool` charges it (`generation_quick3.py`
563-567, ported verbatim below with the release's price table,
`rollout/tau2/utils/llm_utils.py` TOOL_PRICING) under `qwen3_8b`'s
`tools.search_pricing="reference"`: 30 documents from a paid engine and from a local
index; `qwen3_8b_project` charges $0.01 a query."""

import asyncio

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.config import ModelAlias, ToolConfig
from orchestra_jax.tools.experts.client import ExpertReply
from orchestra_jax.tools.experts.protocols import EXPERT_PROTOCOLS
from orchestra_jax.tools.registry import Backends, make_tools
from orchestra_jax.tools.retrieval.retrievers import Document
from orchestra_jax.tools.retrieval.search_pricing import search_charge
from orchestra_jax.training import builders

TOK = load_tokenizer("demo")
QUERY = "capital city of Japan population 2020 census"
TOOL_PRICING = {  # the release's (per token)
    "Qwen/Qwen3-8B": {
        "input_tokens_per_million": 0.2 / 1000000,
        "output_tokens_per_million": 0.2 / 1000000,
    },
    "tavily": {"search": 0.01, "extract": 0.002},
}


def release_search_cost(arguments, query_to_call, cur_tool_pricing=TOOL_PRICING):
    """`call_tool`, search (563-567), from a cost of 0."""
    cost = 0
    if arguments["cur_index"].startswith("wiki"):
        query_length = len(arguments["tokenizer"](query_to_call)["input_ids"])
        cost = cost + query_length * cur_tool_pricing["Qwen/Qwen3-8B"]["input_tokens_per_million"]
    else:
        cost = (
            cost
            + cur_tool_pricing["tavily"]["search"]
            + cur_tool_pricing["tavily"]["extract"] * arguments["topk_doc"]
        )
    return cost


class Searcher:
    def __init__(self, query=QUERY):
        self.query = query

    async def complete(self, messages, *, max_tokens, temperature, ctx=None):
        return ExpertReply(f"<query>{self.query}</query>", 100, 20, 1.0)


class Index:
    def __init__(self, n, query=QUERY):
        self.n, self.query = n, query

    def search(self, query, k, allowed_ids=None):
        assert query == self.query[:390]  # the release sends `query_to_call[:390]`
        return [Document(f"d{i}", f"passage {i}") for i in range(min(self.n, k))]


def search_cost(variant, engine, returned, query=QUERY):
    """The search tool's cost under `variant`'s fields, on `engine` returning
    `returned` documents for the searcher's `query` (the searcher model free, so only
    the search is charged)."""
    config = grpo_hle.get_config(variant)
    fields = builders.tool_config_fields(config)
    tool_config = ToolConfig(
        aliases=(ModelAlias("search-1", "search", "s", 0.0, 0.0, 1.0),),
        **{**fields, "tools": ("search",)},
    )
    charge = search_charge(config.tools.search_pricing, engine, lambda text: len(TOK.encode(text)))
    backends = Backends(
        experts={"s": Searcher(query)},
        retriever=Index(returned, query),
        search_charge=charge,
        expert_protocol=EXPERT_PROTOCOLS.get("reference"),
        families={"s": "qwen"},
    )
    tool = make_tools(tool_config, backends)["search"]
    result = asyncio.run(tool({"model": "search-1"}, ToolContext(Task("t", "Q?", "A"), seed=0)))
    assert result.error is None and len(result.metadata["doc_ids"]) == min(returned, 30)
    return result.cost_usd


def hf_tokenizer(seq):
    return {"input_ids": TOK.encode(seq)}


@pytest.mark.parametrize("returned", [30, 7])
def test_a_paid_engine_is_charged_as_the_release(returned):
    release = release_search_cost({"cur_index": "general", "topk_doc": 30}, QUERY)
    assert search_cost("qwen3_8b", "tavily", returned) == pytest.approx(release, rel=1e-12)
    assert release == pytest.approx(0.07)


def test_a_local_index_is_charged_the_querys_tokens():
    release = release_search_cost({"cur_index": "wiki", "tokenizer": hf_tokenizer}, QUERY)
    assert search_cost("qwen3_8b", "index", 30) == pytest.approx(release, rel=1e-12)
    assert 0 < release < 1e-5


def test_a_long_query_is_charged_whole_and_sent_cut():
    # The release counts the tokens of the whole query, then searches its first 390
    # characters (567-570).
    query = " ".join(f"term{i}" for i in range(100))
    assert len(query) > 390
    release = release_search_cost({"cur_index": "wiki", "tokenizer": hf_tokenizer}, query)
    assert search_cost("qwen3_8b", "index", 30, query) == pytest.approx(release, rel=1e-12)
    cut = release_search_cost({"cur_index": "wiki", "tokenizer": hf_tokenizer}, query[:390])
    assert release > cut


def test_the_project_charges_a_query():
    assert search_cost("qwen3_8b_project", "tavily", 30) == pytest.approx(0.01)
    assert search_cost("qwen3_8b_project", "index", 30) == pytest.approx(0.01)
