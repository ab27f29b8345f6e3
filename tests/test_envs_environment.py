"""The Environment protocol as runs use it: per-episode state, grading, the other party."""

import asyncio
import dataclasses
import json

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.agent.conversation import PartyReply
from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.config_section import ConfigError
from orchestra_jax.envs.config import EnvConfig
from orchestra_jax.envs.environment import ENVIRONMENTS, Environment
from orchestra_jax.envs.inputs import make_env
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.rewards.judge import JudgeVerdict
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.tools.base import ToolResult, function_schema
from orchestra_jax.tools.function_tools import PLAIN_TOOLS, PlainTool
from orchestra_jax.training import builders
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes

TOK = load_tokenizer("demo")


def tick_schema():
    return function_schema("tick", "Count one more.", {}, [])


class Counter:
    """A tool that counts its calls in the episode's state (a database stand-in)."""

    name = "tick"

    def schema(self):
        return tick_schema()

    async def __call__(self, arguments, ctx):
        ctx.state["ticks"] += 1
        return ToolResult(text=f"ticks: {ctx.state['ticks']}")


if "tick" not in PLAIN_TOOLS:
    PLAIN_TOOLS.register("tick", PlainTool(tick_schema, lambda tool_config, backends: Counter()))


class StatefulWorld(SyntheticOrchestrationEnv):
    """The synthetic world plus a counter every episode gets a fresh copy of."""

    def __init__(self):
        super().__init__(0, num_entities=10)
        self.resets = 0
        self.partner = None

    def reset(self, task):
        self.resets += 1
        return {"ticks": 0}

    def other_party(self, task):
        return self.partner


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _play(env, group_size=3):
    task = env.tasks("train", 1)[0]
    config = env.default_tool_config(tools=("search", "enhance_reasoning", "answer", "tick"))
    plan = [call("tick"), call("tick"), call("answer", model="answer-1")]

    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        return TOK.encode(plan[min(turn, 2)]) + [TOK.im_end_id]

    how = Episodes(
        env=env,
        engine=ScriptedEngine(policy),
        tokenizer=TOK,
        sampling=SamplingParams(),
        limits=LoopLimits(max_turns=4, enable_thinking=False),
        group_size=group_size,
    )
    return asyncio.run(run_graded_episodes([task], [config], how, seed=0)), task


def test_every_episode_gets_its_own_state_and_is_graded_by_the_env():
    env = StatefulWorld()
    trajectories, task = _play(env)
    assert env.resets == 3  # one state per episode of the group
    for traj in trajectories:
        assert [t.tool_results[0].text for t in traj.turns[:2]] == ["ticks: 1", "ticks: 2"]
        assert traj.finish_reason == "answer" and traj.correct is not None
        assert traj.correct == (traj.final_answer == task.answer) or task.answer_type != "exact"


class Listener:
    """A conversation partner: opens with a question, ends the talk at the first message."""

    def __init__(self, log):
        self.log = log

    async def open(self, state):
        return PartyReply(messages=[{"role": "user", "content": "Count for me."}])

    async def respond(self, state, turn):
        self.log.append((id(self), state["ticks"], turn.is_message))
        return PartyReply(end="user_stop" if turn.is_message else None)


class TalkingWorld(StatefulWorld):
    """The stateful world with a listener per episode, graded from the episode's state."""

    def __init__(self):
        super().__init__()
        self.log, self.graded = [], []

    def other_party(self, task):
        return Listener(self.log)

    async def grade(self, task, final_answer, *, judge=None, state=None):
        self.graded.append(state["ticks"])
        return JudgeVerdict(correct=state["ticks"] == 2, info={"ticks": state["ticks"]})


def test_an_environment_with_another_party_plays_conversations_graded_from_their_state():
    env = TalkingWorld()
    task = env.tasks("train", 1)[0]
    config = env.default_tool_config(tools=("search", "enhance_reasoning", "answer", "tick"))
    plan = [call("tick"), call("tick"), "I counted twice."]

    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        return TOK.encode(plan[min(turn, 2)]) + [TOK.im_end_id]

    how = Episodes(
        env=env,
        engine=ScriptedEngine(policy),
        tokenizer=TOK,
        sampling=SamplingParams(),
        limits=LoopLimits(max_turns=4, enable_thinking=False),
        group_size=2,
    )
    trajectories = asyncio.run(run_graded_episodes([task], [config], how, seed=0))
    assert env.resets == 2 and env.graded == [2, 2]
    assert len({listener for listener, _, _ in env.log}) == 2  # one partner per episode
    assert sorted((ticks, message) for _, ticks, message in env.log) == [
        (1, False),
        (1, False),
        (2, False),
        (2, False),
        (2, True),
        (2, True),
    ]
    for traj in trajectories:
        assert traj.finish_reason == "conversation" and traj.correct
        assert traj.metadata["grade"] == {"ticks": 2}


def test_env_name_picks_the_environment():
    config = grpo_hle.get_config("micro")
    assert ENVIRONMENTS.names() == ["qa", "routed", "synthetic", "tau2"]
    inputs = builders.env_inputs(config)
    env = make_env(inputs)
    assert isinstance(env, Environment) and isinstance(env, SyntheticOrchestrationEnv)
    assert env.seed == config.data.synthetic_seed
    assert env.reset(env.tasks("train", 1)[0]) is None
    assert env.other_party(env.tasks("train", 1)[0]) is None
    verdict = asyncio.run(env.grade(env.tasks("train", 1)[0], None))
    assert verdict.correct is False
    # An unknown name: the env section's check says so, and so does the registry.
    config.env.name = "tau3"
    with pytest.raises(ConfigError, match="env.name must be one of .* got 'tau3'"):
        builders.env_inputs(config)
    with pytest.raises(ValueError, match="unknown environment 'tau3'"):
        make_env(dataclasses.replace(inputs, env=EnvConfig.unchecked({"name": "tau3"})))
