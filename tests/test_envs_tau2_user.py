"""tau2's user simulator through the project's own OpenAI-compatible server (127.0.0.1).

The server hosts a scripted engine (what the user says is known, so stop signals
can be tested) or a tiny random Qwen3. A user endpoint that fails is retried;
one that stays dead ends the episode with the error recorded and nothing lost.
Needs the `tau2` extra and ../shared/tau2-bench (skipped, saying which, without).
"""

import asyncio
import json
import socket

import pytest

from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import ServerConfig, serve_in_thread
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes

TOK = load_tokenizer("demo")
TASK = "tau2/retail/70"  # exchange a helmet; communicate "22.55"
LIMITS = LoopLimits(max_turns=6, max_context_tokens=32768, enable_thinking=False)
SERVED = ServerConfig(model_path="user", tokenizer_path="demo", context_len=4096)


class UserScript:
    """What the served user model says: lines in order (per conversation), or an error."""

    def __init__(self):
        self.lines, self.fail_first, self.calls, self.verdict = [], 0, 0, True

    def __call__(self, ids, request):
        if "expectedOutcomes" in TOK.decode(ids):  # tau2's NL-assertion judge asks
            met = {"expectedOutcome": "the price", "reasoning": "-", "metExpectation": self.verdict}
            return TOK.encode(json.dumps({"results": [met]})) + [TOK.im_end_id]
        self.calls += 1
        if self.calls <= self.fail_first:
            raise RuntimeError("user model crashed")
        said = TOK.decode(ids).count("<|im_start|>assistant\n") - 1  # its earlier turns
        return TOK.encode(self.lines[min(said, len(self.lines) - 1)]) + [TOK.im_end_id]


@pytest.fixture(scope="module")
def user_server(tau2_data):
    script = UserScript()
    engine = ScriptedEngine(script)
    with serve_in_thread(engine, SERVED, tokenizer=TOK) as s:
        yield s, script, engine


@pytest.fixture(scope="module")
def task(tau2_data):
    from orchestra_jax.data.tau2_tasks import read_tau2_tasks

    tasks, _ = read_tau2_tasks(tau2_data / "tau2" / "domains" / "retail")
    [task] = [t for t in tasks if t.id == TASK]
    task.metadata["tau2_task"]["evaluation_criteria"]["reward_basis"] = ["DB", "COMMUNICATE"]
    return task


def make_env(tau2_data, url, judge_url="", **options):
    from orchestra_jax.envs.tau2.env import Tau2Environment, simulated_user_factory

    options = {"retries": 2, "backoff_s": 0.01, "price_in": 1.0, "price_out": 2.0, **options}
    judge = {"nl_assertions": "judge", "judge_url": judge_url, "judge_model": "user"}
    return Tau2Environment(
        simulated_user_factory(url, "user", **options),
        data_dir=tau2_data,
        **(judge if judge_url else {}),
    )


def play(env, task, plan, limits=LIMITS):
    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        return TOK.encode(plan[min(turn, len(plan) - 1)]) + [TOK.im_end_id]

    how = Episodes(
        env=env,
        engine=ScriptedEngine(policy),
        tokenizer=TOK,
        sampling=SamplingParams(),
        limits=limits,
    )
    config = env.tool_config_sampler().sample(task)
    [traj] = asyncio.run(run_graded_episodes([task], [config], how, seed=0))
    return traj


def gold_plan(task):
    actions = task.metadata["tau2_task"]["evaluation_criteria"]["actions"]
    calls = [
        "<tool_call>\n"
        + json.dumps({"name": a["name"], "arguments": a["arguments"]})
        + "\n</tool_call>"
        for a in actions
    ]
    return calls + ["You pay $22.55 for the difference."]


def test_the_simulated_user_speaks_through_the_server_and_its_stop_ends_the_episode(
    user_server, task, tau2_data
):
    server, script, engine = user_server
    script.lines, script.fail_first, script.calls = ["My helmet is too small.", "###STOP###"], 0, 0
    before = len(engine.requests)
    traj = play(make_env(tau2_data, server.url + "/v1"), task, gold_plan(task))
    assert traj.metadata["conversation_end"] == "user_stop" and traj.correct
    assert "My helmet is too small." in TOK.decode(traj.token_ids)
    # tau2's simulator: its guidelines and this task's scenario, at temperature 0.
    first = engine.requests[before]
    prompt = TOK.decode(first.input_ids)
    assert "<scenario>" in prompt and "Sofia Hernandez" in prompt
    assert first.sampling.temperature == 0.0
    spent = traj.metadata["other_party"]
    tokens = [(len(r.input_ids), 0) for r in engine.requests[before:]]
    assert spent["calls"] == 2 and spent["prompt_tokens"] == sum(n for n, _ in tokens)
    assert spent["cost_usd"] == pytest.approx(
        (spent["prompt_tokens"] * 1.0 + spent["completion_tokens"] * 2.0) / 1e6
    )
    assert traj.cost_usd == pytest.approx(traj.orchestrator_cost_usd)  # the user's is apart


@pytest.mark.parametrize("signal", ["###TRANSFER###", "###OUT-OF-SCOPE###"])
def test_every_tau2_stop_signal_ends_the_conversation(user_server, task, tau2_data, signal):
    server, script, _ = user_server
    script.lines, script.fail_first, script.calls = [f"Bye. {signal}"], 0, 0
    traj = play(make_env(tau2_data, server.url + "/v1"), task, gold_plan(task))
    assert traj.finish_reason == "conversation" and traj.turns == []
    assert traj.metadata["conversation_end"] == "user_stop" and traj.correct is False


def test_a_failing_user_endpoint_is_retried(user_server, task, tau2_data):
    server, script, _ = user_server
    script.lines, script.fail_first, script.calls = ["Hi.", "###STOP###"], 2, 0
    traj = play(make_env(tau2_data, server.url + "/v1", retries=2), task, gold_plan(task))
    assert script.calls == 4  # two failures, then the opening and the stop
    assert traj.metadata["conversation_end"] == "user_stop" and traj.correct


@pytest.mark.parametrize("verdict", [True, False])
def test_natural_language_assertions_are_judged_at_the_configured_endpoint(
    user_server, tau2_data, verdict
):
    from orchestra_jax.data.tau2_tasks import read_tau2_tasks

    server, script, _ = user_server
    script.lines, script.fail_first, script.calls = ["Hi.", "###STOP###"], 0, 0
    script.verdict = verdict
    tasks, _ = read_tau2_tasks(tau2_data / "tau2" / "domains" / "retail")
    [released] = [t for t in tasks if t.id == TASK]  # DB + NL_ASSERTION, as released
    env = make_env(tau2_data, server.url + "/v1", judge_url=server.url + "/v1")
    traj = play(env, released, gold_plan(released))
    grade = traj.metadata["grade"]
    assert grade["not_scored"] == [] and grade["breakdown"]["DB"] == 1.0
    assert grade["breakdown"]["NL_ASSERTION"] == float(verdict) and traj.correct is verdict


@pytest.mark.parametrize(
    ("variant", "temperature", "nl"),
    [
        ("qwen3_8b", 1.0, "judge"),  # the release's (rollout/tau2 config.py 33, run.py 164)
        ("qwen3_8b_project", 0.0, "skip"),
    ],
)
def test_a_training_episode_asks_the_user_simulator_as_the_variant_says(
    user_server, tau2_data, variant, temperature, nl
):
    from experiments.configs import grpo_hle
    from orchestra_jax.data.tau2_tasks import read_tau2_tasks
    from orchestra_jax.envs.tau2.env import from_config
    from orchestra_jax.training.builders import env_inputs

    server, script, engine = user_server
    script.lines, script.fail_first, script.calls, script.verdict = (
        ["Hi.", "###STOP###"],
        0,
        0,
        True,
    )
    config = grpo_hle.get_config(variant)
    t = config.env.tau2
    t.user_url = t.judge_url = server.url + "/v1"
    t.user_model, t.user_api_key_env, t.judge_api_key_env = "user", "", ""
    t.judge_model, t.data_dir = "user", str(tau2_data)
    env = from_config(env_inputs(config))
    tasks, _ = read_tau2_tasks(tau2_data / "tau2" / "domains" / "retail")
    [released] = [t for t in tasks if t.id == TASK]  # DB + NL_ASSERTION, as released
    before = len(engine.requests)
    traj = play(env, released, gold_plan(released))
    user_requests = [
        r for r in engine.requests[before:] if "expectedOutcomes" not in TOK.decode(r.input_ids)
    ]
    assert user_requests and {r.sampling.temperature for r in user_requests} == {temperature}
    graded = traj.metadata["grade"]
    assert ("NL_ASSERTION" in graded["breakdown"]) == (nl == "judge")


def test_a_dead_user_endpoint_ends_the_episode_with_the_error_and_nothing_lost(task, tau2_data):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    env = make_env(tau2_data, dead, retries=1)
    traj = play(env, task, gold_plan(task))
    assert traj.finish_reason == "error" and traj.turns == []
    assert "failed after 2 attempt(s)" in traj.metadata["error"] and dead in traj.metadata["error"]
    assert traj.prompt_length == len(traj.token_ids) > 0  # the prompt is kept
    # Not the policy's failure: marked, and not graded.
    assert traj.infra_failure.kind == "user_simulator" and traj.infra_failure.endpoint == dead
    assert traj.correct is False and "grade" not in traj.metadata


def test_a_bug_in_the_user_simulator_is_not_retried_and_not_infrastructure(
    user_server, task, tau2_data, monkeypatch
):
    from tau2.user.user_simulator import UserSimulator

    calls = {"n": 0}

    def broken(self, message, state):
        calls["n"] += 1
        raise TypeError("'NoneType' object is not iterable")

    monkeypatch.setattr(UserSimulator, "generate_next_message", broken)
    server, _, _ = user_server
    env = make_env(tau2_data, server.url + "/v1", retries=3)
    with pytest.raises(TypeError, match="not iterable"):
        play(env, task, gold_plan(task))
    assert calls["n"] == 1


def test_a_tiny_model_on_the_project_server_plays_the_user(task, tau2_data):
    from flax import nnx

    from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
    from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig

    config = Qwen3Config.preset("tiny", vocab_size=TOK.vocab_size)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    # One prefill shape for both user prompts: one compile.
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=1,
            max_seq_len=1024,
            steps_per_call=8,
            min_prefill_len=1024,
            min_prefill_rows=1,
            prefix_cache=False,
        ),
    )
    two_turns = LoopLimits(max_turns=2, max_context_tokens=32768, enable_thinking=False)
    try:
        with serve_in_thread(engine, SERVED, tokenizer=TOK) as s:
            env = make_env(tau2_data, s.url + "/v1", max_tokens=6)
            traj = play(env, task, ["Could you say more?"], limits=two_turns)
    finally:
        engine.close()
    spent = traj.metadata["other_party"]
    assert spent["calls"] >= 1 and 0 < spent["completion_tokens"] <= 6 * spent["calls"]
    assert traj.finish_reason in ("max_turns", "conversation")
    assert traj.correct is False  # a random user, no gold actions
