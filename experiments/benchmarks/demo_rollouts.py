"""JaxEngine prefill shapes on the demo's real GRPO rollouts: compiles and seconds.

    python -m experiments.benchmarks.demo_rollouts [--steps 8] [--sft-steps 40]

The workload is the demo itself: the `demo` config's policy after a short warm
start (`--sft-steps` behaviour-cloning steps on its demonstrator), then
`--steps` GRPO rollout steps (the config's tasks per step x G, on the synthetic
environment, its tools and the agent loop; docs/benchmarks.md says which
config its figure used), each after an
`update_weights` as in training. Turns reach the engine as the agent loop hands
them over, so admissions mix rows and suffix lengths as they do in a run.

Ours: JaxEngine as built by the demo (prefill rows padded to at least 8, prompts
and suffixes to at least 128 tokens, cached prefixes used only when they cover a
quarter of the prompt). Peer: the same engine without those floors (rows
from 1, lengths from 16, any cached prefix of 16 tokens or more). Both run every
step on the same weights, tasks and seeds, alternately (ours, peer) step by
step; fresh engines, so every compile is counted and timed as in a run.
Reported: rollout seconds (all steps; and the second half, when most shapes are
compiled), compiles, prompt tokens computed and reused. Writes
experiments/benchmarks/results/demo_rollouts.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import os
import tempfile
import time

import jax

from experiments.benchmarks import common
from experiments.configs import grpo_hle
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.training import experiment, loop_steps
from orchestra_jax.training.run_sync import run_sync

PEER_SETTINGS = dict(min_prefill_rows=1, min_prefill_len=16, min_cached_fraction=0.0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--sft-steps", type=int, default=40)
    args = parser.parse_args(argv)
    config = grpo_hle.get_config("demo")
    config.sft.steps = args.sft_steps
    config.workdir = tempfile.mkdtemp(prefix="demo_rollouts_")
    run = loop_steps.setup_run(config)
    experiment.run_warm_start(config, run)
    shape = dict(
        max_batch_size=config.rollout.max_batch_size, max_seq_len=config.rollout.max_seq_len
    )
    engines = {
        "ours": run.engine,
        "peer": JaxEngine(run.model, JaxEngineConfig(**shape, **PEER_SETTINGS)),
    }
    tasks = list(itertools.islice(loop_steps.train_task_iterator(run.sections), args.steps))
    seconds = {name: [] for name in engines}
    tokens = {name: [] for name in engines}
    load_before = os.getloadavg()[0]
    for step, step_tasks in enumerate(tasks):
        for name, engine in engines.items():
            asyncio.run(engine.update_weights(run.learner.policy_params(), version=step + 1))
            start = time.perf_counter()
            experience = run_sync(
                loop_steps.collect_experience(
                    dataclasses.replace(run, engine=engine), step_tasks, step
                )
            )
            seconds[name].append(time.perf_counter() - start)
            tokens[name].append([t.token_ids for t in experience.trajectories])
        print(
            f"step {step + 1}/{args.steps}: "
            + ", ".join(f"{n} {seconds[n][-1]:.1f} s" for n in engines),
            flush=True,
        )
    half = args.steps // 2
    same = sum(
        a == b
        for step_a, step_b in zip(tokens["ours"], tokens["peer"])
        for a, b in zip(step_a, step_b)
    )
    result = {
        "workload": {
            "config": "demo",
            "warm_start_steps": args.sft_steps,
            "rollout_steps": args.steps,
            "tasks_per_step": config.rl.tasks_per_step,
            "group_size": config.rl.group_size,
            "temperature": config.rollout.temperature,
        },
        "engine": {**shape, "ours": "defaults", "peer": PEER_SETTINGS},
        "rollout_s": {
            n: {"total": sum(s), f"last_{args.steps - half}_steps": sum(s[half:]), "per_step": s}
            for n, s in seconds.items()
        },
        "speedup_total": sum(seconds["peer"]) / sum(seconds["ours"]),
        "speedup_second_half": sum(seconds["peer"][half:]) / sum(seconds["ours"][half:]),
        "compiles": {n: sum(e.compile_counts.values()) for n, e in engines.items()},
        "prompt_tokens": {
            n: {
                k: e.prefix_cache_stats[k]
                for k in ("prompt_tokens_computed", "prompt_tokens_reused")
            }
            for n, e in engines.items()
        },
        "episodes_with_identical_tokens": f"{same}/{sum(len(s) for s in tokens['ours'])}",
        "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "jax_backend": jax.default_backend(),
    }
    for engine in engines.values():
        engine.close()
    path = common.write_result("demo_rollouts", result)
    for name in engines:
        print(
            f"{name}: {sum(seconds[name]):.1f} s in all, {sum(seconds[name][half:]):.1f} s "
            f"in the last {args.steps - half} steps, {result['compiles'][name]} compiles"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
