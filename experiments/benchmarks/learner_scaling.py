"""How the learner step scales: time against tokens per step, and peak memory.

    python -m experiments.benchmarks.learner_scaling [--repeats 3] [--baseline-src DIR]
        [--skip-timing | --skip-memory]   # parts not run keep their last figures

1. Time: the GRPO `Learner.train_step` (whole batch, no micro-batching,
   float32, PPO-clip on a loss mask over the last 3/4 of each row) on the demo
   model, rows of 1,024 tokens, 4 to 64 rows (4k to 64k tokens per step). The
   sizes are timed round robin; the slope of log(median time) against
   log(tokens) by least squares (1 = linear). Target: <= 1.05.
2. Memory at 4 x 4,096 tokens (demo model, the same step): XLA's buffer plan of
   the compiled step (`memory_analysis()`: arguments + outputs + temporaries −
   aliased) and the peak RSS of a fresh process that runs two steps. Measured for
   this checkout and, with `--baseline-src`, for another checkout (e.g. the commit
   before the flash attention and chunked head), each in its own process.
   Target: at most a third of the baseline.
3. Memory of the LM head on a tiny model with Qwen3's 151,936-token vocabulary
   (`tiny` preset, 4 x 1,024 tokens, 3,072 loss tokens): the chunked head
   (the learner's default chunk, `auto_chunk_size`: 441 tokens at this vocabulary)
   against the whole head (one chunk of every loss token), XLA's plan of each
   compiled step. Target: the chunked peak at least 2x lower.

Writes experiments/benchmarks/results/learner_scaling.json. The worker mode
(`--worker`) builds and runs one step in a fresh process and prints JSON; it
imports only `orchestra_jax`, so it runs against any checkout on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import resource
import subprocess
import sys

import numpy as np

SEQ = 1024
ROWS = (4, 8, 16, 32, 64)
MEMORY_SHAPE = (4, 4096)
VOCAB_152K = 151936
TINY_SHAPE = (4, 1024)


def train_batch(rows: int, seq: int, vocab: int):
    """A fixed GRPO batch: random tokens, loss on the last 3/4 of every row."""
    from orchestra_jax.rl.batching import TrainBatch, loss_positions

    rng = np.random.RandomState(0)
    tokens = rng.randint(0, vocab, (rows, seq + 1))
    mask = np.zeros((rows, seq), np.float32)
    mask[:, seq // 4 :] = 1.0
    return TrainBatch(
        input_ids=tokens[:, :-1].astype(np.int32),
        positions=np.broadcast_to(np.arange(seq, dtype=np.int32), (rows, seq)).copy(),
        segment_ids=np.ones((rows, seq), np.int32),
        target_ids=tokens[:, 1:].astype(np.int32),
        loss_mask=mask,
        advantages=(rng.randn(rows, 1) * mask).astype(np.float32),
        old_logprobs=(np.log(1.0 / vocab) * mask).astype(np.float32),
        loss_index=loss_positions(mask),
    )


def make_learner(model_config, **learner_fields):
    from flax import nnx

    from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM
    from orchestra_jax.rl.learner import Learner, LearnerConfig

    model = Qwen3ForCausalLM(model_config, rngs=nnx.Rngs(0))
    return Learner(model, LearnerConfig(learning_rate=1e-4, kl_coef=0.0, **learner_fields))


def planned_bytes(learner, batch) -> dict:
    """XLA's memory plan of the learner's compiled step for `batch`."""
    import jax

    step = learner._build_step("grpo", 1)
    placed = jax.tree.map(np.asarray, batch)
    stats = (
        step.lower(
            learner.params, learner.opt_state, None, learner._frozen, placed, np.float32(1.0)
        )
        .compile()
        .memory_analysis()
    )
    total = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )
    return {
        "arguments": stats.argument_size_in_bytes,
        "outputs": stats.output_size_in_bytes,
        "temporaries": stats.temp_size_in_bytes,
        "aliased": stats.alias_size_in_bytes,
        "total": total,
    }


def worker(args) -> None:
    """One measurement in this fresh process; prints one JSON line."""
    from orchestra_jax.models.qwen3.model import Qwen3Config

    overrides = json.loads(args.model_overrides)
    config = Qwen3Config.preset(args.preset, **overrides)
    fields = (
        {} if args.lm_head_chunk == "default" else {"lm_head_chunk": _chunk(args.lm_head_chunk)}
    )
    learner = make_learner(config, **fields)
    batch = train_batch(args.rows, args.seq, config.vocab_size)
    out = {"plan": planned_bytes(learner, batch)}
    if args.run:
        for _ in range(2):
            metrics = learner.train_step(batch)
        out["loss"] = metrics["loss"]
        out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out), flush=True)


def _chunk(value: str) -> int:
    return 1 << 30 if value == "whole" else int(value)  # whole: every token in one chunk


def run_worker(
    src: str, preset: str, rows: int, seq: int, *, chunk="default", overrides=None, run=True
):
    """The worker's JSON, run by this interpreter with `src` first on PYTHONPATH."""
    cmd = [
        sys.executable,
        str(pathlib.Path(__file__).resolve()),
        "--worker",
        f"--preset={preset}",
        f"--rows={rows}",
        f"--seq={seq}",
        f"--lm-head-chunk={chunk}",
        f"--model-overrides={json.dumps(overrides or {})}",
    ] + (["--run"] if run else [])
    env = dict(os.environ, PYTHONPATH=src)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"worker failed ({src}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_scaling(repeats: int) -> dict:
    """Median step seconds per row count, timed round robin; log-log slope."""
    from experiments.benchmarks import common
    from orchestra_jax.models.qwen3.model import Qwen3Config

    config = Qwen3Config.preset("demo")
    fns, learners = {}, {}
    for rows in ROWS:
        learner = make_learner(config)
        batch = train_batch(rows, SEQ, config.vocab_size)
        learners[rows] = learner
        fns[str(rows * SEQ)] = lambda learner=learner, batch=batch: learner.train_step(batch)
    timings = common.alternate_timings(fns, repeats, warmup=1)
    summary = common.summarize(timings)
    tokens = np.array([int(k) for k in summary], float)
    seconds = np.array([v["median_s"] for v in summary.values()])
    slope, _ = np.polyfit(np.log(tokens), np.log(seconds), 1)
    return {
        "seq_len": SEQ,
        "rows": list(ROWS),
        "timings": summary,
        "tokens_per_s": {k: int(k) / v["median_s"] for k, v in summary.items()},
        "log_log_slope": float(slope),
        "noise_max_over_min": {k: v["max_s"] / v["min_s"] for k, v in summary.items()},
        "compiles": {
            str(r * SEQ): sum(f._cache_size() for f in lr._compiled.values())
            for r, lr in learners.items()
        },
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-src", default=None, help="another checkout to measure")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--rows", type=int, default=MEMORY_SHAPE[0])
    parser.add_argument("--seq", type=int, default=MEMORY_SHAPE[1])
    parser.add_argument("--lm-head-chunk", default="default")
    parser.add_argument("--model-overrides", default="{}")
    parser.add_argument("--run", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    from experiments.benchmarks import common

    here = str(pathlib.Path(__file__).resolve().parents[2])
    # Parts not run now keep their last figures (each part records its own date and load).
    previous = common.RESULTS_DIR / "learner_scaling.json"
    result = {}
    if previous.exists():
        old = json.loads(previous.read_text())
        result = {k: old[k] for k in ("memory_4x4096", "lm_head_152k", "time") if k in old}
    stamp = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_1m": os.getloadavg()[0],
    }
    if args.skip_memory:
        return _finish(common, result, args, stamp)
    memory = {**stamp, "shape": list(MEMORY_SHAPE), "ours": run_worker(here, "demo", *MEMORY_SHAPE)}
    if args.baseline_src:
        memory["baseline_src"] = args.baseline_src
        memory["baseline"] = run_worker(args.baseline_src, "demo", *MEMORY_SHAPE)
        memory["ours_over_baseline_rss"] = (
            memory["ours"]["peak_rss_bytes"] / memory["baseline"]["peak_rss_bytes"]
        )
        memory["ours_over_baseline_plan"] = (
            memory["ours"]["plan"]["total"] / memory["baseline"]["plan"]["total"]
        )
    result["memory_4x4096"] = memory
    big_vocab = {"vocab_size": VOCAB_152K}
    head = {
        **stamp,
        "model": "tiny preset, vocab 151936",
        "shape": list(TINY_SHAPE),
        "chunked": run_worker(here, "tiny", *TINY_SHAPE, overrides=big_vocab, run=False),
        "whole": run_worker(
            here, "tiny", *TINY_SHAPE, chunk="whole", overrides=big_vocab, run=False
        ),
    }
    head["whole_over_chunked_plan"] = (
        head["whole"]["plan"]["total"] / head["chunked"]["plan"]["total"]
    )
    result["lm_head_152k"] = head
    _finish(common, result, args, stamp)


def _finish(common, result: dict, args, stamp: dict) -> None:
    if not args.skip_timing:
        result["time"] = {**stamp, **time_scaling(args.repeats)}
    path = common.write_result("learner_scaling", result)
    gib = 2.0**30
    memory, head = result.get("memory_4x4096", {}), result.get("lm_head_152k", {})
    if "ours" in memory:
        print(f"4x4096 peak RSS: ours {memory['ours']['peak_rss_bytes'] / gib:.2f} GiB", end="")
    if "baseline" in memory:
        print(f", baseline {memory['baseline']['peak_rss_bytes'] / gib:.2f} GiB", end="")
    if head:
        print(f"; 152k head plan whole/chunked {head['whole_over_chunked_plan']:.2f}x", end="")
    if "time" in result:
        print(f"; slope {result['time']['log_log_slope']:.3f}", end="")
    print(f" -> {path}")


if __name__ == "__main__":
    main()
