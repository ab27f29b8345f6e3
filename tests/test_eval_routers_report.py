"""Baseline routers play their plans through the real agent loop; reports and plots."""

import json

import numpy as np
import pytest

from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.eval import report, routers, summary
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.training.evaluation import eval_tool_configs, heldout_rewards
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes
from tests.trajectory_helpers import graded_episode


@pytest.fixture(scope="module")
def env():
    return SyntheticOrchestrationEnv(seed=0, num_entities=60)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("demo")


def test_plans_pick_by_price(env):
    config = env.default_tool_config()
    strongest = routers.make_plan("always_strongest", config, seed=0)
    cheapest = routers.make_plan("always_cheapest", config, seed=0)
    assert [t for t, _ in strongest] == ["search", "enhance_reasoning", "answer"]
    for (tool, a), (_, b) in zip(strongest, cheapest):
        prices = {x.alias: x.price_out for x in config.aliases_for(tool)}
        assert prices[a] == max(prices.values()) and prices[b] == min(prices.values())
    for seed in range(20):
        plan = routers.make_plan("random", config, seed)
        assert plan[-1][0] == "answer" and 1 <= len(plan) <= 3
    with pytest.raises(ValueError, match="unknown router"):
        routers.make_plan("oracle", config, 0)


def test_random_models_draws_each_model_independently(env):
    config = env.default_tool_config()
    plans = [routers.make_plan("random_models", config, seed) for seed in range(60)]
    assert all([t for t, _ in p] == list(routers.PLAN_TOOLS) for p in plans)
    for i, tool in enumerate(routers.PLAN_TOOLS):
        offered = {a.alias for a in config.aliases_for(tool)}
        assert {p[i][1] for p in plans} == offered  # every model on offer, none other
    # Not one choice for the whole plan: the steps' models vary independently.
    assert len({tuple(a for _, a in p) for p in plans}) > len(config.aliases_for("answer"))
    assert plans == [routers.make_plan("random_models", config, s) for s in range(60)]


def test_random_answer_varies_only_the_answer_model(env):
    config = env.default_tool_config()
    cheapest = routers.make_plan("always_cheapest", config, seed=0)
    plans = [routers.make_plan("random_answer", config, seed) for seed in range(40)]
    assert all(p[:-1] == cheapest[:-1] and p[-1][0] == "answer" for p in plans)
    assert {p[-1][1] for p in plans} == {a.alias for a in config.aliases_for("answer")}
    assert plans == [routers.make_plan("random_answer", config, s) for s in range(40)]


def test_a_mixture_plays_one_of_its_routers_per_episode(env):
    config = env.default_tool_config()
    cheapest = routers.make_plan("always_cheapest", config, seed=0)
    direct = routers.make_plan("direct_strongest", config, seed=0)
    plans = [
        routers.make_plan("always_cheapest+direct_strongest", config, seed) for seed in range(40)
    ]
    assert all(p in (cheapest, direct) for p in plans)
    assert 10 <= sum(p == cheapest for p in plans) <= 30  # Drawn about evenly.
    assert plans == [
        routers.make_plan("always_cheapest+direct_strongest", config, seed) for seed in range(40)
    ]  # Seeded.
    assert routers.is_router("random+always_cheapest") and not routers.is_router("random+oracle")
    with pytest.raises(ValueError, match="unknown router 'oracle'"):
        routers.make_plan("random+oracle", config, 0)


def test_tool_call_text_parses_back():
    from orchestra_jax.chat.tool_calls import ToolCall, parse_tool_calls

    calls = parse_tool_calls(routers.tool_call_text("answer", {"model": "answer-2"}))
    assert calls == [ToolCall("answer", {"model": "answer-2"}, calls[0].raw)]


@pytest.mark.parametrize("router", sorted(set(routers.ROUTERS) - set(routers.CONVERSATION_ROUTERS)))
def test_router_episodes_follow_plan(env, tokenizer, router):
    import asyncio

    tasks = env.tasks("heldout", 6)
    configs = eval_tool_configs(env, tasks, seed=0)
    engine = routers.RouterEngine(router, tokenizer, configs, seed=3)
    how = Episodes(
        env=env,
        engine=engine,
        tokenizer=tokenizer,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=64),
        limits=LoopLimits(
            max_turns=5, max_context_tokens=4096, max_new_tokens_per_turn=64, enable_thinking=False
        ),
    )
    trajs = asyncio.run(run_graded_episodes(tasks, [configs[t.id] for t in tasks], how, seed=0))
    for task, traj in zip(tasks, trajs):
        plan = engine.plan_for(task.id, 0)
        called = [(c.name, c.arguments["model"]) for turn in traj.turns for c in turn.tool_calls]
        assert called == plan
        assert traj.finish_reason == "answer" and traj.format_valid
        assert traj.correct is not None and traj.cost_usd > 0


def _traj(task_id, counts, correct, cost, latency, preference, domain="d"):
    return graded_episode(
        task_id,
        rollout_logprobs=[0.0, -1.0],
        finish_reason="answer",
        tool_call_counts=counts,
        cost_usd=cost,
        latency_s=latency,
        correct=correct,
        preference=preference,
        metadata={"domain": domain},
    )


def test_summary_hand_computed():
    trajs = [
        _traj(
            "a",
            {"tool:answer-1": 1, "tool:search-1": 1},
            True,
            0.02,
            30.0,
            {"accuracy": 1.0, "tool:search-1": 1.0},
        ),
        _traj(
            "b", {"tool:answer-2": 1}, False, 0.001, 10.0, {"accuracy": 1.0, "tool:answer-2": -0.5}
        ),
        _traj(
            "c",
            {"tool:answer-1": 1},
            True,
            0.01,
            20.0,
            {"accuracy": 1.0, "cost": 1.0},
            domain="logic",
        ),
    ]
    s = summary.summarize(trajs)
    assert s["accuracy"] == pytest.approx(2 / 3)
    assert s["mean_cost_usd"] == pytest.approx(0.031 / 3)
    assert s["mean_latency_s"] == pytest.approx(20.0)
    assert s["tool_call_mix"] == pytest.approx(
        {"tool:answer-1": 0.5, "tool:answer-2": 0.25, "tool:search-1": 0.25}
    )
    # Episode a: 1 * 1 / 2 calls / max|P| 1 = 0.5; b: -0.5 * 1 / 1 / 0.5 = -1; c unscored.
    assert s["preference_score"] == pytest.approx((0.5 - 1.0) / 2)
    assert s["num_preference_scored"] == 2
    # Per domain: d holds a (right, $0.02, two calls) and b (wrong, $0.001); logic holds c.
    assert s["by_domain"]["d"]["num_episodes"] == 2
    assert s["by_domain"]["d"]["accuracy"] == pytest.approx(0.5)
    assert s["by_domain"]["d"]["mean_cost_usd"] == pytest.approx(0.021 / 2)
    assert s["by_domain"]["d"]["backend_mix"] == pytest.approx(
        {"answer-1": 1 / 3, "answer-2": 1 / 3, "search-1": 1 / 3}
    )
    assert s["by_domain"]["logic"] == {
        "num_episodes": 1,
        "accuracy": 1.0,
        "mean_cost_usd": pytest.approx(0.01),
        "mean_latency_s": pytest.approx(20.0),
        "backend_mix": {"answer-1": 1.0},
    }
    r = heldout_rewards(trajs, cost_scale=0.02, latency_scale=100.0)
    np.testing.assert_allclose(r, [1.0, 0.0, 1.0 - 0.01 / 0.02], rtol=1e-6)


def test_report_marks_dominated_policies(tmp_path):
    rows = [("grpo", 0.8, 0.01), ("always_strongest", 0.9, 0.05), ("random", 0.3, 0.02)]
    for name, acc, cost in rows:
        (tmp_path / f"eval_{name}.json").write_text(
            json.dumps(
                {
                    "policy": name,
                    "accuracy": acc,
                    "mean_cost_usd": cost,
                    "mean_latency_s": 1.0,
                    "baseline": name != "grpo",
                }
            )
        )
    md, png = report.write_report(str(tmp_path))
    text = open(md).read()
    assert "| random | 0.300" in text and text.split("| random |")[1].split("\n")[0].endswith(
        "| grpo |"
    )
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "Per domain" not in text  # No policy reports domains.
    assert (
        report.dominated_by(
            {"policy": "grpo", "accuracy": 0.8, "mean_cost_usd": 0.01},
            [{"policy": "x", "accuracy": 0.8, "mean_cost_usd": 0.01}],
        )
        == []
    )


def test_report_breaks_results_down_by_domain():
    def row(name, logic_acc, logic_mix):
        return {
            "policy": name,
            "accuracy": 0.5,
            "mean_cost_usd": 0.01,
            "mean_latency_s": 1.0,
            "by_domain": {
                "logic": {
                    "num_episodes": 2,
                    "accuracy": logic_acc,
                    "mean_cost_usd": 0.02,
                    "backend_mix": logic_mix,
                },
                "arithmetic": {
                    "num_episodes": 2,
                    "accuracy": 1.0,
                    "mean_cost_usd": 0.001,
                    "backend_mix": {"answer/sim-small": 1.0},
                },
            },
        }

    text = report.markdown_table(
        [
            row(
                "grpo",
                0.5,
                {"answer/sim-frontier": 0.45, "answer/sim-small": 0.15, "search/sim-small": 0.4},
            ),
            row("always_cheapest", 0.0, {"answer/sim-small": 1.0}),
        ]
    )
    table = text.split("Per domain")[1]
    assert "| policy | arithmetic | logic |" in table
    # Logic: 3 of 4 of grpo's answer calls went to the frontier model, 1 to sim-small.
    assert (
        "| grpo | 1.00, 0.0010; answer/sim-small 1.00 | 0.50, 0.0200; "
        "answer/sim-frontier 0.75, search/sim-small 1.00 |"
    ) in table
    assert (
        "| always_cheapest | 1.00, 0.0010; answer/sim-small 1.00 | 0.00, 0.0200; "
        "answer/sim-small 1.00 |"
    ) in table


def test_report_leaves_out_a_tool_never_called_in_a_domain(tmp_path):
    """A tool listed with share 0 in a domain (counted, never called) used to divide by 0."""
    by_domain = {
        "logic": {
            "num_episodes": 2,
            "accuracy": 0.5,
            "mean_cost_usd": 0.02,
            "backend_mix": {"answer/sim-small": 1.0, "search/sim-small": 0.0},
        },
        "arithmetic": {
            "num_episodes": 2,
            "accuracy": 1.0,
            "mean_cost_usd": 0.001,
            "backend_mix": {"enhance_reasoning/sim-coder": 0.0},
        },
    }
    summary = {
        "policy": "grpo",
        "accuracy": 0.75,
        "mean_cost_usd": 0.01,
        "mean_latency_s": 1.0,
        "by_domain": by_domain,
    }
    with open(tmp_path / "eval_grpo.json", "w") as f:
        json.dump(summary, f)
    md, png = report.write_report(str(tmp_path))
    with open(md) as f:
        text = f.read()
    assert "| grpo | 1.00, 0.0010; no calls | 0.50, 0.0200; answer/sim-small 1.00 |" in text
    assert (tmp_path / "eval_pareto.png").exists() and png.endswith("eval_pareto.png")


def test_report_counts_infrastructure_failures_and_pass_k_over_the_trials_kept(tmp_path):
    summary = {
        "policy": "grpo",
        "accuracy": 0.5,
        "mean_cost_usd": 0.01,
        "mean_latency_s": 1.0,
        "num_episodes": 199,
        "trials": 4,
        "infra_failed": 1,
        "infra_failed_by_kind": {"user_simulator": 1},
        "infra_failed_by_endpoint": {"http://user.test/v1": 1},
        "pass_k": {"all": {"pass^1": 0.5, "pass^2": 0.2, "pass^3": 0.1, "pass^4": 0.05}},
        "pass_k_tasks": {"all": {"pass^1": 50, "pass^2": 50, "pass^3": 50, "pass^4": 49}},
    }
    clean = {**summary, "policy": "base", "num_episodes": 200, "infra_failed": 0}
    clean.update(infra_failed_by_kind={}, infra_failed_by_endpoint={})
    clean["pass_k_tasks"] = {"all": dict.fromkeys(summary["pass_k"]["all"], 50)}
    for s in (summary, clean):
        (tmp_path / f"eval_{s['policy']}.json").write_text(json.dumps(s))
    md, _ = report.write_report(str(tmp_path))
    text = open(md).read()
    assert "Episodes failed by infrastructure" in text
    assert (
        "- grpo: 1 of 200 episodes (by kind: user_simulator 1; "
        "by endpoint: http://user.test/v1 1)" in text
    )
    assert "- base: 0 of 200 episodes\n" in text
    assert "| grpo | all | 0.500, 0.200, 0.100, 0.050 (49 of 50 tasks) |" in text
    assert "a task with n trials counts towards pass^k for k <= n" in text
