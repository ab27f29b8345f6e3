"""Does the demo learn? Summarise a seed sweep of the demo into one JSON.

    python -m launch.sweep --sweep=launch/sweeps/demo_seeds.py --executor=local \\
        --workdir_root=runs/sweeps
    python -m experiments.benchmarks.demo_learning runs/sweeps/demo_seeds

For every policy evaluated in each seed's workdir (the trained `grpo`, its
`warm_start`, the baseline routers): held-out reward, accuracy and cost per seed,
their mean and sample std, GRPO's gain over its warm start per seed, and which
policies dominate GRPO on the accuracy/cost plane. Writes
`experiments/benchmarks/results/demo_learning.json`.

Each seed's gain also comes with its standard error over the held-out tasks,
paired task by task (both policies play the same tasks with the same tool
configurations): it says how much of a seed's gain the evaluation's own noise
could explain, which the spread across a few seeds alone cannot.
"""

from __future__ import annotations

import argparse
import glob
import os

import numpy as np

from experiments.benchmarks import common
from orchestra_jax.agent.trajectory import read_jsonl
from orchestra_jax.eval.report import dominated_by, load_summaries

FIELDS = ("heldout_reward", "accuracy", "mean_cost_usd", "mean_latency_s")


def heldout_rewards_by_task(workdir: str, policy: str) -> dict[str, float]:
    """task id -> held-out reward of `policy`'s evaluation episode in `workdir` (episodes
    that failed by infrastructure have none and are left out)."""
    episodes = read_jsonl(os.path.join(workdir, "trajectories", f"eval_{policy}.jsonl"))
    return {t.task_id: float(t.reward) for t in episodes if t.reward is not None}


def paired_gain(workdir: str, policy: str = "grpo", baseline: str = "warm_start") -> dict | None:
    """Mean and standard error of policy − baseline held-out reward over shared tasks.

    None when either evaluation's episodes were not written.
    """
    try:
        a = heldout_rewards_by_task(workdir, policy)
        b = heldout_rewards_by_task(workdir, baseline)
    except FileNotFoundError:
        return None
    tasks = sorted(set(a) & set(b))
    if len(tasks) < 2:
        return None
    diff = np.array([a[t] - b[t] for t in tasks])
    return {
        "mean": float(diff.mean()),
        "stderr": float(diff.std(ddof=1) / np.sqrt(len(diff))),
        "num_tasks": len(tasks),
    }


def summarise(sweep_dir: str) -> dict:
    seeds, workdirs = {}, {}
    for workdir in sorted(glob.glob(os.path.join(sweep_dir, "*"))):
        summaries = (
            {s["policy"]: s for s in load_summaries(workdir)} if os.path.isdir(workdir) else {}
        )
        if "grpo" in summaries:
            seeds[os.path.basename(workdir)] = summaries
            workdirs[os.path.basename(workdir)] = workdir
    if not seeds:
        raise SystemExit(f"no evaluated runs (eval_grpo.json) under {sweep_dir}")
    policies = sorted(set.intersection(*(set(s) for s in seeds.values())))
    table = {}
    for policy in policies:
        row = {}
        for field in FIELDS:
            values = [seeds[k][policy][field] for k in seeds]
            row[field] = {
                "per_seed": values,
                "mean": float(np.mean(values)),
                "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            }
        table[policy] = row
    gains = [
        seeds[k]["grpo"]["heldout_reward"] - seeds[k]["warm_start"]["heldout_reward"]
        for k in seeds
        if "warm_start" in seeds[k]
    ]
    return {
        "sweep_dir": sweep_dir,
        "runs": list(seeds),
        "policies": table,
        "grpo_gain_over_warm_start": gains,
        "grpo_gain_summary": {
            "mean": float(np.mean(gains)) if gains else None,
            "std": float(np.std(gains, ddof=1)) if len(gains) > 1 else None,
            "positive_runs": sum(g > 0 for g in gains),
            "runs": len(gains),
        },
        "grpo_gain_paired": {k: paired_gain(workdirs[k]) for k in seeds},
        "grpo_dominated_by": {
            k: dominated_by(s["grpo"], list(s.values())) for k, s in seeds.items()
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    result = summarise(parser.parse_args().sweep_dir)
    path = common.write_result("demo_learning", result)
    for policy, row in result["policies"].items():
        r = row["heldout_reward"]
        print(f"{policy:18s} held-out reward {r['mean']:.3f} ± {r['std']:.3f}")
    for run, gain in result["grpo_gain_paired"].items():
        if gain:
            print(
                f"{run}: GRPO − warm start {gain['mean']:+.3f} ± {gain['stderr']:.3f} "
                f"(standard error over {gain['num_tasks']} paired tasks)"
            )
    gain = result["grpo_gain_summary"]
    if gain["std"] is not None:
        print(
            f"GRPO − warm start over {gain['runs']} runs: {gain['mean']:+.3f} ± {gain['std']:.3f} "
            f"(mean ± sample std), positive in {gain['positive_runs']}"
        )
    print(f"-> {path}")
