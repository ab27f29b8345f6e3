"""Decode throughput: JaxEngine against Hugging Face `generate` (PyTorch CPU), same weights.

    python -m experiments.benchmarks.decode [--repeats 5] [--mixed-requests 48]

1. Fixed batch: 16 prompts x 128 new tokens, sampling at temperature 1 (no
   stop tokens, so both sides generate exactly 128 tokens per row). New tokens/s,
   timed round robin in one run, medians and ratios: ours in float32, ours with
   bfloat16 weights (float32 accumulation; the KV cache float32, the engine's CPU
   default), HF with torch's default threads (one per core) and with one thread
   (on a shared machine the default collapses: spinning OpenMP barriers; the
   ratio is against the faster of the two), and Tunix 0.1.7's sampler in float32
   (run in $TUNIX_PYTHON as a separate process answering one batch per request,
   alternating with ours; skipped, saying why, without Tunix).
2. Batch sweep: ours in float32 and with bf16 weights at 8, 16, 32 and 64 rows
   (one engine of that many slots each, same prompts and budgets), new tokens/s.
3. Mixed lengths: many requests with random prompt lengths and budgets. Ours
   runs them all through 16 continuously batched slots; the peer is HF
   `generate` (its faster thread setting) over fixed batches of 16 (left-padded,
   each batch runs until its longest budget). Useful (requested) new tokens/s.

The model is the demo Qwen3 shape (vocab 4096, hidden 256, 4 layers, 4 heads,
2 KV heads, head_dim 64, intermediate 768), random weights identical on every
side; HF and the mixed-lengths part in float32. Writes
experiments/benchmarks/results/decode.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.benchmarks import common
from experiments.benchmarks.peer_process import hf_python, torch_importable
from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig

BATCH, NEW_TOKENS, PROMPT_LEN = 16, 128, 32


def hf_generate(peer, prompts: list[list[int]], max_new: int, seed: int) -> int:
    """HF sampling over one left-padded batch for exactly `max_new` tokens; returns new tokens."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = peer.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            pad_token_id=0,
            eos_token_id=None,
        )
    return (out.shape[1] - width) * len(prompts)


def ours_generate(engine, requests) -> int:
    completions = asyncio.run(engine.generate(requests))
    return sum(c.completion_tokens for c in completions)


class HFPeer:
    """HF `generate` on the checkpoint at `path`: in this process when torch imports here,
    else one `hf_peer` worker per thread setting in `peer_process.hf_python()` (Python 3.11's
    CPU torch), alternating with ours through `peer_process` like an in-process peer.

    `runner(batches, threads)` is a zero-argument callable that generates each
    (prompts, max_new, seed) of `batches` with torch limited to `threads` intra-op
    threads and returns the new tokens.
    """

    def __init__(self, path: str):

        self.path, self.workers, self.info = path, [], {}
        self.local = torch_importable()
        if self.local:
            import torch
            import transformers

            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32
            ).eval()
            self.info = {
                "python": "this process",
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            }
            self.default_threads = torch.get_num_threads()
        else:
            self.python = hf_python()
            self.default_threads = os.cpu_count() or 1

    def runner(self, batches: list[tuple[list[list[int]], int, int]], threads: int):
        if self.local:
            import torch

            def run() -> int:
                before = torch.get_num_threads()
                torch.set_num_threads(threads)
                try:
                    return sum(hf_generate(self.model, p, m, s) for p, m, s in batches)
                finally:
                    torch.set_num_threads(before)

            return run
        from experiments.benchmarks.peer_process import PeerProcess

        spec = pathlib.Path(self.path) / f"batches_{len(self.workers)}.json"
        spec.write_text(
            json.dumps([{"prompts": p, "max_new": m, "seed": s} for p, m, s in batches])
        )
        worker = PeerProcess.start(
            self.python,
            "experiments.benchmarks.hf_peer",
            ["generate", "--checkpoint", self.path, "--batches", str(spec)]
            + ["--threads", str(threads)],
        )
        if not worker.available:
            raise RuntimeError(f"HF peer in {self.python} did not start: {worker.reason}")
        self.workers.append(worker)
        self.info = {
            "python": self.python,
            **{k: v for k, v in worker.info.items() if k != "ready"},
        }

        def run_remote() -> int:
            worker.step()
            return int(worker.last["new_tokens"])

        return run_remote

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


def batch_requests(rng, rows: int) -> tuple[list[list[int]], list[GenerateRequest]]:
    """`rows` random prompts of PROMPT_LEN tokens, each asking for NEW_TOKENS tokens at T = 1."""
    prompts = [rng.integers(3, 4000, PROMPT_LEN).tolist() for _ in range(rows)]
    sp = [SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=i) for i in range(rows)]
    return prompts, [GenerateRequest(p, s) for p, s in zip(prompts, sp)]


def _warm(engine, requests, counts, name):
    """A zero-argument run of `requests` on `engine`, called twice to compile everything
    (the second call also compiles the cache shrink); and the compiles so far."""

    def run():
        counts[name] = ours_generate(engine, requests)

    run()
    run()
    return run


def fixed_batch(engines, peer, rng, repeats, peer_threads, tunix):
    prompts, requests = batch_requests(rng, BATCH)
    counts = {}
    fns = {name: _warm(engine, requests, counts, name) for name, engine in engines.items()}
    compiles_before = {n: sum(e.compile_counts.values()) for n, e in engines.items()}

    def hf_fn(n: int):
        run = peer.runner([(prompts, NEW_TOKENS, 0)], n)

        def hf():
            counts[f"hf_{n}"] = run()

        return hf

    fns.update({f"hf_{n}_threads": hf_fn(n) for n in peer_threads})
    tunix_seconds: list[float] = []
    if tunix.available:
        fns["tunix_float32"] = lambda: tunix_seconds.append(tunix.step())
    timings = common.alternate_timings(fns, repeats=repeats, warmup=0)
    if tunix.available:  # the peer's own timing of each batch, without the pipe round trip
        timings["tunix_float32"] = tunix_seconds
        counts["tunix"] = tunix.last["new_tokens"]
    summary = common.summarize(timings)
    tokens = BATCH * NEW_TOKENS
    assert all(c == tokens for c in counts.values()), counts
    tps = {k: tokens / summary[k]["median_s"] for k in summary}
    hf_best = max((k for k in tps if k.startswith("hf_")), key=lambda k: tps[k])
    result = {
        "shape": {
            "batch": BATCH,
            "prompt_len": PROMPT_LEN,
            "new_tokens": NEW_TOKENS,
            "temperature": 1.0,
        },
        "timings": summary,
        "new_tokens_per_s": tps,
        "best_peer": hf_best,
        "speedup_vs_best_peer": tps["ours"] / tps[hf_best],
        "bf16_speedup_vs_best_peer": tps["ours_bf16"] / tps[hf_best],
        "bf16_over_float32": tps["ours_bf16"] / tps["ours"],
        "noise_max_over_min": {k: v["max_s"] / v["min_s"] for k, v in summary.items()},
        "recompiles_during_timing": {
            n: sum(e.compile_counts.values()) - compiles_before[n] for n, e in engines.items()
        },
    }
    if tunix.available:
        result["speedup_vs_tunix"] = tps["ours"] / tps["tunix_float32"]
    else:
        result["tunix_skipped"] = tunix.reason
    return result


def batch_sweep(models, rng, repeats, steps_per_call, sizes=(8, 16, 32, 64)) -> dict:
    """New tokens/s of ours in each precision at each batch size, timed round robin."""
    fns, engines, counts = {}, {}, {}
    for rows in sizes:
        _, requests = batch_requests(rng, rows)
        for name, model in models.items():
            engine = JaxEngine(
                model,
                JaxEngineConfig(
                    max_batch_size=rows, max_seq_len=512, steps_per_call=steps_per_call
                ),
            )
            key = f"{name}_b{rows}"
            engines[key] = engine
            fns[key] = _warm(engine, requests, counts, key)
    before = {k: sum(e.compile_counts.values()) for k, e in engines.items()}
    try:
        timings = common.alternate_timings(fns, repeats=repeats, warmup=0)
    finally:
        for engine in engines.values():
            engine.close()
    summary = common.summarize(timings)
    table = {
        rows: {name: rows * NEW_TOKENS / summary[f"{name}_b{rows}"]["median_s"] for name in models}
        for rows in sizes
    }
    for rates in table.values():
        rates["bf16_over_float32"] = rates["ours_bf16"] / rates["ours"]
    return {
        "new_tokens_per_s": table,
        "timings": summary,
        "recompiles_during_timing": {
            k: sum(e.compile_counts.values()) - before[k] for k, e in engines.items()
        },
    }


def mixed_lengths(engine, peer, rng, repeats, n_requests, peer_threads):
    lengths = rng.integers(8, 192, n_requests)
    budgets = rng.integers(16, 256, n_requests)
    prompts = [rng.integers(3, 4000, n).tolist() for n in lengths]
    requests = [
        GenerateRequest(p, SamplingParams(temperature=1.0, max_new_tokens=int(m), seed=i))
        for i, (p, m) in enumerate(zip(prompts, budgets))
    ]
    useful = int(budgets.sum())

    def ours():
        assert ours_generate(engine, requests) == useful

    hf = peer.runner(
        [
            (prompts[start : start + BATCH], int(budgets[start : start + BATCH].max()), start)
            for start in range(0, n_requests, BATCH)
        ],
        peer_threads,
    )

    ours()  # compile every bucket this workload reaches; the second run also
    ours()  # compiles the cache shrink between runs
    compiles_before = sum(engine.compile_counts.values())
    peer_name = f"hf_static_batches_{peer_threads}_threads"
    timings = common.alternate_timings({"ours": ours, peer_name: hf}, repeats=repeats, warmup=0)
    summary = common.summarize(timings)
    tps = {k: useful / summary[k]["median_s"] for k in summary}
    return {
        "requests": n_requests,
        "prompt_len_range": [8, 192],
        "new_tokens_range": [16, 256],
        "useful_new_tokens": useful,
        "slots": BATCH,
        "timings": summary,
        "useful_new_tokens_per_s": tps,
        "speedup_vs_peer": tps["ours"] / tps[peer_name],
        "recompiles_during_timing": sum(engine.compile_counts.values()) - compiles_before,
    }


def main(argv=None):
    from experiments.benchmarks.peer_process import PeerProcess, tunix_python

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mixed-requests", type=int, default=48)
    parser.add_argument("--steps-per-call", type=int, default=16)
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args(argv)
    config = Qwen3Config.preset("demo")
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    # The same weights stored in bf16, computing in bf16 with float32 accumulation.
    bf16_config = config.replace(param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    bf16_model = nnx.merge(
        nnx.graphdef(Qwen3ForCausalLM(bf16_config, rngs=nnx.Rngs(0))),
        jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model)),
    )
    models = {"ours": model, "ours_bf16": bf16_model}
    hf_dir = tempfile.TemporaryDirectory()
    save_hf_checkpoint(model, config, hf_dir.name)
    peer = HFPeer(hf_dir.name)
    engine_config = JaxEngineConfig(
        max_batch_size=BATCH, max_seq_len=512, steps_per_call=args.steps_per_call
    )
    engines = {name: JaxEngine(m, engine_config) for name, m in models.items()}
    tunix = PeerProcess.start(
        tunix_python(),
        "experiments.benchmarks.tunix_peer",
        ["decode", "--batch", str(BATCH), "--prompt-len", str(PROMPT_LEN)]
        + ["--new-tokens", str(NEW_TOKENS)],
    )
    rng = np.random.default_rng(0)
    # torch's default (one thread per core) collapses when the machine is shared
    # (spinning OpenMP barriers); one thread is often faster here, so time both.
    peer_threads = sorted({1, peer.default_threads})
    try:
        fixed = fixed_batch(engines, peer, rng, args.repeats, peer_threads, tunix)
        best_threads = int(fixed["best_peer"].split("_")[1])
        mixed = mixed_lengths(
            engines["ours"], peer, rng, args.repeats, args.mixed_requests, best_threads
        )
    finally:
        tunix.close()
        peer.close()
        hf_dir.cleanup()
    result = {
        "model": "Qwen3 demo shape, random weights (identical on every side)",
        "engine": {
            "max_batch_size": BATCH,
            "max_seq_len": 512,
            "steps_per_call": args.steps_per_call,
            "kv_cache_dtype": "float32 (the CPU default, also with bf16 weights)",
        },
        "peer": f"transformers {peer.info.get('transformers')} generate, "
        f"torch {peer.info.get('torch')}",
        "peer_python": peer.info.get("python"),
        "fixed_batch": fixed,
        "mixed_lengths": mixed,
        "compile_counts": {n: dict(e.compile_counts) for n, e in engines.items()},
        "jax_backend": jax.default_backend(),
    }
    for e in engines.values():
        e.close()
    if not args.skip_sweep:
        result["batch_sweep"] = batch_sweep(models, rng, args.repeats, args.steps_per_call)
    path = common.write_result("decode", result)
    fb, ml = result["fixed_batch"], result["mixed_lengths"]
    rates = ", ".join(f"{k} {v:.0f}" for k, v in fb["new_tokens_per_s"].items())
    print(f"fixed batch new tok/s: {rates}; x{fb['speedup_vs_best_peer']:.2f} vs {fb['best_peer']}")
    print(f"bf16 / float32: {fb['bf16_over_float32']:.2f}")
    rates = ", ".join(f"{k} {v:.0f}" for k, v in ml["useful_new_tokens_per_s"].items())
    print(f"mixed lengths useful tok/s: {rates}; x{ml['speedup_vs_peer']:.2f}")
    for rows, rates in result.get("batch_sweep", {}).get("new_tokens_per_s", {}).items():
        print(f"batch {rows}: " + ", ".join(f"{k} {v:.2f}" for k, v in rates.items()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
