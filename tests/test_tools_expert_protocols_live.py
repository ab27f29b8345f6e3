"""tools.experts="reference" over real HTTP: the project's server (a scripted engine)
plays four experts, one per catalogue family, behind a recording proxy; the "qa"
environment's tools and episodes call them. What each expert is sent (never the
orchestrator's words), at which temperature, how its reply is read, the program
run in the sandbox for 60 s, every call priced, and an answer ending the episode."""

import asyncio
import json

import pytest
import yaml

from experiments.configs import grpo_hle
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.eval.routers import RouterEngine
from orchestra_jax.rewards.judge import JudgeVerdict
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import serve_in_thread
from orchestra_jax.tasks import Task
from orchestra_jax.tools import build_index, pricing
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.config import ModelAlias, ToolConfig
from orchestra_jax.training import builders
from orchestra_jax.training.experiment_config import validate
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes
from tests.live_helpers import RecordingProxy

FAMILIES = {"tiny-gpt": "gpt", "tiny-qwen": "qwen", "tiny-math": "math", "tiny-other": "other"}
PRICES = {"tiny-gpt": (1.25, 10.0), "tiny-qwen": (0.8, 0.8), "tiny-math": (0.2, 0.2)}
CANARY = "ORCHESTRATOR-CANARY"
QUESTION = "Which river carved the valley of Quilton?"


def role_of(prompt: str) -> str:
    if "<query>" in prompt:
        return "query"
    if "```python and ```" in prompt:
        return "code"
    return "answer"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """One expert server (its replies per role in `replies`, set by each test) behind a
    recording proxy, an index of the live_tiny corpus, and the "qa" env on them."""
    tmp = tmp_path_factory.mktemp("experts")
    tokenizer = load_tokenizer("demo")
    replies = {"query": "", "code": "", "answer": ""}

    def policy(ids, request):
        return tokenizer.encode(replies[role_of(tokenizer.decode(ids))]) + [tokenizer.im_end_id]

    server = serve_in_thread(ScriptedEngine(policy), tokenizer=tokenizer)
    proxy = RecordingProxy(server.url)
    build_index.main(
        [
            "--corpus",
            f"{grpo_hle.REPO_DIR}/experiments/data/live_tiny_corpus.jsonl",
            "--out",
            str(tmp / "idx"),
        ]
    )
    models = []
    for name, family in FAMILIES.items():
        price_in, price_out = PRICES.get(name, (0.9, 0.9))
        models.append(
            {
                "name": name,
                "model": name,
                "family": family,
                "base_url": proxy.url + "/v1",
                "api_key_env": None,
                "price_in": price_in,
                "price_out": price_out,
                "latency_s": 1,
                "roles": ["answer-math"] if family == "math" else ["search", "reasoner", "answer"],
            }
        )
    (tmp / "models.yaml").write_text(yaml.safe_dump({"models": models}))
    (tmp / "frames.jsonl").write_text(
        json.dumps({"id": "wiki____0", "question": QUESTION, "answer": "zq-gold"}) + "\n"
    )
    config = grpo_hle.get_config("live_tiny")
    config.workdir = str(tmp / "run")
    config.tools.experts = "reference"
    config.tools.catalogue = str(tmp / "models.yaml")
    config.tools.search_index = str(tmp / "idx")
    config.tools.expert_max_tokens = 1024
    config.data.paths.frames = str(tmp / "frames.jsonl")
    config.data.eval_fraction = 1.0
    validate(config)
    env = builders.build_env(config)
    runs = []
    sandbox = env.run_code

    def recording_sandbox(code, *, timeout_s):
        runs.append((code, timeout_s))
        return sandbox(code, timeout_s=timeout_s)

    env.run_code = recording_sandbox
    yield {"env": env, "proxy": proxy, "replies": replies, "runs": runs, "tokenizer": tokenizer}
    proxy.close()
    server.stop()


def tool_config(search="tiny-qwen", reasoner="tiny-qwen", answer="tiny-qwen"):
    def alias(name, tool, backend):
        price_in, price_out = PRICES.get(backend, (0.9, 0.9))
        return ModelAlias(name, tool, backend, price_in, price_out, 1.0)

    return ToolConfig(
        aliases=(
            alias("search-1", "search", search),
            alias("reasoner-1", "enhance_reasoning", reasoner),
            alias("answer-1", "answer", answer),
        ),
        search_top_k=2,
        search_price_per_query=0.01,
        search_price_per_document=0.0,
    )


def call(live, tool, alias, config, context):
    tools = live["env"].tools(config)
    return asyncio.run(tools[tool]({"model": alias}, context))


def new_context():
    return ToolContext(
        task=Task("wiki____0", QUESTION, "zq-gold"),
        messages=[
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": f"{CANARY}: I think it is the Rhine."},
        ],
    )


def sent(live, before):
    return live["proxy"].chat_records()[before:]


def check_priced(result, config, alias, *, extra=0.0):
    """The call's cost: its usage at the alias's prices (plus the search or code term)."""
    a = config.alias(alias)
    meta = result.metadata
    tokens = pricing.token_cost(
        meta["prompt_tokens"], meta["completion_tokens"], a.price_in, a.price_out
    )
    assert result.cost_usd == pytest.approx(tokens + extra)


def test_search_expert_writes_a_query_and_reads_only_problem_and_documents(live):
    config, context = tool_config(search="tiny-qwen"), new_context()
    context.documents.append("Quilton lies on a river.")
    live["replies"]["query"] = "Let me think. <query>Quilton river valley</query>"
    before = len(live["proxy"].chat_records())
    result = call(live, "search", "search-1", config, context)
    assert result.error is None and result.metadata["query"] == "Quilton river valley"
    [record] = sent(live, before)
    request = record["request"]
    assert request["model"] == "tiny-qwen" and request["temperature"] == 0.2
    [message] = request["messages"]
    assert message["role"] == "user" and CANARY not in json.dumps(request)
    assert message["content"].startswith("Documents:\nDoc 1: Quilton lies on a river.\n\n")
    assert f"Question: {QUESTION}\n" in message["content"] and "<query>" in message["content"]
    assert len(context.documents) > 1  # the retrieved documents joined the episode's
    usage = record["response"]["usage"]
    assert (result.metadata["prompt_tokens"], result.metadata["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    check_priced(result, config, "search-1", extra=0.01)


def test_a_short_query_is_the_question_and_a_long_one_is_cut_to_390(live):
    config = tool_config(search="tiny-gpt")
    live["replies"]["query"] = "<query>abc</query>"
    before = len(live["proxy"].chat_records())
    result = call(live, "search", "search-1", config, new_context())
    assert result.metadata["query"] == QUESTION
    [record] = sent(live, before)
    assert record["request"]["temperature"] == 1.0  # family gpt
    live["replies"]["query"] = "<query>" + "valley " * 80 + "</query>"
    result = call(live, "search", "search-1", config, new_context())
    assert result.metadata["query"] == ("valley " * 80)[:390]


def test_reasoning_expert_code_runs_in_the_sandbox_for_60_s_and_its_stdout_comes_back(live):
    config, context = tool_config(reasoner="tiny-other"), new_context()
    live["replies"]["code"] = "Here:\n```python\nprint(6 * 7)\n```"
    before, runs = len(live["proxy"].chat_records()), len(live["runs"])
    result = call(live, "enhance_reasoning", "reasoner-1", config, context)
    assert live["runs"][runs:] == [("\nprint(6 * 7)\n", 60.0)]
    assert result.error is None and "42" in result.text
    assert context.notes == ["```python\n\nprint(6 * 7)\n\n```\n\n```output\n42\n\n```\n\n"]
    [record] = sent(live, before)
    assert record["request"]["temperature"] == 0.2 and CANARY not in json.dumps(record)
    seconds = result.metadata["code_seconds"]
    check_priced(result, config, "reasoner-1", extra=seconds * config.code_price_per_s)
    # The next expert reads the program and its output.
    live["replies"]["answer"] = "<answer>42</answer>"
    before = len(live["proxy"].chat_records())
    call(live, "answer", "answer-1", tool_config(answer="tiny-gpt"), context)
    [record] = sent(live, before)
    content = record["request"]["messages"][0]["content"]
    assert content.startswith("```python\n\nprint(6 * 7)\n\n```\n\n```output\n42\n\n```")


@pytest.mark.parametrize(
    "backend, temperature, expected",
    [
        ("tiny-qwen", 0.2, "Rhône"),
        ("tiny-math", 0.2, "Rhône"),
        ("tiny-gpt", 1.0, "Rhine"),
        ("tiny-other", 0.2, "Rhine"),
    ],
)
def test_answer_is_read_by_family_at_the_familys_temperature(live, backend, temperature, expected):
    live["replies"]["answer"] = "<think>so</think><answer>Rhine</answer> \\boxed{Rhône}"
    config = tool_config(answer=backend)
    before = len(live["proxy"].chat_records())
    result = call(live, "answer", "answer-1", config, new_context())
    assert result.final_answer == expected and result.is_final
    [record] = sent(live, before)
    assert record["request"]["temperature"] == temperature
    content = record["request"]["messages"][0]["content"]
    assert ("\\boxed{}" in content) == (FAMILIES[backend] in ("qwen", "math"))
    assert CANARY not in json.dumps(record["request"])
    check_priced(result, config, "answer-1")


async def wrong(question, prediction, reference):
    del question, prediction, reference
    return JudgeVerdict(correct=False)


def play(live, config):
    """One episode of always_cheapest (search, enhance_reasoning, answer) on `config`."""
    env, tokenizer = live["env"], live["tokenizer"]
    [task] = env.tasks("heldout", 1)
    how = Episodes(
        env=env,
        tokenizer=tokenizer,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=64),
        limits=builders.loop_limits(grpo_hle.get_config("live_tiny")),
        engine=RouterEngine("always_cheapest", tokenizer, {task.id: config}),
        judge=wrong,
    )
    [trajectory] = asyncio.run(run_graded_episodes([task], [config], how, seed=0))
    return trajectory


@pytest.mark.parametrize(
    "answer, final", [("\\boxed{Rhine}", "Rhine"), ("<answer>Rhine</answer>", "")]
)
def test_an_answer_call_ends_the_episode_even_an_empty_answer(live, answer, final):
    live["replies"].update(
        query="<query>Quilton river</query>",
        code="```python\nprint(1)\n```",
        answer=answer,
    )
    config = tool_config(search="tiny-gpt", reasoner="tiny-qwen", answer="tiny-math")
    before = len(live["proxy"].chat_records())
    trajectory = play(live, config)
    assert trajectory.finish_reason == "answer"
    assert trajectory.final_answer == final  # a math model answers in \boxed{}
    records = sent(live, before)
    assert [r["request"]["model"] for r in records] == ["tiny-gpt", "tiny-qwen", "tiny-math"]
    assert [r["request"]["temperature"] for r in records] == [1.0, 0.2, 0.2]
    for record in records:  # the orchestrator's turns hold its tool calls: none is sent
        assert "<tool_call>" not in json.dumps(record["request"])
    results = [r for turn in trajectory.turns for r in turn.tool_results]
    assert [r.metadata["tool"] for r in results] == ["search", "enhance_reasoning", "answer"]
    assert all(r.error is None and r.cost_usd > 0 for r in results)
    assert trajectory.cost_usd == pytest.approx(
        trajectory.orchestrator_cost_usd + sum(r.cost_usd for r in results)
    )


def test_the_project_protocol_lets_an_empty_answer_go_on_and_sends_the_orchestrator(live):
    from orchestra_jax.tools.experts.protocols import PROJECT

    env = live["env"]
    reference, env.expert_protocol = env.expert_protocol, PROJECT
    try:
        live["replies"]["answer"] = ""
        before = len(live["proxy"].chat_records())
        context = new_context()
        result = call(live, "answer", "answer-1", tool_config(), context)
        assert result.error == "empty answer" and not result.is_final
        [record] = sent(live, before)
        assert CANARY in json.dumps(record["request"])
        assert record["request"]["messages"][0]["role"] == "system"
        assert record["request"]["temperature"] == 0.0
    finally:
        env.expert_protocol = reference
