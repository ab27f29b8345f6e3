"""The learner step and decode under each of XLA's CPU dot back-ends, side by side in one run.

    python -m experiments.benchmarks.cpu_dot_backends [--repeats 5] [--variants default,...]
        [--works learner,decode_demo_f32,...]

jaxlib routes CPU dots (and, since 0.11, reductions and elementwise fusions) to
YNNPACK by default; the other back-ends sit behind XLA flags (`VARIANTS`: the
names come from the strings of jaxlib 0.12.0.1's libraries and XLA's source;
`ynn_no_reduce` is the workaround for the 0.11.x reduce regression, jax-ml/jax
#37465, openxla/xla #46351). One worker process per setting (XLA_FLAGS is read
once, when the backend starts) compiles every workload of `WORKS`, then the
driver asks each worker in turn for one timed run of a workload (round robin
over settings, so they share the machine's load alike; the worker's own timing
of the call, without the pipe). Per workload: medians, each setting's time
over the default's, and which kernels the compiled code calls (the fused op
names in the compiled HLO of the plain learner step and of a decode-shaped
matmul: `__ynn_fusion`, `__xnn_fusion`, oneDNN calls, XLA's own `dot`).

Works: `learner` is `learner_step`'s GRPO `Learner.train_step` (demo shape,
float32, 16 × 256 tokens); `decode_demo_f32` / `decode_demo_bf16` are
`decode`'s fixed batch (JaxEngine, demo shape, 16 prompts × 128 new tokens at
T = 1; bf16 weights with float32 accumulation); `decode_0p6b_f32` the same at
Qwen3-0.6B's dimensions with 4 layers (`decode_vs_vllm`'s shape).

Writes experiments/benchmarks/results/cpu_dot_backends.json (`_py313` under Python 3.13).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

VARIANTS = {
    "default": "",
    "ynn_no_reduce": "--xla_cpu_experimental_ynn_fusion_type=-reduce",
    "eigen": "--xla_cpu_experimental_ynn_fusion_type=",
    "xnn_dot": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_xnnpack=true "
    "--xla_cpu_experimental_xnn_fusion_type=dot",
    "onednn_dot": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true "
    "--xla_cpu_experimental_onednn_fusion_type=dot",
    "onednn_custom_call": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true "
    "--xla_cpu_experimental_onednn_custom_call=true",
}
WORKS = ("learner", "decode_demo_f32", "decode_demo_bf16", "decode_0p6b_f32")
KERNEL_PATTERN = r"(__ynn_fusion|__xnn_fusion|__onednn\$\w+|onednn\w*| dot\()"


def _kernels(hlo_text: str | None) -> dict[str, int]:
    """How often each kind of kernel call appears in compiled HLO text."""
    counts: dict[str, int] = {}
    for kind in re.findall(KERNEL_PATTERN, hlo_text or ""):
        kind = kind.strip(" (")
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _decode_work(shape: str, dtype: str):
    """A zero-argument fixed-batch decode (16 × 128 new tokens) on a fresh JaxEngine, warmed."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from experiments.benchmarks.decode import BATCH, NEW_TOKENS, batch_requests, ours_generate
    from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
    from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig

    if shape == "demo":
        config = Qwen3Config.preset("demo")
    else:
        config = Qwen3Config.preset("qwen3_0p6b", num_hidden_layers=4, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    if dtype == "bfloat16":
        bf16 = config.replace(param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
        model = nnx.merge(
            nnx.graphdef(Qwen3ForCausalLM(bf16, rngs=nnx.Rngs(0))),
            jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model)),
        )
    engine = JaxEngine(model, JaxEngineConfig(max_batch_size=BATCH, max_seq_len=512))
    _, requests = batch_requests(np.random.default_rng(0), BATCH)

    def run():
        tokens = ours_generate(engine, requests)
        assert tokens == BATCH * NEW_TOKENS, tokens
        return {"new_tokens": tokens}

    run()
    run()  # the second call also compiles the cache shrink between runs
    return run


def worker(works: list[str]) -> None:
    """Compile `works` under this process's XLA_FLAGS, announce them, then time one work
    per request line (its name)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from experiments.benchmarks.learner_step import (
        BATCH,
        PRECISIONS,
        SEQ,
        jax_step_parts,
        make_learner_step,
    )
    from orchestra_jax.models.matmul import dense

    try:
        config = PRECISIONS["float32"]
        tokens = np.random.RandomState(0).randint(0, config.vocab_size, (BATCH, SEQ + 1))
        plain, state, batch = jax_step_parts(config, tokens)
        x = jnp.ones((16, 1024), jnp.float32)
        w = jnp.ones((1024, 3072), jnp.float32)
        kernels = {
            "learner_plain_step": _kernels(plain.lower(state, *batch).compile().as_text()),
            "decode_matmul_16x1024x3072": _kernels(
                jax.jit(lambda a, b: dense(a, b, dtype=jnp.float32)).lower(x, w).compile().as_text()
            ),
        }
        del plain, state
        fns = {}
        for work in works:
            if work == "learner":
                step, _ = make_learner_step(config, tokens)
                step()
                step()
                fns[work] = step
            else:
                _, shape, dtype = work.split("_")
                fns[work] = _decode_work(shape, {"f32": "float32", "bf16": "bfloat16"}[dtype])
    except Exception as e:  # an unknown flag or a back-end that cannot compile these
        print(json.dumps({"ready": False, "reason": f"{type(e).__name__}: {e}"[:2000]}), flush=True)
        return
    print(json.dumps({"ready": True, "kernels": kernels}), flush=True)
    for line in sys.stdin:
        work = line.strip()
        if work not in fns:
            continue
        start = time.perf_counter()
        fns[work]()
        print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        worker(argv[1].split(","))
        return
    from experiments.benchmarks import common
    from experiments.benchmarks.peer_process import PeerProcess

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--works", default=",".join(WORKS))
    parser.add_argument(
        "--result-name",
        default="cpu_dot_backends",
        help="results/<name>.json (a partial run's own)",
    )
    args = parser.parse_args(argv)
    names, works = args.variants.split(","), args.works.split(",")
    workers, refused = {}, {}
    load = {"start": common.machine_info().get("load_average_1m")}
    try:
        for name in names:  # one at a time: compiles do not overlap
            started = time.perf_counter()
            peer = PeerProcess.start(
                sys.executable,
                "experiments.benchmarks.cpu_dot_backends",
                ["worker", ",".join(works)],
                env={"XLA_FLAGS": VARIANTS[name]},
            )
            if peer.available:
                workers[name] = peer
                print(
                    f"{name}: ready in {time.perf_counter() - started:.0f} s", peer.info["kernels"]
                )
            else:
                refused[name] = peer.reason
                print(f"{name}: refused: {peer.reason[:300]}")
        seconds: dict[str, dict[str, list[float]]] = {w: {n: [] for n in workers} for w in works}
        for _ in range(args.repeats + 1):  # the first round untimed
            for work in works:
                for name, peer in workers.items():
                    seconds[work][name].append(peer.step(work))
    finally:
        for peer in workers.values():
            peer.close()
    load["end"] = common.machine_info().get("load_average_1m")
    results = {}
    for work in works:
        med = {n: statistics.median(ts[1:]) for n, ts in seconds[work].items()}
        results[work] = {
            "median_s": med,
            "over_default": {n: med[n] / med["default"] for n in med} if "default" in med else {},
            "max_over_min": {n: max(ts[1:]) / min(ts[1:]) for n, ts in seconds[work].items()},
        }
        print(
            work,
            {
                n: f"{m:.3f} s ({results[work]['over_default'].get(n, 0):.2f})"
                for n, m in med.items()
            },
        )
    path = common.write_result(
        args.result_name,
        {
            "repeats": args.repeats,
            "variants": {n: VARIANTS[n] for n in names},
            "kernels": {n: p.info["kernels"] for n, p in workers.items()},
            "refused": refused,
            "load_average_1m": load,
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
