"""Does the demo learn? Summarise a sweep of the demo into one JSON.

    python -m launch.sweep --sweep=launch/sweeps/demo_worlds.py --executor=local \\
        --workdir_root=runs/sweeps
    python -m experiments.benchmarks.demo_learning runs/sweeps/demo_worlds

Runs are grouped by world (their config's `data.synthetic_seed` and `eval.seed`),
each world summarised over its training seeds, and the targets checked on every
world: GRPO beats its warm start by at least `MIN_GAIN` in every run, and no
baseline router dominates it.

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
import json

import numpy as np

from experiments.benchmarks import common
from orchestra_jax.agent.trajectory import read_jsonl
from orchestra_jax.eval.report import dominated_by, load_summaries
from orchestra_jax.io import paths

FIELDS = ("heldout_reward", "accuracy", "mean_cost_usd", "mean_latency_s")
# The least held-out gain of GRPO over its warm start that counts as learning, in
# every run: above the paired evaluation noise of one run (~0.015).
MIN_GAIN = 0.02


def heldout_rewards_by_task(workdir: str, policy: str) -> dict[str, float]:
    """task id -> held-out reward of `policy`'s evaluation episode in `workdir` (episodes
    that failed by infrastructure have none and are left out)."""
    episodes = read_jsonl(paths.join(workdir, "trajectories", f"eval_{policy}.jsonl"))
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


def plans_by_domain(workdir: str, policy: str) -> dict[str, dict[str, list[float]]] | None:
    """domain -> plan -> [episodes, mean held-out reward] of `policy`'s evaluation, a
    plan being its turns' first valid calls ("search-3,reasoner-3,answer-1"; "-" for
    a turn without one). None when the episodes were not written."""
    try:
        episodes = read_jsonl(paths.join(workdir, "trajectories", f"eval_{policy}.jsonl"))
    except FileNotFoundError:
        return None
    rewards: dict[str, dict[str, list[float]]] = {}
    for t in episodes:
        if t.reward is None:
            continue
        plan = ",".join((turn.first_call_feature or "-").removeprefix("tool:") for turn in t.turns)
        domain = str(t.metadata.get("domain", ""))
        rewards.setdefault(domain, {}).setdefault(plan, []).append(float(t.reward))
    return {
        domain: {
            plan: [len(r), float(np.mean(r))]
            for plan, r in sorted(plans.items(), key=lambda kv: -len(kv[1]))
        }
        for domain, plans in sorted(rewards.items())
    }


def run_dirs(sweep_dir: str) -> list[str]:
    """The run folders of a sweep (local or `gs://`), in name order."""
    return sorted(
        paths.join(sweep_dir, p.name) for p in paths.as_path(sweep_dir).iterdir() if p.is_dir()
    )


def world_of(workdir: str) -> str | None:
    """ "<data.synthetic_seed>/<eval.seed>" of a run, from its workdir's config.json;
    None for a folder without one."""
    try:
        config = json.loads(paths.as_path(paths.join(workdir, "config.json")).read_text())
    except FileNotFoundError:
        return None
    return f"{config['data']['synthetic_seed']}/{config['eval']['seed']}"


def summarise(sweep_dir: str) -> dict:
    """One world's runs (every run in `sweep_dir`), summarised over their seeds."""
    return summarise_runs(sweep_dir, run_dirs(sweep_dir))


def summarise_worlds(sweep_dir: str) -> dict:
    """The runs of `sweep_dir` grouped by world, each summarised, and the targets."""
    by_world: dict[str, list[str]] = {}
    for workdir in run_dirs(sweep_dir):
        world = world_of(workdir)
        if world is not None:
            by_world.setdefault(world, []).append(workdir)
    if not by_world:
        raise SystemExit(f"no runs (config.json) under {sweep_dir}")
    worlds = {w: summarise_runs(sweep_dir, dirs) for w, dirs in sorted(by_world.items())}
    return {"sweep_dir": sweep_dir, "worlds": worlds, "targets": targets(worlds)}


def targets(worlds: dict[str, dict]) -> dict:
    """Per world: the least gain over its runs, whether every run gained MIN_GAIN,
    and whether any baseline dominated GRPO in any run."""
    per_world = {}
    for world, result in worlds.items():
        gains = result["grpo_gain_over_warm_start"]
        dominated = sorted({b for bs in result["grpo_dominated_by"].values() for b in bs})
        per_world[world] = {
            "least_gain": min(gains) if gains else None,
            "every_run_gains": bool(gains) and min(gains) >= MIN_GAIN,
            "dominated_by": dominated,
        }
    met = all(w["every_run_gains"] and not w["dominated_by"] for w in per_world.values())
    return {"min_gain": MIN_GAIN, "worlds": per_world, "met": met}


def summarise_runs(sweep_dir: str, run_workdirs: list[str]) -> dict:
    seeds, workdirs = {}, {}
    for workdir in run_workdirs:
        summaries = {s["policy"]: s for s in load_summaries(workdir)}
        if "grpo" in summaries:
            seeds[paths.as_path(workdir).name] = summaries
            workdirs[paths.as_path(workdir).name] = workdir
    if not seeds:
        raise SystemExit(f"no evaluated runs (eval_grpo.json) among {run_workdirs}")
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
        "plans_by_domain": {
            k: {p: plans_by_domain(workdirs[k], p) for p in ("warm_start", "grpo")} for k in seeds
        },
        "grpo_dominated_by": {
            k: dominated_by(s["grpo"], list(s.values())) for k, s in seeds.items()
        },
    }


def print_world(result: dict) -> None:
    for policy, row in result["policies"].items():
        r = row["heldout_reward"]
        print(f"  {policy:18s} held-out reward {r['mean']:.3f} ± {r['std']:.3f}")
    for run, gain in result["grpo_gain_paired"].items():
        if gain:
            print(
                f"  {run}: GRPO − warm start {gain['mean']:+.3f} ± {gain['stderr']:.3f} "
                f"(standard error over {gain['num_tasks']} paired tasks)"
            )
    gain = result["grpo_gain_summary"]
    if gain["std"] is not None:
        print(
            f"  GRPO − warm start over {gain['runs']} runs: {gain['mean']:+.3f} ± "
            f"{gain['std']:.3f} (mean ± sample std), positive in {gain['positive_runs']}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    result = summarise_worlds(parser.parse_args().sweep_dir)
    path = common.write_result("demo_learning", result)
    for world, summary in result["worlds"].items():
        print(f"world {world} (data.synthetic_seed/eval.seed):")
        print_world(summary)
    for world, t in result["targets"]["worlds"].items():
        print(
            f"world {world}: least gain {t['least_gain']:+.3f}, every run ≥ "
            f"{MIN_GAIN}: {t['every_run_gains']}, dominated by: {t['dominated_by'] or 'none'}"
        )
    print(f"targets met on every world: {result['targets']['met']}")
    print(f"-> {path}")
