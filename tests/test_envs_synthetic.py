"""The synthetic environment: determinism, splits, and a different best tool per domain."""

import asyncio
import contextlib
import io

import numpy as np
import pytest

from orchestra_jax.data.synthetic_tasks import DOMAINS
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.rewards.outcome import is_correct
from orchestra_jax.tasks import Task, TaskSource
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.registry import make_tools
from orchestra_jax.tools.sandbox import registry as python_sandbox
from orchestra_jax.tools.sandbox.registry import SandboxResult


@pytest.fixture(scope="module")
def env():
    return SyntheticOrchestrationEnv(seed=0, num_entities=120)


def in_process_run_code(code, *, timeout_s):
    """Test-only: runs the simulated experts' own one-line programs in process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # noqa: S102 (code written by SimulatedExpert)
    return SandboxResult(out.getvalue(), "", 0, False, False, duration_s=0.05)


def test_same_seed_same_tasks_and_prefix_property(env):
    again = SyntheticOrchestrationEnv(seed=0, num_entities=120)
    assert env.tasks("train", 20) == again.tasks("train", 20)
    assert env.tasks("train", 10) == env.tasks("train", 20)[:10]
    other = SyntheticOrchestrationEnv(seed=1, num_entities=120)
    assert [t.question for t in other.tasks("train", 10)] != [
        t.question for t in env.tasks("train", 10)
    ]
    assert isinstance(env, TaskSource)
    with pytest.raises(ValueError, match="split"):
        env.tasks("test", 1)


def test_domains_answers_and_splits(env):
    train, heldout = env.tasks("train", 90), env.tasks("heldout", 60)
    assert {t.domain for t in train} == set(DOMAINS)
    assert len({t.id for t in train + heldout}) == 150
    for t in train:
        if t.domain == "arithmetic":
            assert t.answer_type == "numeric"
            assert str(eval(t.metadata["expression"])) == t.answer  # noqa: S307
            assert all(str(eval(w)) != t.answer for w in t.metadata["wrong_expressions"])  # noqa: S307
            # A simulated expert's wrong answers are graded wrong, however close they are.
            assert is_correct(f"Final answer: {t.answer}", t)
            assert not any(is_correct(f"Final answer: {d}", t) for d in t.metadata["distractors"])
        if t.domain == "logic":
            assert t.answer in t.question and t.answer not in t.metadata["distractors"]

    def ents(ts):
        return {t.metadata["entity_id"] for t in ts if t.domain == "entity_fact"}

    assert ents(train) and ents(heldout) and not ents(train) & ents(heldout)
    assert Task.from_dict(train[0].to_dict()) == train[0]


def run_plan(env, task, plan, config, seed):
    """Runs `plan` ([(tool, backend)]) and returns (correct, cost, latency)."""
    tools = make_tools(config, env.build_backends(config, run_code=in_process_run_code))
    by_backend = {(a.tool, a.backend): a.alias for a in config.aliases}
    ctx = ToolContext(task=task, seed=seed)
    cost = latency = 0.0
    for tool, backend in plan:
        r = asyncio.run(tools[tool]({"model": by_backend[(tool, backend)]}, ctx))
        assert r.error is None, r.error
        cost, latency = cost + r.cost_usd, latency + r.latency_s
    return r.final_answer == task.answer, cost, latency


ORACLE = {
    "arithmetic": [("enhance_reasoning", "sim-coder"), ("answer", "sim-small")],
    "entity_fact": [("search", "sim-small"), ("answer", "sim-small")],
    "logic": [("answer", "sim-frontier")],
}


def test_the_best_plan_differs_by_domain(env):
    """Per domain: the oracle plan beats always-strongest and always-cheapest on
    accuracy, and is cheaper than always-strongest outside logic."""
    config = env.default_tool_config()
    tasks = env.tasks("train", 120)
    stats = {}
    for name, plan_of in {
        "oracle": ORACLE.get,
        "strongest": lambda d: [("answer", "sim-frontier")],
        "cheapest": lambda d: [("answer", "sim-small")],
    }.items():
        for t in tasks:
            ok, cost, _ = run_plan(env, t, plan_of(t.domain), config, seed=3)
            stats.setdefault((name, t.domain), []).append((ok, cost))
    acc = {k: np.mean([o for o, _ in v]) for k, v in stats.items()}
    cost = {k: np.mean([c for _, c in v]) for k, v in stats.items()}
    for d in DOMAINS:
        assert acc[("oracle", d)] >= 0.7, (d, acc)
        assert acc[("cheapest", d)] <= 0.4, (d, acc)
    assert acc[("strongest", "entity_fact")] <= 0.3
    assert acc[("strongest", "arithmetic")] < acc[("oracle", "arithmetic")]
    assert cost[("oracle", "arithmetic")] < cost[("strongest", "arithmetic")] / 10
    assert acc[("oracle", "logic")] > 2 * acc[("cheapest", "logic")]


def test_sampled_configs_drive_simulated_latency(env):
    backends = env.build_backends()  # one Backends for every sampled config
    sampler = env.tool_config_sampler(seed=0)
    for i in range(3):
        config = sampler.sample(env.task("train", i))
        tools = make_tools(config, backends)
        for a in config.aliases:
            role = {"search": "query", "enhance_reasoning": "code", "answer": "answer"}[a.tool]
            expert = tools[a.tool].backends.experts[a.backend]
            assert expert.latency_by_role[role] == a.latency_s
    assert set(env.eval_tool_configs()) == {"heldout_cheap", "heldout_expensive", "heldout_spread"}


@pytest.mark.skipif(not python_sandbox.bwrap_available(), reason="needs bwrap")
def test_arithmetic_end_to_end_in_the_real_sandbox(env):
    task = next(t for t in env.tasks("train", 30) if t.domain == "arithmetic")
    config = env.default_tool_config()
    tools = make_tools(config, env.build_backends(config))
    coder = next(a.alias for a in config.aliases if a.backend == "sim-coder")
    ctx = ToolContext(task=task, seed=0)
    r = asyncio.run(tools["enhance_reasoning"]({"model": coder}, ctx))
    assert r.error is None and r.metadata["exit_code"] == 0
    assert ctx.notes[-1].startswith("result = ")
    assert r.cost_usd > 0 and r.latency_s > 0
