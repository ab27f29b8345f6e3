"""One command for a freshly lent GPU: learner MFU, decode against HF, memory plan against peak.

    python -m experiments.benchmarks.accelerator [--budget-s 420] [--dry-run]

Sized for 8 minutes of a fresh H100 or H200 machine, compiles included. Each
cell runs in a subprocess of its own (a clean device: its peak memory is its
own, an out-of-memory or crash loses that cell alone), the most important
first; a cell starts only while the budget has room for it.

1. Learner step (`rl.learner.Learner.train_step`, the GRPO objective, AdamW,
   float32 master weights and optimizer state, bfloat16 compute, scanned layers
   with full remat, chunked LM head, no KL reference) on Qwen3-8B's layer and
   vocabulary dimensions (hidden 4096, 32 heads, 8 KV heads, head_dim 128,
   intermediate 12288, vocab 151,936, untied) with as many layers as the memory
   plan fits beside the optimizer state at the longest sequence. One row of
   8k and of 32k tokens, the last three quarters trained; attention `cudnn`
   against `xla` (at 32k `xla`'s [H, T, T] float32 scores of one layer alone
   exceed the card, so that cell is skipped, saying so). Tokens/s and MFU
   against the card's dense bf16 peak (and against a large bf16 matmul measured
   in the same cell), with FLOPs = 6 x tokens x matmul weights + 6 x H x T^2 x D
   x layers (causal attention: half the score matrix).
2. Decode: `JaxEngine` on a Qwen3-0.6B-shaped random model (bf16 weights and
   KV cache) at batch 64 and 256, 128-token prompts, 256 new tokens sampled at
   temperature 1 with no stop, against Hugging Face `generate` with a static
   cache on the same GPU and the same weights (exported by the JAX cell,
   loaded in bf16). Output tokens/s. The two run one after the other (each in
   its own process), not alternated: a dedicated GPU has little background load.
3. Memory: the plan's per-device prediction (`rl/memory_plan.py`) for
   each learner cell against the device's measured peak (`memory_stats()`).

Writes `accelerator.json` under $OUT when set (the device tool's output folder),
else under experiments/benchmarks/results/. `--dry-run` runs each kind of cell on the
CPU at tiny shapes ("flash" stands in for "cudnn"); tests run it.

Imports only JAX, Flax, optax, numpy (and torch + transformers in the HF
cell): the device image lacks ml-collections and Grain. What must travel as
wheels is listed in `accelerator_wheels.txt` beside this file, with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

# The card's dense bf16 tensor-core peak (NVIDIA's data sheets, SXM parts, no sparsity).
BF16_PEAK_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}
# The share of device memory JAX may take (launch/gpu_node.sh; the plan's usable_fraction).
MEM_FRACTION = "0.9"
PROMPT_LEN, NEW_TOKENS = 128, 256


# -- shapes ---------------------------------------------------------------------------


def learner_cells(dry: bool) -> list[dict[str, Any]]:
    if dry:
        return [dict(seq=64, attention="flash"), dict(seq=64, attention="xla")]
    return [
        dict(seq=8192, attention="cudnn"),
        dict(seq=32768, attention="cudnn"),
        dict(seq=8192, attention="xla"),
        dict(seq=32768, attention="xla"),
    ]


def learner_model_config(dry: bool, layers: int, attention: str):
    import jax.numpy as jnp

    from orchestra_jax.models.qwen3.config import Qwen3Config

    runtime = dict(
        param_dtype=jnp.float32,
        dtype=jnp.bfloat16,
        scan_layers=True,
        remat="full",
        attention=attention,
        num_hidden_layers=layers,
    )
    return Qwen3Config.preset("tiny" if dry else "qwen3_8b", **runtime)


def learner_config():
    from orchestra_jax.rl.learner import LearnerConfig

    return LearnerConfig(learning_rate=1e-6, kl_coef=0.0, master_dtype="float32")


def step_shape(seq: int):
    from orchestra_jax.rl.memory_plan import StepShape

    return StepShape(
        rows=1, seq_len=seq, loss_tokens=seq - seq // 4, step_rows=1, kl_reference=False
    )


def plan_bytes(dry: bool, layers: int, seq: int, attention: str) -> dict[str, int]:
    """The memory plan's items for a learner cell. Planned on the CPU, where cuDNN's
    kernel cannot be traced: "cudnn" is planned as "flash" (both keep O(T) residuals)."""
    from orchestra_jax.rl.memory_plan import plan_memory

    planned = "flash" if attention == "cudnn" else attention
    config = learner_model_config(dry, layers, planned)
    return plan_memory(config, {}, learner_config(), step_shape(seq)).items


def choose_layers(dry: bool, usable_bytes: int, seq: int) -> tuple[int, dict[str, int]]:
    """The most layers (of 36) whose planned step at `seq` uses at most 85 % of the usable
    memory (a margin for what XLA's GPU allocator adds), and that plan."""
    if dry:
        return 2, plan_bytes(dry, 2, seq, "flash")
    layers = max_layers(usable_bytes, seq, "flash", 36)
    return layers, plan_bytes(dry, layers, seq, "flash")


def max_layers(usable_bytes: int, seq: int, attention: str, at_most: int) -> int:
    """The most layers (at most `at_most`) whose planned step fits 85 % of usable memory
    (bisection: the plan grows with the layers); at least 1."""
    lo, hi = 1, at_most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(plan_bytes(False, mid, seq, attention).values()) <= 0.85 * usable_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def train_flops(config, seq: int, rows: int = 1) -> float:
    """FLOPs of one training step (forward + backward, no remat recompute counted)."""
    e, d, f = config.hidden_size, config.head_dim, config.intermediate_size
    h, kv, n = config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers
    matmul_weights = n * (e * d * (2 * h + 2 * kv) + 3 * e * f) + e * config.vocab_size
    tokens = rows * seq
    causal_attention = 6.0 * rows * h * seq * seq * d * n
    return 6.0 * tokens * matmul_weights + causal_attention


# -- cells (each runs in its own process) ---------------------------------------------


def _peak_bytes() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _matmul_flops_per_s(n: int) -> float:
    import jax
    import jax.numpy as jnp
    import numpy as np

    a = jnp.asarray(np.random.RandomState(0).randn(n, n), jnp.bfloat16)
    mm = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32))
    mm(a).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        mm(a).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2.0 * n**3 / float(np.median(times))


def run_learner_cell(args: dict[str, Any]) -> dict[str, Any]:
    import jax
    import numpy as np
    from flax import nnx

    from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM
    from orchestra_jax.rl.batching import TrainBatch, loss_positions
    from orchestra_jax.rl.learner import Learner

    dry, seq, layers = args["dry"], args["seq"], args["layers"]
    config = learner_model_config(dry, layers, args["attention"])
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, config.vocab_size, (1, seq + 1))
    mask = np.zeros((1, seq), np.float32)
    mask[:, seq // 4 :] = 1.0
    batch = TrainBatch(
        input_ids=tokens[:, :-1].astype(np.int32),
        positions=np.arange(seq, dtype=np.int32)[None],
        segment_ids=np.ones((1, seq), np.int32),
        target_ids=tokens[:, 1:].astype(np.int32),
        loss_mask=mask,
        advantages=mask.copy(),
        old_logprobs=(np.log(1.0 / config.vocab_size) * mask).astype(np.float32),
        loss_index=loss_positions(mask),
    )
    start = time.perf_counter()
    learner = Learner(Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), learner_config())
    jax.block_until_ready(learner.params)
    init_s = time.perf_counter() - start
    start = time.perf_counter()
    learner.train_step(batch)
    jax.block_until_ready(learner.params)
    first_s = time.perf_counter() - start
    times = []
    for _ in range(args["repeats"]):
        start = time.perf_counter()
        metrics = learner.train_step(batch)
        jax.block_until_ready(learner.params)
        times.append(time.perf_counter() - start)
    step_s = float(np.median(times))
    flops = train_flops(config, seq)
    out: dict[str, Any] = {
        "layers": layers,
        "seq_len": seq,
        "attention": args["attention"],
        "init_s": init_s,
        "first_step_s": first_s,
        "step_s": times,
        "step_s_median": step_s,
        "tokens_per_s": seq / step_s,
        "step_flops": flops,
        "achieved_flops_per_s": flops / step_s,
        "loss": metrics.get("loss"),
        "peak_bytes_in_use": _peak_bytes(),
        "device_kind": jax.devices()[0].device_kind,
    }
    out["matmul_8192_bf16_flops_per_s"] = _matmul_flops_per_s(256 if dry else 8192)
    return out


def decode_prompts(rows: int, vocab: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(rows)
    return [rng.integers(3, vocab - 1, PROMPT_LEN).tolist() for _ in range(rows)]


def decode_shape(dry: bool) -> tuple[str, tuple[int, ...], int]:
    return ("tiny", (2,), 4) if dry else ("qwen3_0p6b", (64, 256), NEW_TOKENS)


def run_decode_jax_cell(args: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
    from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
    from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
    from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig

    preset, sizes, new = decode_shape(args["dry"])
    config = Qwen3Config.preset(preset, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    save_hf_checkpoint(model, config, args["hf_dir"])
    out: dict[str, Any] = {"preset": preset, "new_tokens": new, "prompt_len": PROMPT_LEN}
    for rows in sizes:
        engine = JaxEngine(
            model,
            JaxEngineConfig(
                max_batch_size=rows,
                max_seq_len=PROMPT_LEN + new,
                steps_per_call=32,
                prefix_cache=False,  # the same prompts repeat: no reuse across calls
                min_prefill_rows=rows,
                cache_dtype="bfloat16",
            ),
        )
        requests = [
            GenerateRequest(p, SamplingParams(temperature=1.0, max_new_tokens=new, seed=i))
            for i, p in enumerate(decode_prompts(rows, config.vocab_size))
        ]

        def run(engine=engine, requests=requests) -> int:
            completions = asyncio.run(engine.generate(requests))
            return sum(c.completion_tokens for c in completions)

        start = time.perf_counter()
        run()
        run()  # the second call compiles the cache resize, if any
        warm_s = time.perf_counter() - start
        times, counts = [], []
        for _ in range(args["repeats"]):
            start = time.perf_counter()
            counts.append(run())
            times.append(time.perf_counter() - start)
        engine.close()
        out[f"b{rows}"] = {
            "warm_s": warm_s,
            "seconds": times,
            "new_tokens": counts,
            "new_tokens_per_s": float(np.median(counts)) / float(np.median(times)),
        }
    out["peak_bytes_in_use"] = _peak_bytes()
    out["device_kind"] = jax.devices()[0].device_kind
    return out


def run_decode_hf_cell(args: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch
    import transformers

    _, sizes, new = decode_shape(args["dry"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(args["hf_dir"], dtype=torch.bfloat16)
    model = model.to(device).eval()
    vocab = model.config.vocab_size
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    for rows in sizes:
        ids = torch.tensor(decode_prompts(rows, vocab), device=device)

        def run(ids=ids) -> int:
            with torch.inference_mode():
                result = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    cache_implementation="static",
                    pad_token_id=0,
                    eos_token_id=None,
                )
            if device == "cuda":
                torch.cuda.synchronize()
            return (result.shape[1] - ids.shape[1]) * ids.shape[0]

        start = time.perf_counter()
        run()
        warm_s = time.perf_counter() - start
        times, counts = [], []
        for _ in range(args["repeats"]):
            start = time.perf_counter()
            counts.append(run())
            times.append(time.perf_counter() - start)
        out[f"b{rows}"] = {
            "warm_s": warm_s,
            "seconds": times,
            "new_tokens": counts,
            "new_tokens_per_s": float(np.median(counts)) / float(np.median(times)),
        }
    return out


CELLS = {
    "learner": run_learner_cell,
    "decode_jax": run_decode_jax_cell,
    "decode_hf": run_decode_hf_cell,
}


# -- the driver -----------------------------------------------------------------------


def _gpu() -> tuple[str, int] | None:
    """(name, total bytes) of the first GPU from nvidia-smi, without touching it from JAX."""
    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    name, mib = text.splitlines()[0].rsplit(",", 1)
    return name.strip(), int(mib) * 2**20


def _peak_flops(device_name: str) -> float | None:
    return next((v for k, v in BF16_PEAK_FLOPS.items() if k in device_name), None)


def _run_cell(name: str, args: dict[str, Any], timeout_s: float, env: dict[str, str]) -> dict:
    """One cell in a subprocess: its JSON result, or {"error": ...} saying why not."""
    result_file = pathlib.Path(args["tmp"]) / f"cell_{time.monotonic_ns()}.json"
    cmd = [
        sys.executable,
        "-m",
        "experiments.benchmarks.accelerator",
        "--cell",
        name,
        "--cell-args",
        json.dumps(args),
        "--cell-result",
        str(result_file),
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout_s, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout_s:.0f} s", "wall_s": timeout_s}
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not result_file.exists():
        tail = (proc.stderr or proc.stdout)[-3000:]
        return {"error": f"exit {proc.returncode}", "log_tail": tail, "wall_s": wall}
    return {**json.loads(result_file.read_text()), "wall_s": wall}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=420.0, help="wall seconds for all cells")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--only", choices=("learner", "decode"), help="run these cells alone")
    parser.add_argument("--out", default=None, help="output folder (default: $OUT or results/)")
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cell-args", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cell-result", default=None, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.cell:  # a child: run one cell, write its result
        result = CELLS[ns.cell](json.loads(ns.cell_args))
        pathlib.Path(ns.cell_result).write_text(json.dumps(result, default=str))
        return result

    import tempfile

    started = time.perf_counter()
    dry = ns.dry_run
    child_env = dict(os.environ)
    child_env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", MEM_FRACTION)
    if dry:
        child_env["JAX_PLATFORMS"] = "cpu"
        child_env["CUDA_VISIBLE_DEVICES"] = ""
    # This process only plans (abstract shapes): it must not take the GPU from the cells.
    os.environ["JAX_PLATFORMS"] = "cpu"
    from experiments.benchmarks import common
    from orchestra_jax.rl.memory_plan import DEVICE_KINDS

    gpu = None if dry else _gpu()
    device_name = gpu[0] if gpu else "cpu"
    memory = gpu[1] if gpu else 16 * 2**30
    usable = int(memory * float(MEM_FRACTION))
    cells = learner_cells(dry)
    layers, plan_at_longest = choose_layers(dry, usable, max(c["seq"] for c in cells))
    payload: dict[str, Any] = {
        "device": device_name,
        "device_memory_bytes": memory,
        "usable_bytes": usable,
        "mem_fraction": MEM_FRACTION,
        "bf16_peak_flops": _peak_flops(device_name),
        "dry_run": dry,
        "layers": layers,
        "plan_at_longest_seq": plan_at_longest,
        "known_device_kinds": sorted(DEVICE_KINDS),
        "learner": {},
        "decode": {},
        "skipped": {},
    }
    out_dir = pathlib.Path(ns.out or os.environ.get("OUT") or common.RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file = out_dir / "accelerator.json"

    def save():
        payload["wall_s"] = time.perf_counter() - started
        payload["machine"] = common.machine_info()
        payload["code"] = common.code_version()
        out_file.write_text(json.dumps(payload, indent=1, default=str))

    def left() -> float:
        return ns.budget_s - (time.perf_counter() - started)

    repeats = 1 if dry else 3
    # xla attention keeps [H, T, T] scores per layer: its cells get the layers its own
    # plan fits (at most the others'), and cudnn is timed again at that depth.
    xla_seq = min(c["seq"] for c in cells if c["attention"] == "xla")
    xla_layers = layers if dry else max_layers(usable, xla_seq, "xla", layers)
    payload["xla_layers"] = xla_layers
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = os.path.join(tmp, "hf")
        jobs: list[tuple[str, str, dict[str, Any], float]] = []
        for cell in cells:
            depth = xla_layers if cell["attention"] == "xla" else layers
            key = f"{cell['attention']}_{cell['seq']}_L{depth}"
            jobs.append(("learner", key, dict(cell, layers=depth, repeats=repeats), 150.0))
        jobs.insert(1, ("decode_jax", "jax", dict(hf_dir=hf_dir, repeats=repeats), 150.0))
        hf_repeats = min(repeats, 2)
        jobs.insert(2, ("decode_hf", "hf", dict(hf_dir=hf_dir, repeats=hf_repeats), 300.0))
        if xla_layers != layers:
            same = dict(cells[0], layers=xla_layers, repeats=repeats)
            jobs.append(
                ("learner", f"{same['attention']}_{same['seq']}_L{xla_layers}", same, 150.0)
            )
        for name, key, args, cap in jobs:
            if ns.only and not name.startswith(ns.only):
                continue
            if name == "learner" and args["attention"] == "xla" and args["seq"] > 16384:
                scores = 4 * 32 * args["seq"] ** 2
                payload["skipped"][key] = (
                    f"xla attention keeps one layer's [H, T, T] float32 scores: "
                    f"{scores / 2**30:.0f} GiB at T={args['seq']}, more than the card"
                )
                continue
            if name == "decode_hf" and "error" in payload["decode"].get("jax", {}):
                payload["skipped"][key] = "the JAX cell, which exports the weights, failed"
                continue
            if left() < 45:
                payload["skipped"][key] = f"budget spent ({ns.budget_s:.0f} s)"
                continue
            print(f"[{time.perf_counter() - started:6.0f} s] {name} {key} ...", flush=True)
            result = _run_cell(name, dict(args, dry=dry, tmp=tmp), min(cap, left()), child_env)
            if name == "learner":
                result["plan"] = plan_bytes(dry, args["layers"], args["seq"], args["attention"])
                result["plan_total"] = sum(result["plan"].values())
                if result.get("peak_bytes_in_use"):
                    result["plan_over_peak"] = result["plan_total"] / result["peak_bytes_in_use"]
                peak = payload["bf16_peak_flops"]
                if peak and "achieved_flops_per_s" in result:
                    result["mfu"] = result["achieved_flops_per_s"] / peak
                payload["learner"][key] = result
            else:
                payload["decode"][key] = result
            brief = {k: v for k, v in result.items() if k not in ("log_tail", "plan")}
            print(json.dumps(brief, default=str)[:700], flush=True)
            if "log_tail" in result:
                print(result["log_tail"][-1500:], flush=True)
            save()
    jax_decode, hf_decode = payload["decode"].get("jax", {}), payload["decode"].get("hf", {})
    payload["decode_ratio_jax_over_hf"] = {
        k: jax_decode[k]["new_tokens_per_s"] / hf_decode[k]["new_tokens_per_s"]
        for k in jax_decode
        if k.startswith("b") and k in hf_decode and "new_tokens_per_s" in hf_decode[k]
    }
    save()
    print(f"wrote {out_file}")
    return payload


if __name__ == "__main__":
    main()
