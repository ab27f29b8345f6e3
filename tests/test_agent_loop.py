"""The agent loop with a scripted engine: token exactness, limits, failures, accounting.

Fakes here follow the protocols: `FakeConfig` has the ToolConfig methods the
loop reads, `FakeTool` is a `Tool`. The engine is the real `ScriptedEngine`,
scripted per episode through the request id "<task>/<group>/<turn>".
"""

import asyncio
import json

import pytest

from orchestra_jax.agent import loop
from orchestra_jax.agent.loop import (
    EpisodeSpec,
    LoopLimits,
    make_group_specs,
    run_episodes_sync,
    turn_seed,
)
from orchestra_jax.chat.template import render
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import ToolResult, function_schema

TOK = load_tokenizer("demo")
SAMPLING = SamplingParams(temperature=1.0)


class FakeTool:
    """Answers `text` (or `final` for an answering tool) after `sleep_s`; may raise."""

    def __init__(
        self, name, text="ok", *, cost=0.0, latency=0.0, sleep_s=0.0, final=False, raises=None
    ):
        self.name, self.text, self.cost, self.latency = name, text, cost, latency
        self.sleep_s, self.final, self.raises = sleep_s, final, raises
        self.calls = []

    def schema(self):
        return function_schema(self.name, f"the {self.name} tool", {"q": {"type": "string"}}, [])

    async def __call__(self, arguments, ctx):
        self.calls.append(arguments)
        if self.sleep_s:
            await asyncio.sleep(self.sleep_s)
        if self.raises is not None:
            raise self.raises
        return ToolResult(
            text=self.text,
            cost_usd=self.cost,
            latency_s=self.latency,
            final_answer=arguments.get("q", "") if self.final else None,
        )


class FakeConfig:
    orchestrator_price = 0.2  # USD per million tokens

    def __init__(self, tools):
        self.tools = tools
        self.preference = {"accuracy": 1.0}

    def tool_schemas(self):
        return [t.schema() for t in self.tools]

    def system_prompt(self):
        return "You orchestrate tools."

    def feature_names(self):
        return ["accuracy", "cost", "latency"] + [f"tool:{t.name}" for t in self.tools]


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def logprob_of(turn, i):
    return -0.01 * (i + 1) - turn


def scripted(turns_by_episode, tok=TOK):
    """A ScriptedEngine whose episode "<task>/<g>" says turns_by_episode[key][turn] (+ <|im_end|>)."""

    def policy(ids, request):
        episode, turn = request.request_id.rsplit("/", 1)
        texts = turns_by_episode[episode]
        out = tok.encode(texts[min(int(turn), len(texts) - 1)] + "<|im_end|>")
        return out, [logprob_of(int(turn), i) for i in range(len(out))]

    return ScriptedEngine(policy)


def spec(tools, task_id="t0", group_index=0, seed=0):
    task = Task(id=task_id, question=f"What is {task_id}?", answer="42")
    return EpisodeSpec(
        task=task, tool_config=FakeConfig(tools), tools=tools, group_index=group_index, seed=seed
    )


def run(specs, engine, tok=TOK, **limits):
    return run_episodes_sync(specs, engine, tok, sampling=SAMPLING, limits=LoopLimits(**limits))


def mask_runs(traj):
    """[(mask, ids)] maximal runs of equal loss mask."""
    runs = []
    for token, m in zip(traj.token_ids, traj.loss_mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(token)
        else:
            runs.append((m, [token]))
    return runs


THREE_TURNS = [
    "<think>\nlook it up\n</think>\n\n" + call("search", q="x"),
    "<think>\nonce more\n</think>\n\n" + call("search", q="y"),
    "<think>\ndone\n</think>\n\n" + call("answer", q="42"),
]


def test_ids_mask_logprobs_line_up_and_trained_spans_are_the_generated_tokens():
    tools = [FakeTool("search", "found it"), FakeTool("answer", final=True)]
    specs = [spec(tools, "t0", g, seed=g) for g in range(2)]
    engine = scripted({"t0/0": THREE_TURNS, "t0/1": THREE_TURNS})
    trajs = run(specs, engine)
    for traj in trajs:
        assert traj.finish_reason == "answer" and traj.final_answer == "42"
        assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.rollout_logprobs)
        assert all(lp == 0.0 for lp, m in zip(traj.rollout_logprobs, traj.loss_mask) if m == 0)
        assert traj.loss_mask[: traj.prompt_length] == [0] * traj.prompt_length
        trained = [ids for m, ids in mask_runs(traj) if m == 1]
        assert [TOK.decode(ids) for ids in trained] == [t + "<|im_end|>" for t in THREE_TURNS]
        assert [turn.text for turn in traj.turns] == [t + "<|im_end|>" for t in THREE_TURNS]
        # Log-probs sit on exactly the tokens they were reported for.
        trained_logprobs = [lp for lp, m in zip(traj.rollout_logprobs, traj.loss_mask) if m]
        expected = [logprob_of(k, i) for k, ids in enumerate(trained) for i in range(len(ids))]
        assert trained_logprobs == pytest.approx(expected)
    # Token-in: each request is exactly the trajectory so far.
    for request in engine.requests:
        episode, turn = request.request_id.rsplit("/", 1)
        traj = trajs[int(episode.split("/")[1])]
        n = len(request.input_ids)
        assert traj.token_ids[:n] == list(request.input_ids)
        assert traj.loss_mask[n - 1] == 0 and traj.loss_mask[n] == 1  # a turn starts here
        assert request.sampling.seed == turn_seed(traj.seed, int(turn))
        assert TOK.im_end_id in request.sampling.stop_token_ids


@pytest.mark.parametrize("tokenizer_name", ["demo", "qwen3"])
def test_sequence_equals_template_render_when_append_only(tokenizer_name, request):
    """The rule (see chat/template.py): with thinking enabled, raw assistant text in
    `content`, and reasoning blocks of the canonical form "<think>\\nR\\n</think>\\n\\n"
    (R non-empty), the loop's ids equal the ids of a full render of the same
    conversation (plus the "\\n" the template writes after the last <|im_end|>)."""
    tok = TOK if tokenizer_name == "demo" else load_tokenizer(request.getfixturevalue("qwen3_dir"))
    tools = [FakeTool("search", "found: ünïcode ∑"), FakeTool("answer", final=True)]
    (traj,) = run([spec(tools)], scripted({"t0/0": THREE_TURNS}, tok), tok)
    messages = [
        {"role": "system", "content": "You orchestrate tools."},
        {"role": "user", "content": "What is t0?"},
    ]
    for k, text in enumerate(THREE_TURNS):
        messages.append({"role": "assistant", "content": text})
        if k < 2:
            messages.append({"role": "tool", "content": "found: ünïcode ∑"})
    full = render(messages, tools=FakeConfig(tools).tool_schemas())
    assert traj.token_ids + tok.encode("\n") == tok.encode(full)


def test_empty_think_blocks_are_not_append_only():
    """enable_thinking=False: the prompt's empty think block is dropped by a re-render
    of earlier turns, so only the token-in/token-out sequence is the truth."""
    tools = [FakeTool("search"), FakeTool("answer", final=True)]
    engine = scripted({"t0/0": [call("search", q="x"), call("answer", q="1")]})
    (traj,) = run([spec(tools)], engine, enable_thinking=False)
    assert traj.finish_reason == "answer"
    messages = [
        {"role": "system", "content": "You orchestrate tools."},
        {"role": "user", "content": "What is t0?"},
        {"role": "assistant", "content": call("search", q="x")},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": call("answer", q="1")},
    ]
    rerender = TOK.encode(render(messages, tools=FakeConfig(tools).tool_schemas()))
    assert traj.token_ids + TOK.encode("\n") != rerender
    assert TOK.decode(traj.token_ids).count("<think>\n\n</think>\n\n") == 2


def test_turn_limit():
    tools = [FakeTool("search"), FakeTool("answer", final=True)]
    (traj,) = run([spec(tools)], scripted({"t0/0": [call("search", q="again")]}), max_turns=3)
    assert traj.finish_reason == "max_turns" and len(traj.turns) == 3
    assert traj.loss_mask[-1] == 1 and traj.token_ids[-1] == TOK.im_end_id
    assert len(tools[0].calls) == 3 and traj.tool_call_counts["tool:search"] == 3


@pytest.mark.parametrize("extra", [0, 5, 40, 200])
def test_context_budget_is_never_exceeded(extra):
    tools = [FakeTool("search", "a long result " * 10), FakeTool("answer", final=True)]
    prompt_len = len(loop.render_prompt(spec(tools), TOK, enable_thinking=True))
    budget = prompt_len + extra
    (traj,) = run(
        [spec(tools)],
        scripted({"t0/0": [call("search", q="x" * 30)]}),
        max_context_tokens=budget,
        max_turns=30,
    )
    assert traj.finish_reason == "context"
    assert len(traj.token_ids) <= budget
    if extra:
        assert traj.loss_mask[-1] == 1  # ends right after a sampled token, never mid-observation
    else:
        assert traj.turns == [] and len(traj.token_ids) == prompt_len


def test_turn_cut_by_token_budget_is_closed_with_a_masked_im_end():
    tools = [FakeTool("search"), FakeTool("answer", final=True)]
    engine = scripted({"t0/0": [call("search", q="x" * 50), call("answer", q="1")]})
    (traj,) = run([spec(tools)], engine, max_new_tokens_per_turn=8)
    first = traj.turns[0]
    assert first.finish_reason == "length" and first.num_generated_tokens == 8
    assert not first.format_valid and not traj.format_valid
    end = traj.prompt_length + 8
    assert traj.token_ids[end] == TOK.im_end_id and traj.loss_mask[end] == 0
    assert first.observation.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nError")


def test_hanging_tool_times_out_into_an_observation():
    tools = [FakeTool("search", sleep_s=3600), FakeTool("answer", final=True)]
    engine = scripted({"t0/0": [call("search", q="x"), call("answer", q="1")]})
    (traj,) = run([spec(tools)], engine, tool_timeout_s=0.05)
    assert traj.finish_reason == "answer"
    result = traj.turns[0].tool_results[0]
    assert "did not answer within 0.05 s" in result.error and result.latency_s == 0.05
    assert "did not answer" in TOK.decode(engine.requests[1].input_ids)


def test_raising_tool_becomes_an_observation():
    tools = [
        FakeTool("search", raises=RuntimeError("backend down")),
        FakeTool("answer", final=True),
    ]
    engine = scripted({"t0/0": [call("search", q="x"), call("answer", q="1")]})
    (traj,) = run([spec(tools)], engine)
    assert traj.finish_reason == "answer" and traj.format_valid  # the model's call was fine
    assert "RuntimeError: backend down" in traj.turns[0].tool_results[0].text
    assert "backend down" in TOK.decode(engine.requests[1].input_ids)


def test_raising_tool_is_charged_its_wall_time_only_where_measured_time_counts():
    def failed_latency(**kwargs):
        tools = [
            FakeTool("search", sleep_s=0.05, raises=RuntimeError("down")),
            FakeTool("answer", final=True),
        ]
        engine = scripted({"t0/0": [call("search", q="x"), call("answer", q="1")]})
        (traj,) = run([spec(tools)], engine, **kwargs)
        return traj.turns[0].tool_results[0].latency_s

    assert failed_latency() >= 0.05
    # Offline runs: rewards must not depend on how long a failure took here.
    assert failed_latency(charge_tool_failure_time=False) == 0.0


def test_tool_returning_garbage_becomes_an_observation():
    class Garbage(FakeTool):
        async def __call__(self, arguments, ctx):
            return {"text": "not a ToolResult"}

    tools = [Garbage("search"), FakeTool("answer", final=True)]
    engine = scripted({"t0/0": [call("search", q="x"), call("answer", q="1")]})
    (traj,) = run([spec(tools)], engine)
    assert traj.finish_reason == "answer"
    assert "returned dict, not a ToolResult" in traj.turns[0].tool_results[0].text


@pytest.mark.parametrize(
    "bad_turn",
    [
        '<tool_call>\n{"name": "search", "arguments": {"q": "x"</tool_call>',  # malformed JSON
        call("browse", q="x"),  # unknown tool
        "I think the answer is 42.",  # no call at all
    ],
)
def test_invalid_calls_become_readable_errors(bad_turn):
    tools = [FakeTool("search"), FakeTool("answer", final=True)]
    engine = scripted({"t0/0": [bad_turn, call("answer", q="1")]})
    (traj,) = run([spec(tools)], engine)
    assert traj.finish_reason == "answer" and not traj.format_valid
    assert not traj.turns[0].format_valid and traj.turns[1].format_valid
    assert tools[0].calls == []
    seen = TOK.decode(engine.requests[1].input_ids)
    assert "<tool_response>\nError" in seen


def test_stop_on_no_tool_call():
    tools = [FakeTool("answer", final=True)]
    (traj,) = run([spec(tools)], scripted({"t0/0": ["just text"]}), stop_on_no_tool_call=True)
    assert traj.finish_reason == "no_tool_call" and len(traj.turns) == 1


def test_engine_failure_ends_only_that_episode():
    tools = [FakeTool("answer", final=True)]

    def policy(ids, request):
        if request.request_id.startswith("bad/"):
            raise ConnectionError("server gone")
        return TOK.encode(call("answer", q="1") + "<|im_end|>")

    # Batches of one, so the failing request's call holds no other episode's request.
    trajs = run([spec(tools, "bad"), spec(tools, "good")], ScriptedEngine(policy), max_batch_size=1)
    assert trajs[0].finish_reason == "error" and "server gone" in trajs[0].metadata["error"]
    assert trajs[1].finish_reason == "answer"


def test_costs_and_latency_accounting():
    tools = [
        FakeTool("search", cost=0.01, latency=2.0),
        FakeTool("lookup", cost=0.02, latency=5.0),
        FakeTool("answer", cost=0.1, latency=1.0, final=True),
    ]
    both = call("search", q="a") + "\n" + call("lookup", q="b")
    engine = scripted({"t0/0": [both, call("answer", q="7")]})
    (traj,) = run([spec(tools)], engine)
    assert traj.tool_cost_usd == pytest.approx(0.13)
    tokens = sum(t.prompt_tokens + t.num_generated_tokens for t in traj.turns)
    assert traj.orchestrator_cost_usd == pytest.approx(tokens * 0.2 / 1e6)
    assert traj.cost_usd == pytest.approx(traj.tool_cost_usd + traj.orchestrator_cost_usd)
    gen = sum(t.generation_latency_s for t in traj.turns)
    assert traj.latency_s == pytest.approx(gen + 5.0 + 1.0)  # slowest call per turn
    assert traj.tool_call_counts == {"tool:search": 1, "tool:lookup": 1, "tool:answer": 1}
    assert [r.text for r in traj.turns[0].tool_results] == ["ok", "ok"]  # call order kept
    assert [t.first_call_feature for t in traj.turns] == ["tool:search", "tool:answer"]


def test_first_valid_call_of_each_turn():
    """A turn's first valid call: the first that counts and runs without error,
    in the order written; every call still counts in tool_call_counts."""
    tools = [
        FakeTool("broken", raises=RuntimeError("down")),
        FakeTool("search"),
        FakeTool("answer", final=True),
    ]
    turns = [
        call("nope", q="a") + "\n" + call("broken", q="b") + "\n" + call("search", q="c"),
        call("broken", q="d"),
        call("search", q="e") + "\n" + call("answer", q="1"),
    ]
    (traj,) = run([spec(tools)], scripted({"t0/0": turns}), max_turns=5)
    assert traj.finish_reason == "answer"
    assert [t.first_call_feature for t in traj.turns] == ["tool:search", None, "tool:search"]
    assert traj.tool_call_counts == {"tool:broken": 2, "tool:search": 2, "tool:answer": 1}
    assert traj.first_call_counts() == {"tool:search": 2}


def test_group_specs_and_seeds():
    tools = [FakeTool("answer", final=True)]
    tasks = [Task(id=f"t{i}", question="?", answer="1") for i in range(3)]
    specs = make_group_specs(tasks, [FakeConfig(tools)] * 3, 4, seed=11, tools=[tools] * 3)
    assert [(s.task.id, s.group_index) for s in specs] == [
        (f"t{i}", g) for i in range(3) for g in range(4)
    ]
    assert len({s.seed for s in specs}) == 12
    again = make_group_specs(tasks, [FakeConfig(tools)] * 3, 4, seed=11, tools=[tools] * 3)
    assert [s.seed for s in again] == [s.seed for s in specs]
    assert turn_seed(5, 0) != turn_seed(5, 1) and turn_seed(5, 1) == turn_seed(5, 1)
    with pytest.raises(ValueError, match="tool configs"):
        make_group_specs(tasks, [FakeConfig(tools)], 4, seed=0, tools=[tools] * 3)
    with pytest.raises(ValueError, match="backends="):
        make_group_specs(tasks, [FakeConfig(tools)] * 3, 4, seed=0)
