"""τ² as the reference plays it: an acting expert, a withheld tool, untrained message
turns, rebuilt prompts.

The expert is the project's own OpenAI-compatible server on 127.0.0.1 hosting a
scripted engine (`env.tau2.expert_mode="act"`): its tool call runs in tau2's
environment of the `mock` domain and tau2's evaluator grades the record; its
message is said to the user. Needs the `tau2` extra and ../shared/tau2-bench
(skipped, saying which, without them).
"""

import asyncio
import json
import os
import subprocess
import sys

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.config_section import ConfigError
from orchestra_jax.rl.samples import turn_samples
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import ServerConfig, serve_in_thread
from orchestra_jax.training.experiment_config import validate
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes, training_masks
from tests.live_helpers import ROOT

TOK = load_tokenizer("demo")
TASK = "tau2/mock/create_task_1"  # one write: create_task(user_1, "Important Meeting")
LIMITS = LoopLimits(max_turns=6, max_context_tokens=32768, enable_thinking=False)
SERVED = ServerConfig(model_path="expert", tokenizer_path="demo", context_len=8192)
CREATE = {"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}
DONE = "Your task Important Meeting is created."


def call(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ExpertScript:
    """The served expert: the gold call first, then the message (by the assistant
    turns it has seen: tau2's greeting, then its own call)."""

    def __init__(self):
        self.prompts = []

    def __call__(self, ids, request):
        prompt = TOK.decode(ids)
        self.prompts.append(prompt)
        seen = prompt.count("<|im_start|>assistant\n") - 1  # the last one is its own
        text = call(CREATE["name"], CREATE["arguments"]) if seen <= 1 else DONE
        return TOK.encode(text) + [TOK.im_end_id]


@pytest.fixture(scope="module")
def expert_server(tau2_data):
    script = ExpertScript()
    with serve_in_thread(ScriptedEngine(script), SERVED, tokenizer=TOK) as s:
        yield s, script


@pytest.fixture(scope="module")
def task(tau2_data):
    from orchestra_jax.data.tau2_tasks import read_tau2_tasks

    tasks, _ = read_tau2_tasks(tau2_data / "tau2" / "domains" / "mock")
    [task] = [t for t in tasks if t.id == TASK]
    task.metadata["tau2_task"]["evaluation_criteria"]["reward_basis"] = ["DB", "ACTION"]
    return task


def make_env(
    tau2_data, url="", lines=("Please create a task 'Important Meeting' for user_1.",), **options
):
    from orchestra_jax.envs.tau2.env import Tau2Environment
    from orchestra_jax.envs.tau2.tools import EXPERT_PROFILES
    from orchestra_jax.envs.tau2.user import ScriptedUser
    from orchestra_jax.tools.experts.client import OpenAIChatExpert

    experts = {}
    if url:
        experts = {
            p.backend: OpenAIChatExpert(url, "expert", api_key_env=None, name=p.backend)
            for p in EXPERT_PROFILES
        }
        options = {"meta_tools": ("ask_expert",), **options}
    return Tau2Environment(
        lambda t, e: ScriptedUser(list(lines)),
        data_dir=tau2_data,
        experts=experts,
        **options,
    )


def play(env, task, plan, limits=LIMITS):
    """One episode whose turn k writes plan[k](config) (the last one repeats)."""
    config = env.tool_config_sampler(seed=0).sample(task)

    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        return TOK.encode(plan[min(turn, len(plan) - 1)](config)) + [TOK.im_end_id]

    how = Episodes(
        env=env,
        engine=ScriptedEngine(policy),
        tokenizer=TOK,
        sampling=SamplingParams(),
        limits=limits,
    )
    [traj] = asyncio.run(run_graded_episodes([task], [config], how, seed=0))
    return traj, config


def test_the_acting_experts_tool_call_runs_in_tau2_and_its_message_reaches_the_user(
    expert_server, task, tau2_data
):
    from orchestra_jax.envs.tau2.tools import EXPERT_PROFILES

    server, script = expert_server
    script.prompts.clear()
    env = make_env(
        tau2_data,
        server.url + "/v1",
        lines=("Please create a task 'Important Meeting' for user_1.", "Thanks."),
        expert_mode="act",
        drop_tools=("transfer_to_human_agents",),
    )
    strongest = lambda c: max(c.aliases_for("call_expert"), key=lambda a: a.price_out)  # noqa: E731
    hand_over = lambda c: call("call_expert", {"model": strongest(c).alias})  # noqa: E731
    traj, config = play(env, task, [hand_over])
    # The expert called create_task (run in tau2), then told the user (twice); the
    # user answered, then stopped.
    assert traj.metadata["conversation_end"] == "user_stop" and len(traj.turns) == 3
    grade = traj.metadata["grade"]
    assert grade["breakdown"] == {"DB": 1.0, "ACTION": 1.0} and traj.correct
    first, second, third = (t.tool_results[0] for t in traj.turns)
    assert first.error is None and first.metadata["action"] == [CREATE]
    assert "create_task(" in first.text and '"title": "Important Meeting"' in first.text
    assert second.metadata["message_to_party"] == third.metadata["message_to_party"] == DONE
    # The policy read the expert's action, then the user's answer to its message.
    assert traj.turns[1].observation == (
        f"\n<|im_start|>user\n<tool_response>\n{second.text}\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # Priced as any expert call: the served tokens at the alias's rates.
    alias = strongest(config)
    assert alias.backend == EXPERT_PROFILES[0].backend
    results = (first, second, third)
    tokens = [(r.metadata["prompt_tokens"], r.metadata["completion_tokens"]) for r in results]
    assert traj.tool_cost_usd == pytest.approx(
        sum(p * alias.price_in + c * alias.price_out for p, c in tokens) / 1e6
    )
    # The policy's tools lack transfer_to_human_agents; the expert was offered it.
    policy_prompt = TOK.decode(traj.token_ids[: traj.prompt_length])
    assert '"name": "transfer_to_human_agents"' not in policy_prompt
    assert '"name": "create_task"' in policy_prompt and '"name": "call_expert"' in policy_prompt
    assert '"name": "transfer_to_human_agents"' in script.prompts[0]
    assert '"name": "call_expert"' not in script.prompts[0]
    # The expert read tau2's agent prompt and the conversation, never the scenario.
    assert "<policy>" in script.prompts[0]
    assert "Please create a task 'Important Meeting' for user_1." in script.prompts[0]
    assert "Professional and direct communicator" not in script.prompts[0]
    # Every policy turn called a tool: none is a message turn.
    assert [t.message_to_party for t in traj.turns] == [False, False, False]


def test_advising_is_the_default_and_the_modes_are_checked(tau2_data, task):
    from orchestra_jax.envs.tau2.config import tau2_problems

    env = make_env(tau2_data)
    assert env.expert_mode == "advise" and "transfer_to_human_agents" in env.tools(
        env.tool_config_sampler(seed=0).sample(task), task=task
    )
    with pytest.raises(ValueError, match="expert_mode must be one of"):
        make_env(tau2_data, expert_mode="relay")
    config = grpo_hle.get_config("tau2_demo")
    config.env.tau2.data_dir = str(tau2_data)
    config.env.tau2.expert_mode = "relay"
    assert any("expert_mode must be one of" in p for p in tau2_problems(config.env.tau2))
    config.env.tau2.expert_mode = "act"
    assert any("needs experts" in p for p in tau2_problems(config.env.tau2))
    # At start-up, with everything else the run checks: relaying routers need advice.
    config.env.tau2.meta_tools = "ask_expert"
    config.env.tau2.expert_url = "http://127.0.0.1:9/v1"
    config.eval.baselines = "expert_strongest"
    with pytest.raises(ConfigError, match="need env.tau2.expert_mode='advise'"):
        validate(config)
    config.env.tau2.expert_mode = "advise"
    validate(config)


def test_message_turns_can_be_left_out_of_the_loss(task, tau2_data):
    env = make_env(tau2_data)
    traj, _ = play(env, task, [lambda c: call(**CREATE), lambda c: DONE])
    assert traj.correct and [t.message_to_party for t in traj.turns] == [False, True]
    # Kept: the recorded mask, every sampled token.
    assert training_masks([traj], drop_invalid=True, drop_messages=False) is None
    [mask] = training_masks([traj], drop_invalid=True, drop_messages=True)
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    n0, n1 = (t.num_generated_tokens for t in traj.turns)
    assert len(sampled) == n0 + n1
    assert [mask[i] for i in sampled] == [1] * n0 + [0] * n1  # the message's tokens: 0
    assert sum(mask) == n0
    trained = traj.__class__(**{**traj.__dict__, "loss_mask": mask})
    trained.advantage = 1.0
    [sample] = turn_samples([trained])  # the message turn gives no turn sample
    assert sample.turn == 0 and sum(sample.loss_mask) == n0


def test_rebuilt_prompts_of_a_conversation_drop_its_middle(task, tau2_data):
    from orchestra_jax.agent.context import RebuildBudgets, RebuildContext
    from orchestra_jax.envs.tau2.user import ScriptedUser

    env = make_env(tau2_data)
    later = "And then? " + "Tell me more. " * 70
    env.speaker = lambda t, e: ScriptedUser(["Create it please.", later])
    plan = [lambda c: call(**CREATE), lambda c: "It is created.", lambda c: DONE]

    def prompts(conversation_tokens):
        context = RebuildContext(RebuildBudgets(conversation_tokens=conversation_tokens))
        limits = LoopLimits(
            max_turns=4, max_context_tokens=32768, enable_thinking=False, context=context
        )
        traj, _ = play(env, task, plan, limits=limits)
        assert traj.correct and len(traj.turns) == 3
        for turn in traj.turns:  # each turn's prompt is masked, its tokens trained
            span = traj.loss_mask[turn.prompt_start : turn.prompt_start + turn.prompt_tokens]
            assert span == [0] * turn.prompt_tokens
        return [
            TOK.decode(traj.token_ids[t.prompt_start : t.prompt_start + t.prompt_tokens])
            for t in traj.turns
        ]

    whole = prompts(10**6)
    greeting, opening = "Hi! How can I help you today?", "Create it please."
    assert all(greeting in p and "<policy>" in p for p in whole)
    assert "It is created." in whole[2] and later in whole[2]
    # Turn 2's messages, as the demo tokenizer counts them rendered alone: system 301,
    # greeting 17, opening 13, the call 44, its result 51, "It is created." 11, the
    # user's answer ~300; the tools' JSON 576. Budget 1206 - 576 = 630: the first 315
    # tokens hold the system prompt only; the last 315 start inside the call's result.
    cut = prompts(1206)
    assert cut[:2] == whole[:2]  # turns 0 and 1 fit (at most 426 tokens)
    assert "<policy>" in cut[2] and "create_task" in cut[2]  # the head; the tools stay
    assert greeting not in cut[2] and opening not in cut[2]  # the middle: gone
    assert '<tool_call>\n{"name": "create_task"' not in cut[2]  # the call went too
    assert '"task_id": "task_2"' in cut[2]  # its result, held by the last 315 tokens
    assert cut[2].endswith(whole[2][whole[2].index("<tool_response>") :])


def test_a_short_tau2_demo_run_with_rebuilt_prompts(tau2_data, tmp_path):
    shared = tau2_data  # ../shared/tau2-bench/data
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.grpo_hle",
            "--config=experiments/configs/grpo_hle.py:tau2_demo",
            f"--config.workdir={tmp_path}",
            f"--config.env.tau2.data_dir={shared}",
            f"--config.data.paths.tau2={shared / 'tau2' / 'domains' / 'mock'}",
            "--config.agent.context=rebuild",
            "--config.rl.sample_unit=turn",
            "--config.agent.rebuild.conversation_tokens=1200",
            "--config.env.tau2.drop_tools=transfer_to_human_agents",
            "--config.env.tau2.train_message_turns=False",
            "--config.num_steps=1",
            "--config.rl.tasks_per_step=1",
            "--config.rl.group_size=2",
            "--config.eval.num_tasks=1",
            "--config.eval.num_trials=1",
            "--config.checkpoint.every_steps=0",
        ],
        cwd=ROOT,
        env={**os.environ, "XLA_FLAGS": ""},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with open(tmp_path / "metrics.jsonl") as f:
        steps = [json.loads(line) for line in f]
    assert any(s.get("step") == 1 for s in steps)
