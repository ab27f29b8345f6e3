"""The demo-learning summary: per-seed figures and the paired gain's standard error."""

import json
import math
import os

import pytest

from experiments.benchmarks import demo_learning
from orchestra_jax.agent.trajectory import write_jsonl
from tests.trajectory_helpers import graded_episode


def _episode(task_id, reward, **fields):
    """An evaluation episode of `task_id` with held-out `reward`."""
    return graded_episode(task_id, reward=reward, **fields)


def _write_run(workdir, summaries, episodes):
    """eval_<policy>.json per summary; trajectories/eval_<policy>.jsonl per episode list."""
    os.makedirs(os.path.join(workdir, "trajectories"), exist_ok=True)
    for policy, (reward, accuracy, cost) in summaries.items():
        with open(os.path.join(workdir, f"eval_{policy}.json"), "w") as f:
            json.dump(
                {
                    "policy": policy,
                    "heldout_reward": reward,
                    "accuracy": accuracy,
                    "mean_cost_usd": cost,
                    "mean_latency_s": 10.0,
                },
                f,
            )
    for policy, rewards in episodes.items():
        write_jsonl(
            os.path.join(workdir, "trajectories", f"eval_{policy}.jsonl"),
            [
                _episode(task_id, reward, finish_reason="answer", correct=reward > 0)
                for task_id, reward in rewards.items()
            ],
        )


def test_paired_gain_is_the_mean_task_difference_with_its_standard_error(tmp_path):
    workdir = str(tmp_path / "seed_0")
    # Task "d" was evaluated for one policy only: it is left out of the pairing.
    _write_run(
        workdir,
        {},
        {
            "grpo": {"a": 1.0, "b": 0.5, "c": 0.0, "d": 1.0},
            "warm_start": {"a": 0.5, "b": 0.5, "c": 0.5},
        },
    )
    gain = demo_learning.paired_gain(workdir)
    # Differences 0.5, 0, −0.5: mean 0, sample std 0.5, standard error 0.5 / √3.
    assert gain["num_tasks"] == 3
    assert gain["mean"] == pytest.approx(0.0)
    assert gain["stderr"] == pytest.approx(0.5 / math.sqrt(3))


def test_summary_pairs_each_seed_and_finds_dominating_baselines(tmp_path):
    sweep = tmp_path / "sweep"
    _write_run(
        str(sweep / "seed_0"),
        {
            "grpo": (0.6, 0.7, 0.02),
            "warm_start": (0.4, 0.6, 0.03),
            "always_cheapest": (0.5, 0.65, 0.01),
        },
        {"grpo": {"a": 0.8, "b": 0.4}, "warm_start": {"a": 0.4, "b": 0.4}},
    )
    # A seed whose episodes were not kept: summarised, but without a paired gain.
    _write_run(
        str(sweep / "seed_1"),
        {
            "grpo": (0.5, 0.6, 0.02),
            "warm_start": (0.5, 0.6, 0.02),
            "always_cheapest": (0.5, 0.65, 0.01),
        },
        {},
    )
    result = demo_learning.summarise(str(sweep))
    assert result["runs"] == ["seed_0", "seed_1"]
    assert result["grpo_gain_over_warm_start"] == pytest.approx([0.2, 0.0])
    summary = result["grpo_gain_summary"]
    assert summary["mean"] == pytest.approx(0.1) and summary["std"] == pytest.approx(0.2 / 2**0.5)
    assert (summary["positive_runs"], summary["runs"]) == (1, 2)
    assert result["grpo_gain_paired"]["seed_0"]["mean"] == pytest.approx(0.2)
    assert result["grpo_gain_paired"]["seed_1"] is None
    assert result["policies"]["grpo"]["heldout_reward"]["mean"] == pytest.approx(0.55)
    assert result["grpo_dominated_by"] == {"seed_0": [], "seed_1": ["always_cheapest"]}


def _write_world_run(workdir, world, grpo, warm, cheapest=(0.5, 0.6, 0.01)):
    _write_run(str(workdir), {"grpo": grpo, "warm_start": warm, "always_cheapest": cheapest}, {})
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump({"data": {"synthetic_seed": world}, "eval": {"seed": world}}, f)


def test_runs_are_grouped_by_world_and_the_targets_checked_on_each(tmp_path):
    sweep = tmp_path / "sweep"
    # World 1: both runs gain ≥ 0.02 and dominate the cheapest router.
    _write_world_run(sweep / "a", 1, grpo=(0.60, 0.8, 0.02), warm=(0.55, 0.7, 0.02))
    _write_world_run(sweep / "b", 1, grpo=(0.59, 0.8, 0.02), warm=(0.56, 0.7, 0.02))
    # World 2: one run gains 0.01; the cheapest router dominates the other.
    _write_world_run(sweep / "c", 2, grpo=(0.60, 0.8, 0.02), warm=(0.59, 0.7, 0.02))
    _write_world_run(sweep / "d", 2, grpo=(0.60, 0.55, 0.02), warm=(0.50, 0.5, 0.02))
    result = demo_learning.summarise_worlds(str(sweep))
    assert list(result["worlds"]) == ["1/1", "2/2"]
    assert result["worlds"]["1/1"]["runs"] == ["a", "b"]
    t = result["targets"]["worlds"]
    assert t["1/1"] == {
        "least_gain": pytest.approx(0.03),
        "every_run_gains": True,
        "dominated_by": [],
    }
    assert t["2/2"]["least_gain"] == pytest.approx(0.01)
    assert not t["2/2"]["every_run_gains"] and t["2/2"]["dominated_by"] == ["always_cheapest"]
    assert result["targets"]["met"] is False


def test_plans_by_domain_count_each_plan_with_its_mean_reward(tmp_path):
    from orchestra_jax.agent.trajectory import Turn

    def episode(task_id, domain, features, reward):
        turns = [Turn(text="", num_generated_tokens=1, finish_reason="stop") for _ in features]
        for turn, feature in zip(turns, features, strict=True):
            turn.first_call_feature = feature
        return _episode(task_id, reward, turns=turns, metadata={"domain": domain})

    os.makedirs(tmp_path / "trajectories")
    write_jsonl(
        str(tmp_path / "trajectories" / "eval_grpo.jsonl"),
        [
            episode("a", "logic", ["tool:answer-1"], 1.0),
            episode("b", "logic", ["tool:answer-1"], 0.5),
            episode("c", "logic", ["tool:search-3", None, "tool:answer-3"], 0.0),
            episode("d", "arithmetic", ["tool:reasoner-3", "tool:answer-3"], 0.75),
        ],
    )
    assert demo_learning.plans_by_domain(str(tmp_path), "grpo") == {
        "arithmetic": {"reasoner-3,answer-3": [1, 0.75]},
        "logic": {"answer-1": [2, 0.75], "search-3,-,answer-3": [1, 0.0]},
    }
    assert demo_learning.plans_by_domain(str(tmp_path), "warm_start") is None


def test_a_sweep_under_gs_is_summarised_by_world_as_a_local_one(tmp_path, gcs_bucket):
    from orchestra_jax.io import paths

    local = tmp_path / "sweep"
    _write_world_run(local / "a", 1, grpo=(0.60, 0.8, 0.02), warm=(0.55, 0.7, 0.02))
    _write_world_run(local / "b", 2, grpo=(0.60, 0.8, 0.02), warm=(0.59, 0.7, 0.02))
    remote = f"{gcs_bucket}/sweep"
    for file in local.rglob("*"):
        if file.is_file():
            target = paths.as_path(paths.join(remote, str(file.relative_to(local))))
            target.write_bytes(file.read_bytes())
    on_gs, here = demo_learning.summarise_worlds(remote), demo_learning.summarise_worlds(str(local))
    assert on_gs["targets"] == here["targets"]
    assert {w: r["runs"] for w, r in on_gs["worlds"].items()} == {"1/1": ["a"], "2/2": ["b"]}
