"""GRPO learner step on shared-prompt batches against ordinary TrainBatches.

    python -m experiments.benchmarks.learner_shared_prompts [--repeats 5]

The workload has the shape of a demo GRPO step: `tasks` groups of `group`
episodes; each group's prompt is ~670 tokens (random ids, 630-710), and each
episode goes on with three sampled calls of ~16 tokens, each followed by a
tool result of ~60 tokens (not in the loss), as the demo's three-call plans do
(~900 tokens an episode). Advantages and rollout log-probs are random.

Ours: `build_shared_prompt_batch` (one prompt a group, run once; rl.share_prompts).
Peer: `build_train_batch` (one episode a row, today's default). Both run
`Learner.train_step` (GRPO loss, KL to a reference, the demo's learning rate and
temperature) on the demo config's model with the demo's sequence buckets;
micro-batches hold 16 episodes on both sides (2 groups of 8 for ours). Steps
alternate (ours, peer, ...) in one process after an untimed compile; medians.
Reported: seconds a step, the speedup, padded tokens a batch, compile seconds,
and the two steps' losses and gradient norms (equal up to float rounding).
Writes experiments/benchmarks/results/learner_shared_prompts.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import jax
import numpy as np

from experiments.benchmarks import common
from experiments.configs import grpo_hle
from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.rl.batching import BatchingConfig, build_train_batch
from orchestra_jax.rl.learner import Learner
from orchestra_jax.rl.shared_prompts import build_shared_prompt_batch
from orchestra_jax.training import builders

CALLS, CALL_LEN, RESULT_LEN = 3, 16, 60


def episodes(tasks: int, group: int, vocab: int, seed: int = 0) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(tasks):
        prompt = rng.integers(3, vocab, int(rng.integers(630, 711))).tolist()
        for _ in range(group):
            ids, mask = list(prompt), [0] * len(prompt)
            for _ in range(CALLS):
                call = int(rng.integers(CALL_LEN - 4, CALL_LEN + 5))
                result = int(rng.integers(RESULT_LEN - 20, RESULT_LEN + 21))
                ids += rng.integers(3, vocab, call + result).tolist()
                mask += [1] * call + [0] * result
            logprobs = [float(rng.normal(-1.0, 0.3)) if m else 0.0 for m in mask]
            out.append(
                Trajectory(
                    task_id="t",
                    group_index=0,
                    seed=0,
                    token_ids=ids,
                    loss_mask=mask,
                    rollout_logprobs=logprobs,
                    prompt_length=len(prompt),
                    advantage=float(rng.normal()),
                )
            )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    args = parser.parse_args(argv)
    config = grpo_hle.get_config("demo")
    mesh, tokenizer = builders.build_mesh(config), builders.build_tokenizer(config)
    workload = episodes(args.tasks, args.group, tokenizer.vocab_size)
    buckets = tuple(config.rl.seq_buckets)
    sides = {
        "shared_prompts": (build_shared_prompt_batch, 16 // args.group),
        "one_episode_a_row": (build_train_batch, 16),
    }
    learners, batches, compile_s, first = {}, {}, {}, {}
    for name, (build, micro) in sides.items():
        model, _ = builders.build_model(config, mesh, tokenizer)
        learner_config = dataclasses.replace(
            builders.build_learner_config(config, total_steps=config.num_steps),
            micro_batch_size=micro,
        )
        learner = Learner(model, learner_config, mesh=mesh)
        batch = build(
            workload,
            config=BatchingConfig(seq_buckets=buckets, row_multiple=learner.row_multiple()),
        )
        start = time.perf_counter()
        first[name] = learner.train_step(batch)  # compiles; equal weights on both sides
        compile_s[name] = time.perf_counter() - start
        learners[name], batches[name] = learner, batch

    def step(name):
        return lambda: learners[name].train_step(batches[name])

    load_before = os.getloadavg()[0]
    timings = common.alternate_timings({n: step(n) for n in sides}, repeats=args.repeats, warmup=0)
    summary = common.summarize(timings)
    result = {
        "model": f"Qwen3 demo config (preset {config.model.preset!r} with "
        f"{dict(config.model.overrides)}), float32, random weights",
        "workload": {
            "groups": args.tasks,
            "episodes_per_group": args.group,
            "prompt_tokens": "630-710",
            "calls": CALLS,
            "call_tokens": f"{CALL_LEN} +- 4",
            "result_tokens": f"{RESULT_LEN} +- 20",
            "seq_buckets": list(buckets),
        },
        "timings": summary,
        "speedup": summary["one_episode_a_row"]["median_s"] / summary["shared_prompts"]["median_s"],
        "batch_shapes": {n: list(b.shape) for n, b in batches.items()},
        "padded_tokens": {
            "shared_prompts": int(np.prod(batches["shared_prompts"].shape)),
            "one_episode_a_row": int(np.prod(batches["one_episode_a_row"].shape)),
        },
        "first_step_s_with_compile": compile_s,
        "first_step": {
            n: {k: m[k] for k in ("loss", "grad_norm", "kl", "num_loss_tokens")}
            for n, m in first.items()
        },
        "load_average_1m": {"before_timing": load_before, "after_timing": os.getloadavg()[0]},
        "jax_backend": jax.default_backend(),
    }
    path = common.write_result("learner_shared_prompts", result)
    for name in sides:
        print(
            f"{name}: median {summary[name]['median_s']:.2f} s a step, batch "
            f"{batches[name].shape}, loss {first[name]['loss']:.6f}"
        )
    print(f"speedup {result['speedup']:.2f}x -> {path}")


if __name__ == "__main__":
    main()
