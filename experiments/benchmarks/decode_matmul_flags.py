"""The decode step's matmuls under XLA CPU flag settings, one worker process per setting.

    python -m experiments.benchmarks.decode_matmul_flags [--repeats 10] [--batches 16]
        [--dtypes float32,bfloat16] [--variants default,eigen_dot,...]
    python -m experiments.benchmarks.decode_matmul_flags worker <dtype> <rows> <repeats>

Each matmul of `decode_matmuls.shapes` (Qwen3-0.6B's q, k/v, o, gate/up, down and
the tied LM head), jitted as the model runs it (`models/matmul.dense`), is timed
in a fresh process whose XLA_FLAGS is one of `VARIANTS` (flags that exist in
jaxlib 0.10.2, from the strings of its libraries), the default first and again
last so drift shows. Reported per setting: each matmul's median ms and GB/s of
weights read, the sum over one 4-layer decode step, and which kernel the q
matmul compiled to (the fused op's name in the compiled HLO: `__ynn_fusion`,
an Eigen `dot`, a oneDNN or XNNPACK custom call).

Writes experiments/benchmarks/results/decode_matmul_flags.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys

VARIANTS = {
    "default": "",
    "eigen_dot": "--xla_cpu_experimental_ynn_fusion_type=",
    "xnn_dot": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_experimental_xnn_fusion_type=dot",
    "onednn": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true",
    "onednn_fusion_dot": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true "
    "--xla_cpu_experimental_onednn_fusion_type=dot",
    "custom_tiling": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_enable_custom_matmul_tiling=true "
    "--xla_cpu_matmul_tiling_m_dim=16 --xla_cpu_matmul_tiling_n_dim=64 --xla_cpu_matmul_tiling_k_dim=256",
    "single_thread_eigen": "--xla_cpu_multi_thread_eigen=false",
    "ynn_dot_eltwise_reduce": "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce",
}


def worker(dtype: str, rows: int, repeats: int) -> dict:
    """Timings of the decode matmuls in this process (its XLA_FLAGS as set)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from experiments.benchmarks import common
    from experiments.benchmarks.decode_matmuls import LAYERS, shapes
    from orchestra_jax.models.matmul import dense
    from orchestra_jax.models.qwen3.model import Qwen3Config

    jdt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    c = Qwen3Config.preset("qwen3_0p6b")
    rng = np.random.default_rng(0)
    fns, weight_bytes, kernel = {}, {}, {}
    for name, (n_in, n_out, _) in shapes(c).items():
        head = name == "LM head"
        x = jnp.asarray(rng.standard_normal((rows, n_in), np.float32), jdt)
        w = rng.standard_normal((n_out, n_in) if head else (n_in, n_out), np.float32) * 0.02
        w = jnp.asarray(w, jdt)
        f = jax.jit(functools.partial(dense, dtype=jdt, w_t=head))
        text = f.lower(x, w).compile().as_text()
        kinds = re.findall(r"(__ynn_fusion|__xnn_fusion|__onednn\$\w+|onednn\w*| dot\()", text)
        kernel[name] = sorted({k.strip(" (") for k in kinds})
        fns[name] = functools.partial(lambda f, a, b: jax.block_until_ready(f(a, b)), f, x, w)
        weight_bytes[name] = n_in * n_out * jnp.dtype(jdt).itemsize
    timings = common.alternate_timings(fns, repeats, warmup=2)
    ms = {n: s["median_s"] * 1e3 for n, s in common.summarize(timings).items()}
    del LAYERS  # the counts per step come with `shapes`
    return {
        "ms": ms,
        "gb_per_s": {n: weight_bytes[n] / ms[n] / 1e6 for n in ms},
        "step_matmul_ms": sum(ms[n] * count for n, (_, _, count) in shapes(c).items()),
        "kernel": kernel,
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        print(json.dumps(worker(argv[1], int(argv[2]), int(argv[3]))))
        return
    from experiments.benchmarks import common

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batches", default="16")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    names = [n for n in args.variants.split(",") if n != "default"]
    order = ["default", *names, "default"]
    results: dict = {}
    for dtype in args.dtypes.split(","):
        for rows in args.batches.split(","):
            cell = results[f"{dtype}/batch_{rows}"] = {}
            for i, name in enumerate(order):
                env = {**os.environ, "XLA_FLAGS": VARIANTS[name]}
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "experiments.benchmarks.decode_matmul_flags",
                        "worker",
                        dtype,
                        rows,
                        str(args.repeats),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                key = name if i < len(order) - 1 else "default_again"
                if out.returncode != 0:
                    cell[key] = {"flags": VARIANTS[name], "error": out.stderr[-1500:]}
                    print(dtype, rows, key, "failed:", out.stderr[-300:])
                    continue
                cell[key] = {"flags": VARIANTS[name], **json.loads(out.stdout.splitlines()[-1])}
                print(
                    dtype,
                    rows,
                    key,
                    round(cell[key]["step_matmul_ms"], 1),
                    "ms/step",
                    {n: round(v, 2) for n, v in cell[key]["ms"].items()},
                    cell[key]["kernel"]["q"],
                )
    path = common.write_result(
        "decode_matmul_flags", {"repeats": args.repeats, "variants": VARIANTS, "results": results}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
