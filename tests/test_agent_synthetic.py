"""The loop with the real offline environment: ToolConfig, make_tools, simulated experts."""

import json

import pytest

from orchestra_jax.agent.loop import make_group_specs, run_episodes_sync
from orchestra_jax.agent.tool_runner import call_feature
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine

TOK = load_tokenizer("demo")


def call(name, **arguments):
    return (
        f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"
    )


@pytest.fixture(scope="module")
def env():
    return SyntheticOrchestrationEnv(0, num_entities=20)


def test_search_then_answer_episode(env):
    task = next(t for t in env.tasks("train", 20) if t.domain == "entity_fact")
    config = env.default_tool_config()
    plan = [call("search", model="search-1"), call("answer", model="answer-1")]

    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        return TOK.encode(plan[min(turn, 1)])

    specs = make_group_specs([task], [config], 2, seed=3, backends=env.build_backends(config))
    trajs = run_episodes_sync(specs, ScriptedEngine(policy), TOK, sampling=SamplingParams())
    for traj in trajs:
        assert traj.finish_reason == "answer" and traj.final_answer and traj.format_valid
        assert traj.tool_call_counts["tool:search-1"] == 1
        assert traj.tool_call_counts["tool:answer-1"] == 1
        assert set(traj.tool_call_counts) == {
            f for f in config.feature_names() if f.startswith("tool:")
        }
        assert traj.tool_cost_usd > 0 and traj.orchestrator_cost_usd > 0
        assert traj.latency_s >= sum(t.tool_latency_s for t in traj.turns) > 0
        assert traj.preference == config.preference
        # The system prompt states the preference; the schemas carry the price tables.
        prompt = TOK.decode(traj.token_ids[: traj.prompt_length])
        assert config.system_prompt() in prompt and "search-1" in prompt
    assert trajs[0].seed != trajs[1].seed


def test_wrong_alias_is_an_observation_not_a_crash(env):
    task = env.tasks("train", 1)[0]
    config = env.default_tool_config()
    engine = ScriptedEngine(
        [
            TOK.encode(call("search", model="search-99")),
            TOK.encode(call("answer", model="answer-2")),
        ]
    )
    specs = make_group_specs([task], [config], 1, seed=0, backends=env.build_backends(config))
    (traj,) = run_episodes_sync(specs, engine, TOK, sampling=SamplingParams())
    assert traj.finish_reason == "answer"
    assert "Error" in traj.turns[0].tool_results[0].text or not traj.turns[0].format_valid
    assert "tool:search-99" not in traj.tool_call_counts


def test_call_feature():
    features = {"tool:search-1", "tool:python"}
    assert call_feature("search", {"model": "search-1"}, features) == "tool:search-1"
    assert call_feature("python", {"code": "1"}, features) == "tool:python"
    assert call_feature("search", {"model": "search-9"}, features) == "tool:search"


def test_constrained_enum_arguments_reach_every_request(env):
    """`LoopLimits.constrain_enum_arguments`: each turn's request carries the automaton
    of the task's tool schemas, which keeps a tool's call to its own model aliases."""
    from orchestra_jax.agent.loop import LoopLimits

    task = env.tasks("train", 1)[0]
    config = env.default_tool_config()
    engine = ScriptedEngine([TOK.encode(call("search", model="search-1"))] * 8)
    specs = make_group_specs([task], [config], 2, seed=3, backends=env.build_backends(config))
    limits = LoopLimits(max_turns=2, constrain_enum_arguments=True)
    run_episodes_sync(specs, engine, TOK, sampling=SamplingParams(), limits=limits)
    constraints = {id(r.constraint) for r in engine.requests}
    assert (
        len(engine.requests) >= 2
        and len(constraints) == 1
        and None not in {r.constraint for r in engine.requests}
    )
    constraint = engine.requests[0].constraint
    assert constraint.allows(TOK.encode(call("search", model="search-2")))
    assert not constraint.allows(TOK.encode(call("search", model="answer-2")))
    assert not constraint.allows(TOK.encode(call("answer", model="search-1")))
    engine = ScriptedEngine([TOK.encode(call("search", model="search-1"))] * 8)
    run_episodes_sync(specs, engine, TOK, sampling=SamplingParams(), limits=LoopLimits(max_turns=2))
    assert all(r.constraint is None for r in engine.requests)
