"""A QA turn read and charged as the release does (`agent.tool_calls`,
`agent.accounting` "reference", `agent/reference_turns.py`), against the release's
code ported verbatim (`generation_quick3.py`: `ALL_TOOLS` 81-91, the QA branch of
`postprocess_predictions` 2104-2129, the cost and latency sums of
`execute_predictions` 2016-2074 and `run_llm_loop` 1282, 1337, 1391-1395), on
hand-built turns: calls inside `<think>`, two calls to one tool, an invalid call
beside a valid one, and an episode whose answer call is the most expensive."""

# ruff: noqa: E713, E722 (the release's code, verbatim)

import json

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.agent.loop import EpisodeSpec, LoopLimits, run_episodes_sync
from orchestra_jax.agent.reference_turns import offered_models, reference_tool_calls
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.chat.tool_calls import ToolCall, parse_tool_calls
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import ToolResult, function_schema
from orchestra_jax.tools.config import ModelAlias, ToolConfig
from orchestra_jax.training import builders, experiment_config

TOK = load_tokenizer("demo")

# --- the release, verbatim ----------------------------------------------------------

ALL_TOOLS = {
    "enhance_reasoning": {"model": ["reasoner-1", "reasoner-2", "reasoner-3"]},
    "answer": {
        "model": ["answer-math-1", "answer-math-2", "answer-1", "answer-2", "answer-3", "answer-4"]
    },
    "search": {"model": ["search-1", "search-2", "search-3"]},
}


def release_qa_calls(prediction):
    """`postprocess_predictions`, category 'qa' (2104-2129)."""
    cur_all_tool_calls = []
    format_correct = False
    components = prediction.split("<tool_call>")
    added_tools = set()
    for c in components:
        components1 = c.split("</tool_call>")
        for c1 in components1:
            try:
                tmp_tool_call = json.loads(c1)
                assert set(list(tmp_tool_call.keys())) == {"name", "arguments"}
                assert tmp_tool_call["name"] in ALL_TOOLS
                if tmp_tool_call["name"] in added_tools:
                    continue
                added_tools.add(tmp_tool_call["name"])
                func_signature = ALL_TOOLS[tmp_tool_call["name"]]
                for parameter_name, parameter_values in func_signature.items():
                    assert (
                        tmp_tool_call["arguments"][parameter_name] in parameter_values
                        or parameter_values == "any"
                    )
                cur_all_tool_calls.append(tmp_tool_call)
            except:
                pass
    if len(cur_all_tool_calls) > 0:
        format_correct = True
    return cur_all_tool_calls, format_correct


def release_turn_charges(tool_responses):
    """`execute_predictions`: one turn's cost and latency (2016-2074)."""
    iter_costs, iter_latency = [], []
    for cur_response in tool_responses:
        if cur_response["tool"] == "enhance_reasoning":
            pass
        elif cur_response["tool"] == "answer":
            break
        elif cur_response["tool"] == "search":
            pass
        iter_latency.append(cur_response["latency"])
        iter_costs.append(cur_response["cost"])
    return sum(iter_costs), sum(iter_latency)


def release_episode_charges(turns, price_in, price_out):
    """`run_llm_loop`: the episode's cost (tools + the orchestrator's tokens, 1282,
    1320) and latency (its tools', 1337), summed over turns (1391-1395).
    `turns`: [(input tokens, response tokens, tool responses)]."""
    example_costs = example_latency = 0
    for ic, rc, responses in turns:
        main_agent_cost = price_in * ic + price_out * rc
        new_costs, latencies = release_turn_charges(responses)
        example_costs += new_costs + main_agent_cost
        example_latency += latencies
    return example_costs, example_latency


# --- the turns ---------------------------------------------------------------------


def call(name, model):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': {'model': model}})}\n</tool_call>"


TURNS = {
    "in_think": "<think>\nsearch first: " + call("search", "search-2") + "\n</think>\n\nDone.",
    "twice": "<think>\nok\n</think>\n\n" + call("search", "search-1") + call("search", "search-3"),
    "one_invalid": call("enhance_reasoning", "reasoner-1") + call("answer", "gpt-9"),
    "bad_first": call("search", "search-9") + call("search", "search-1"),
    "bare_and_tagged": '{"name": "answer", "arguments": {"model": "answer-1"}}\n'
    + call("enhance_reasoning", "reasoner-2"),
    "plain": "<think>\nfine\n</think>\n\n" + call("answer", "answer-4"),
}

PRICES = {"search": (0.01, 2.0), "enhance_reasoning": (0.02, 3.0), "answer": (1.0, 50.0)}


def tool_config():
    aliases = tuple(
        ModelAlias(model, tool, "m", 1.0, 1.0, 1.0)
        for tool, spec in ALL_TOOLS.items()
        for model in spec["model"]
    )
    return ToolConfig(aliases=aliases, tools=("enhance_reasoning", "answer", "search"))


@pytest.mark.parametrize("name", list(TURNS))
def test_the_reference_reading_is_the_releases(name):
    calls = reference_tool_calls(TURNS[name], offered_models(list(ALL_TOOLS), tool_config()))
    release, well_formed = release_qa_calls(TURNS[name])
    assert [{"name": c.name, "arguments": c.arguments} for c in calls] == release
    assert bool(calls) == well_formed


def test_the_project_reads_five_of_the_six_turns_differently():
    schemas = tool_config().tool_schemas()
    differ = []
    for name, text in TURNS.items():
        ours = [c for c in parse_tool_calls(text, tools=schemas)]
        release, well_formed = release_qa_calls(text)
        valid = [
            {"name": c.name, "arguments": c.arguments} for c in ours if isinstance(c, ToolCall)
        ]
        if valid != release or (bool(ours) and len(valid) == len(ours)) != well_formed:
            differ.append(name)
    assert differ == ["in_think", "twice", "one_invalid", "bad_first", "bare_and_tagged"]


class PricedTool:
    """`name`'s call: PRICES[name] (cost, latency); `answer` ends the episode."""

    def __init__(self, name):
        self.name, self.calls = name, []

    def schema(self):
        return function_schema(self.name, self.name, {"model": {"type": "string"}}, ["model"])

    async def __call__(self, arguments, ctx):
        self.calls.append(arguments)
        cost, latency = PRICES[self.name]
        final = "42" if self.name == "answer" else None
        return ToolResult(text="ok", cost_usd=cost, latency_s=latency, final_answer=final)


EPISODE = [  # the answer call is the most expensive; the first turn has a call in <think>
    "<think>\n" + call("search", "search-1") + "\n</think>\n\n" + call("search", "search-2"),
    call("search", "search-3") + call("enhance_reasoning", "reasoner-1"),
    call("enhance_reasoning", "reasoner-2") + call("answer", "answer-1"),
]


def play(variant):
    config = grpo_hle.get_config(variant)
    limits = builders.loop_limits(config)
    limits = LoopLimits(
        max_turns=5,
        max_context_tokens=4096,
        seconds_per_generated_token=0.01,  # generation takes time, the project charges it
        tool_calls=limits.tool_calls,
        accounting=limits.accounting,
    )
    tools = {name: PricedTool(name) for name in ALL_TOOLS}

    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        return TOK.encode(EPISODE[turn] + "<|im_end|>")

    spec = EpisodeSpec(
        task=Task(id="t", question="What is 6 x 7?", answer="42"),
        tool_config=tool_config(),
        tools=tools,
        group_index=0,
        seed=0,
    )
    [traj] = run_episodes_sync(
        [spec], ScriptedEngine(policy), TOK, sampling=SamplingParams(), limits=limits
    )
    return traj, tools


def release_view(traj):
    """The episode's turns as the release's tools would have answered them."""
    turns = []
    for turn in traj.turns:
        calls, _ = release_qa_calls(turn.text)
        responses = [
            {"tool": c["name"], "cost": PRICES[c["name"]][0], "latency": PRICES[c["name"]][1]}
            for c in calls
        ]
        turns.append((turn.prompt_tokens, turn.num_generated_tokens, responses))
    return turns


def test_qwen3_8b_charges_the_episode_as_the_release():
    traj, tools = play("qwen3_8b")
    price = 0.2 / 1e6  # the release's Qwen3-8B prices, per token, input and output
    cost, latency = release_episode_charges(release_view(traj), price, price)
    assert traj.finish_reason == "answer" and len(traj.turns) == 3
    assert traj.cost_usd == pytest.approx(cost, rel=1e-12)
    assert traj.latency_s == pytest.approx(latency, rel=1e-12)
    assert latency == 2.0 + 2.0 + 3.0 + 3.0  # no answer, no generation time
    # Only the release's calls ran: one search a turn, the one in <think> included.
    assert [c["model"] for c in tools["search"].calls] == ["search-1", "search-3"]
    assert all(t.format_valid for t in traj.turns)


def test_the_project_charges_the_answer_and_the_generation():
    traj, tools = play("qwen3_8b_project")
    price = 0.2 / 1e6
    cost, latency = release_episode_charges(release_view(traj), price, price)
    assert traj.cost_usd > cost + 0.99  # the answer's $1 is charged
    assert traj.latency_s > 50.0 > latency  # the answer's 50 s and the generation time
    assert [c["model"] for c in tools["search"].calls] == ["search-2", "search-3"]


def test_an_unknown_reading_is_a_config_error():
    config = grpo_hle.get_config("qwen3_8b")
    config.agent.tool_calls = "lenient"
    assert any("agent.tool_calls" in e for e in experiment_config.problems(config))
    with pytest.raises(ValueError, match="accounting"):
        LoopLimits(accounting="cheap")
