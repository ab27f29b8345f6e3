"""Asynchronous GRPO against the on-policy loop: steps per hour and held-out reward.

    python -m experiments.benchmarks.async_loop --steps 6 --sleep_scale 0.1

A demo-shaped loop (the `demo` config from its warm start, made once and loaded
by every setting) whose simulated experts really wait (`tools.sleep_scale` real seconds per
simulated second, the way live experts keep an episode waiting), run at
`rl.max_staleness` 0, 1 and 2, with the JAX engine in process and behind the
project's rollout server on loopback (weights as versioned HF folders). All
settings train on the same tasks for the same number of steps, so the same
number of episodes; each is then evaluated on the same held-out tasks and tool
configurations. Steps per hour count the steps after the first (which compiles).
Writes `experiments/benchmarks/results/async_loop.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import tempfile
import time

import jax

from experiments.benchmarks import common
from experiments.configs import grpo_hle
from orchestra_jax.training import experiment, grpo_loop, loop_steps
from orchestra_jax.training.run_sync import run_sync


def demo_config(workdir: str, args, max_staleness: int):
    config = grpo_hle.get_config("demo")
    config.workdir = workdir
    config.num_steps = args.steps
    config.rl.max_staleness = max_staleness
    config.tools.sleep_scale = args.sleep_scale
    config.sft.steps = 0
    config.eval.num_tasks = args.eval_tasks
    config.eval.every_steps = 0
    config.log.tensorboard = False
    config.log.trajectories_every = 0
    config.checkpoint.every_steps = 0  # the final step's only
    return config


def warm_start_params(args):
    """The demo's warm-start policy (behaviour cloning, `sft.*`), host copies."""
    config = demo_config(tempfile.mkdtemp(prefix="async_warm_start_"), args, 0)
    config.sft.steps = args.sft_steps
    run = loop_steps.setup_run(config)
    experiment.run_warm_start(config, run)
    params = jax.device_get(run.learner.params)
    run.engine.close()
    return params


def measure(args, placement: str, max_staleness: int, warm_start) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"async_{placement}_{max_staleness}_")
    config = demo_config(workdir, args, max_staleness)
    run = loop_steps.setup_run(config)
    run.learner.load_state(warm_start)
    if config.rl.kl_coef:
        run.learner.set_reference(warm_start)
    run_sync(loop_steps.sync_weights(run, 0))
    engine, server = run.engine, None
    if placement == "loopback":
        # The server swaps between requests: no partial rollouts.
        rl = dataclasses.replace(run.sections.rl, partial_rollouts=False)
        run.sections = dataclasses.replace(run.sections, rl=rl)
        from orchestra_jax.rollout.http.sglang_client import SGLangClient
        from orchestra_jax.rollout.server.app import ServerConfig, load_model, serve_in_thread

        server = serve_in_thread(
            engine,
            ServerConfig(model_path="demo", tokenizer_path="demo"),
            tokenizer=run.tokenizer,
            weight_loader=lambda path: load_model(path, like=run.model_config),
        )
        run.engine = SGLangClient(
            server.url, weights_dir=os.path.join(workdir, "weights"), model_config=run.model_config
        )
    ends: list[float] = []
    start = time.perf_counter()
    grpo_loop.grpo_train(run, progress=lambda step, metrics: ends.append(time.perf_counter()))
    total = time.perf_counter() - start
    evaluator = experiment.build_evaluator(config, run.env, run.tokenizer)
    summary = experiment.evaluate(evaluator, "grpo", run.engine)
    if server is not None:
        run.engine.close()
        server.stop()
    engine.close()
    metrics = common_metrics(os.path.join(workdir, "metrics.jsonl"))
    after_first = ends[-1] - ends[0]
    return {
        "placement": placement,
        "max_staleness": max_staleness,
        "steps": args.steps,
        "episodes": args.steps * config.rl.tasks_per_step * config.rl.group_size,
        "seconds_total": total,
        "seconds_after_first_step": after_first,
        "steps_per_hour": 3600.0 * (len(ends) - 1) / after_first,
        "heldout_reward": summary["heldout_reward"],
        "heldout_accuracy": summary["accuracy"],
        **metrics,
    }


def common_metrics(path: str) -> dict:
    """Means over steps of the loop's timing and staleness metrics."""
    from orchestra_jax.training.metrics import read_metrics

    records = read_metrics(path)
    keys = (
        "time/rollout_s",
        "time/learner_s",
        "async/rollout_s",
        "async/learner_idle_s",
        "async/rollout_idle_s",
        "async/versions_behind_mean",
        "async/versions_behind_max",
        "async/straddling_fraction",
        "async/regenerated_fraction",
        "learner/tis_weight_mean",
        "learner/tis_weight_min",
        "learner/tis_weight_max",
        "episode_tool_latency_s",
        "reward",
    )
    out = {}
    for key in keys:
        values = [r[key] for r in records if r.get(key) is not None]
        if values:
            out[f"mean {key}"] = sum(values) / len(values)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sleep_scale", type=float, default=0.1)
    parser.add_argument("--eval_tasks", type=int, default=32)
    parser.add_argument("--sft_steps", type=int, default=100)
    parser.add_argument("--staleness", default="0,1,2")
    parser.add_argument("--placements", default="in_process,loopback")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warm_start = warm_start_params(args)
    rows = [
        measure(args, placement, int(k), warm_start)
        for placement in args.placements.split(",")
        for k in args.staleness.split(",")
    ]
    for row in rows:
        base = next(
            r for r in rows if r["placement"] == row["placement"] and r["max_staleness"] == 0
        )
        row["speedup_vs_staleness_0"] = row["steps_per_hour"] / base["steps_per_hour"]
        row["heldout_reward_minus_staleness_0"] = row["heldout_reward"] - base["heldout_reward"]
        print(
            f"{row['placement']:>10} k={row['max_staleness']}: "
            f"{row['steps_per_hour']:.0f} steps/h ({row['speedup_vs_staleness_0']:.2f}x), "
            f"held-out reward {row['heldout_reward']:.3f}"
        )
    path = common.write_result(
        "async_loop",
        {
            "command": "python -m experiments.benchmarks.async_loop "
            f"--steps {args.steps} --sleep_scale {args.sleep_scale} "
            f"--eval_tasks {args.eval_tasks} --sft_steps {args.sft_steps}",
            "target": ">= 1.5x steps per hour at max_staleness 1 where rollouts wait on tools, "
            "held-out reward within noise of max_staleness 0",
            "rows": rows,
        },
    )
    print(path)


if __name__ == "__main__":
    main()
