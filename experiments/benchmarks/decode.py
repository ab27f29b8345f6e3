"""Decode throughput: JaxEngine against Hugging Face `generate` (PyTorch CPU), same weights.

    python -m experiments.benchmarks.decode [--repeats 5] [--mixed-requests 48]

1. Fixed batch: 16 prompts x 128 new tokens, sampling at temperature 1 (no
   stop tokens, so both sides generate exactly 128 tokens per row). New tokens/s,
   ours and HF timed alternately in one process, medians and their ratio. HF is
   timed with torch's default threads (one per core) and with one thread: on a
   shared machine the default collapses (spinning OpenMP barriers), so the
   ratio is reported against the faster of the two.
2. Mixed lengths: many requests with random prompt lengths and budgets. Ours
   runs them all through 16 continuously batched slots; the peer is HF
   `generate` (its faster thread setting) over fixed batches of 16 (left-padded,
   each batch runs until its longest budget). Useful (requested) new tokens/s.

The model is the demo Qwen3 shape (vocab 4096, hidden 256, 4 layers, 4 heads,
2 KV heads, head_dim 64, intermediate 768), float32 on both sides. Writes
experiments/benchmarks/results/decode.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile

import jax
import numpy as np
import torch
import transformers
from flax import nnx

from experiments.benchmarks import common
from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
from orchestra_jax.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig

BATCH, NEW_TOKENS, PROMPT_LEN = 16, 128, 32


def hf_model(model, config):
    """The same weights as a transformers Qwen3ForCausalLM (via our HF checkpoint writer)."""
    with tempfile.TemporaryDirectory() as path:
        save_hf_checkpoint(model, config, path)
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_generate(peer, prompts: list[list[int]], max_new: int, seed: int) -> int:
    """HF sampling over one left-padded batch for exactly `max_new` tokens; returns new tokens."""
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


def with_threads(n: int, fn):
    """fn run with torch limited to n intra-op threads."""

    def run():
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            fn()
        finally:
            torch.set_num_threads(before)

    return run


def fixed_batch(engine, peer, rng, repeats, peer_threads):
    prompts = [rng.integers(3, 4000, PROMPT_LEN).tolist() for _ in range(BATCH)]
    sp = [SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=i) for i in range(BATCH)]
    requests = [GenerateRequest(p, s) for p, s in zip(prompts, sp)]
    counts = {}

    def ours():
        counts["ours"] = ours_generate(engine, requests)

    def hf():
        counts["hf"] = hf_generate(peer, prompts, NEW_TOKENS, seed=0)

    ours()  # compile outside the timing; the second call also compiles the cache shrink
    ours()
    compiles_before = sum(engine.compile_counts.values())
    fns = {"ours": ours}
    fns.update({f"hf_{n}_threads": with_threads(n, hf) for n in peer_threads})
    timings = common.alternate_timings(fns, repeats=repeats, warmup=0)
    summary = common.summarize(timings)
    tokens = BATCH * NEW_TOKENS
    assert counts["ours"] == counts["hf"] == tokens
    tps = {k: tokens / summary[k]["median_s"] for k in summary}
    best_peer = max((k for k in tps if k != "ours"), key=tps.get)
    return {
        "shape": {
            "batch": BATCH,
            "prompt_len": PROMPT_LEN,
            "new_tokens": NEW_TOKENS,
            "temperature": 1.0,
        },
        "timings": summary,
        "new_tokens_per_s": tps,
        "best_peer": best_peer,
        "speedup_vs_best_peer": tps["ours"] / tps[best_peer],
        "recompiles_during_timing": sum(engine.compile_counts.values()) - compiles_before,
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

    def hf():
        for start in range(0, n_requests, BATCH):
            hf_generate(
                peer,
                prompts[start : start + BATCH],
                int(budgets[start : start + BATCH].max()),
                seed=start,
            )

    ours()  # compile every bucket this workload reaches; the second run also
    ours()  # compiles the cache shrink between runs
    compiles_before = sum(engine.compile_counts.values())
    peer_name = f"hf_static_batches_{peer_threads}_threads"
    timings = common.alternate_timings(
        {"ours": ours, peer_name: with_threads(peer_threads, hf)}, repeats=repeats, warmup=0
    )
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mixed-requests", type=int, default=48)
    parser.add_argument("--steps-per-call", type=int, default=16)
    args = parser.parse_args(argv)
    config = Qwen3Config.preset("demo")
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    peer = hf_model(model, config)
    engine = JaxEngine(
        model,
        JaxEngineConfig(max_batch_size=BATCH, max_seq_len=512, steps_per_call=args.steps_per_call),
    )
    rng = np.random.default_rng(0)
    # torch's default (one thread per core) collapses when the machine is shared
    # (spinning OpenMP barriers); one thread is often faster here, so time both.
    peer_threads = sorted({1, torch.get_num_threads()})
    fixed = fixed_batch(engine, peer, rng, args.repeats, peer_threads)
    best_threads = int(fixed["best_peer"].split("_")[1])
    result = {
        "model": "Qwen3 demo shape, float32, random weights (identical on both sides)",
        "engine": {
            "max_batch_size": BATCH,
            "max_seq_len": 512,
            "steps_per_call": args.steps_per_call,
        },
        "peer": f"transformers {transformers.__version__} generate, torch {torch.__version__}",
        "fixed_batch": fixed,
        "mixed_lengths": mixed_lengths(
            engine, peer, rng, args.repeats, args.mixed_requests, best_threads
        ),
        "compile_counts": dict(engine.compile_counts),
        "jax_backend": jax.default_backend(),
    }
    engine.close()
    path = common.write_result("decode", result)
    fb, ml = result["fixed_batch"], result["mixed_lengths"]
    rates = ", ".join(f"{k} {v:.0f}" for k, v in fb["new_tokens_per_s"].items())
    print(f"fixed batch new tok/s: {rates}; x{fb['speedup_vs_best_peer']:.2f} vs {fb['best_peer']}")
    rates = ", ".join(f"{k} {v:.0f}" for k, v in ml["useful_new_tokens_per_s"].items())
    print(f"mixed lengths useful tok/s: {rates}; x{ml['speedup_vs_peer']:.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
