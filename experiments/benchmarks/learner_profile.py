"""Where the float32 learner step's time goes: ours (XLA CPU) against Hugging Face (PyTorch CPU).

    python -m experiments.benchmarks.learner_profile [--steps 5]     # profile + matmul table
    python -m experiments.benchmarks.learner_profile --variants      # XLA flag variants
    python -m experiments.benchmarks.learner_profile serve           # worker (one step a request)

The step is `learner_step`'s plain float32 one (cross-entropy + AdamW, demo
shape, batch 16 x 256). Reported, all per step:

* ours: the time of every XLA thunk (one fused HLO op) from a `jax.profiler`
  trace of `--steps` steps, each put in a category by the Python functions that
  emitted it (the HLO's stack frames) and by whether it is a backward op
  (`transpose(jvp…)` in its op name); a dot is any op whose fused body has a
  `dot`. Also the phases: forward, forward + backward, whole step (separately
  jitted, timed round robin).
* HF: the self CPU time of every `torch.profiler` event, in the same
  categories, the phase (forward, backward, optimizer) from the
  `record_function` span it ran under; and the phases' wall times.
* matmuls: float32 GFLOP/s of `jnp.dot` (jitted) against `torch.mm` at the
  step's own matmul shapes (forward x·W, backward g·Wᵀ and xᵀ·g), round robin.

Op times on the two sides are CPU seconds of ops that may run on both cores at
once (XLA runs independent thunks concurrently; torch splits each op over its
threads), so a category's share, not its absolute sum, compares with wall time.

`--variants` runs the whole step in one worker process per XLA_FLAGS setting
(`VARIANTS`), a default-flags worker among them, timed round robin.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.benchmarks import common
from experiments.benchmarks.learner_step import BATCH, SEQ, jax_step_parts
from experiments.benchmarks.xla_trace import HloOp, hlo_ops, trace_thunk_seconds
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM

CATEGORIES = (
    "matmul (q/k/v/o, MLP)",
    "attention",
    "norms, RoPE, SiLU, residual",
    "LM head + loss",
    "embedding",
    "optimizer",
    "other",
)

# XLA_FLAGS settings timed against the default (`--variants`); each exists in jax 0.10.2.
VARIANTS = {
    "default": "",
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn_custom_call": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true",
    "no_ynn_fusion": "--xla_cpu_experimental_ynn_fusion_type=",
    "xnn_dot": "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_experimental_xnn_fusion_type=dot",
    "fast_math": "--xla_cpu_enable_fast_math=true",
    "no_multi_thread_eigen": "--xla_cpu_multi_thread_eigen=false",
    "vector_width_512": "--xla_cpu_prefer_vector_width=512",
    "ynn_dot_eltwise_reduce": "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce",
}


# ---------------------------------------------------------------------------- ours: HLO ops


def ours_category(op: HloOp) -> str:
    """`CATEGORIES` entry of one of our HLO ops, from the functions that emitted it."""
    f = set(op.functions)
    if f & {"flash_attention", "_flash_fwd", "_forward", "_scores", "grouped_attention"}:
        return "attention"
    if "Embed.attend" in f or (op.functions and op.functions[-1].endswith("loss_fn")):
        return "LM head + loss"
    if "Embed.__call__" in f:
        return "embedding"
    if op.is_dot and "Linear.__call__" in f:
        return "matmul (q/k/v/o, MLP)"
    if f & {
        "RMSNorm.__call__",
        "apply_rope",
        "rope_tables",
        "MLP.__call__",
        "DecoderLayer.__call__",
    }:
        if "Attention.__call__" in f and not f & {"RMSNorm.__call__", "apply_rope"}:
            return "attention"  # q/k/v/o reshapes and transposes to and from the head layout
        return "norms, RoPE, SiLU, residual"
    if op.functions and op.functions[-1].endswith("<locals>.step"):
        return "optimizer"  # ops of the step body outside the loss: the AdamW update
    return "other"


def ours_profile(config: Qwen3Config, tokens: np.ndarray, steps: int) -> dict:
    """Our step's thunk times by category (forward / backward), dot time, and phase times."""
    train_step, state, batch = jax_step_parts(config, tokens)
    ops = hlo_ops(train_step.lower(state, *batch).compile().as_text())
    holder = {"state": state}

    def run():
        holder["state"], loss = train_step(holder["state"], *batch)
        loss.block_until_ready()

    for _ in range(2):
        run()
    thunks = trace_thunk_seconds(run, steps)
    table: dict[str, dict[str, float]] = {c: {"forward": 0.0, "backward": 0.0} for c in CATEGORIES}
    dots = {"dot": 0.0, "not dot": 0.0}
    unmatched = 0.0
    for name, s in thunks.items():
        op = ops.get(name)
        if op is None:
            unmatched += s  # runtime bookkeeping events, not HLO ops
            continue
        table[ours_category(op)]["backward" if op.backward else "forward"] += s
        dots["dot" if op.is_dot else "not dot"] += s
    top = sorted(((s, n) for n, s in thunks.items() if n in ops), reverse=True)[:25]
    return {
        "ms_by_category": _ms(table),
        "ms_dot_vs_rest": {k: v * 1e3 for k, v in dots.items()},
        "ms_bookkeeping_events": unmatched * 1e3,
        "top_ops_ms": [
            {"op": n, "ms": s * 1e3, "category": ours_category(ops[n]), "dot": ops[n].is_dot}
            for s, n in top
        ],
    }


def ours_phases(config: Qwen3Config, tokens: np.ndarray, repeats: int) -> dict[str, float]:
    """Median ms of our forward (loss), forward + backward, and whole step, round robin."""
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    ids, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)

    def loss(params):
        logits = nnx.merge(graphdef, params)(ids, positions)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    forward, forward_backward = jax.jit(loss), jax.jit(jax.value_and_grad(loss))
    train_step, state, batch = jax_step_parts(config, tokens)
    holder = {"state": state}

    def step():
        holder["state"], value = train_step(holder["state"], *batch)
        value.block_until_ready()

    fns = {
        "forward": lambda: forward(params).block_until_ready(),
        "forward_backward": lambda: jax.block_until_ready(forward_backward(params)),
        "step": step,
    }
    timings = common.alternate_timings(fns, repeats, warmup=2)
    return {k: float(np.median(v)) * 1e3 for k, v in timings.items()}


# ---------------------------------------------------------------------------- HF: torch ops

_TORCH_ATTENTION = ("scaled_dot_product", "flash_attention", "aten::bmm", "softmax_backward")
_TORCH_LOSS = ("log_softmax", "nll_loss", "cross_entropy")
_TORCH_NORMS = (
    "aten::mul", "aten::add", "aten::pow", "aten::mean", "aten::rsqrt", "aten::silu",
    "aten::neg", "aten::cat", "aten::sum", "aten::div", "aten::sigmoid", "aten::cos",
    "aten::sin", "silu_backward", "aten::to", "aten::_to_copy", "aten::copy_",
)  # fmt: skip
_LM_HEAD_ELEMENTS = BATCH * SEQ * 4096  # a [tokens, vocab] operand: the LM head's matmuls


def torch_category(name: str, shapes, phase: str) -> str:
    """`CATEGORIES` entry of one torch profiler event (its self time)."""
    if phase == "optimizer":
        return "optimizer"
    if any(k in name for k in _TORCH_LOSS):  # before attention: `_log_softmax_backward_data`
        return "LM head + loss"
    if any(k in name for k in _TORCH_ATTENTION):
        return "attention"
    if name in ("aten::mm", "aten::addmm"):
        dims = [s for s in shapes if len(s) == 2]
        if len(dims) >= 2:
            (m, _), (_, n) = dims[-2], dims[-1]
            if m * n >= _LM_HEAD_ELEMENTS or any(a * b >= _LM_HEAD_ELEMENTS for a, b in dims):
                return "LM head + loss"
        return "matmul (q/k/v/o, MLP)"
    if "embedding" in name:
        return "embedding"
    if name.startswith(_TORCH_NORMS):
        return "norms, RoPE, SiLU, residual"
    return "other"


def hf_profile(config: Qwen3Config, tokens: np.ndarray, steps: int) -> dict:
    """HF's step: self CPU time by category and phase (torch.profiler), and phase wall times."""
    import torch
    import transformers

    torch.manual_seed(0)
    hf_config = transformers.Qwen3Config(
        **{k: v for k, v in config.to_hf_dict().items() if k not in ("architectures", "model_type")}
    )
    model = transformers.Qwen3ForCausalLM(hf_config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, labels = torch.tensor(tokens[:, :-1]), torch.tensor(tokens[:, 1:])
    walls: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}

    def step(record: bool):
        marks = [time.perf_counter()]
        with torch.profiler.record_function("phase:forward"):
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        marks.append(time.perf_counter())
        with torch.profiler.record_function("phase:backward"):
            loss.backward()
        marks.append(time.perf_counter())
        with torch.profiler.record_function("phase:optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        if record:
            for key, a, b in zip(walls, marks, marks[1:]):
                walls[key].append(b - a)

    for _ in range(2):
        step(record=False)
    for _ in range(steps):
        step(record=True)
    table: dict[str, dict[str, float]] = {
        c: {"forward": 0.0, "backward": 0.0, "optimizer": 0.0} for c in CATEGORIES
    }
    by_op: dict[str, float] = collections.defaultdict(float)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        for _ in range(steps):
            step(record=False)
    for event in prof.events():
        if event.name.startswith("phase:"):
            continue
        phase, parent = "backward", event.cpu_parent  # autograd runs outside the span's thread
        while parent is not None:
            if parent.name.startswith("phase:"):
                phase = parent.name.split(":")[1]
                break
            parent = parent.cpu_parent
        seconds = event.self_cpu_time_total * 1e-6 / steps
        shapes = [s for s in getattr(event, "input_shapes", None) or [] if s]
        table[torch_category(event.name, shapes, phase)][phase] += seconds
        by_op[event.name] += seconds
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:25]
    return {
        "attn_implementation": model.config._attn_implementation,
        "ms_by_category": _ms(table),
        "ms_phases_wall": {k: float(np.median(v)) * 1e3 for k, v in walls.items()},
        "top_ops_ms": [{"op": n, "ms": s * 1e3} for n, s in top],
    }


def _ms(table: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {c: {p: s * 1e3 for p, s in row.items()} for c, row in table.items()}


# ---------------------------------------------------------------------------- matmul peak


def step_matmuls(c: Qwen3Config, tokens: int) -> dict[str, tuple[int, int, int, str]]:
    """The step's matmul shapes: label -> (m, k, n, form); form "nn" is [m,k]·[k,n], "nt"
    [m,k]·[n,k]ᵀ, "tn" [k,m]ᵀ·[k,n] (a weight gradient xᵀ·g)."""
    e, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
    q = c.num_attention_heads * c.head_dim
    kv = c.num_key_value_heads * c.head_dim
    return {
        "q/o x·W": (tokens, e, q, "nn"),
        "k/v x·W": (tokens, e, kv, "nn"),
        "gate/up x·W": (tokens, e, f, "nn"),
        "gate/up x·Wᵀ (torch's layout)": (tokens, e, f, "nt"),
        "gate+up fused x·W": (tokens, e, 2 * f, "nn"),
        "down x·W": (tokens, f, e, "nn"),
        "gate/up dx = g·Wᵀ": (tokens, f, e, "nt"),
        "gate/up dW = xᵀ·g": (e, tokens, f, "tn"),
        "down dW = xᵀ·g": (f, tokens, e, "tn"),
        "LM head x·Eᵀ": (tokens, e, v, "nt"),
        "LM head dx = g·E": (tokens, v, e, "nn"),
        "LM head dE = gᵀ·x": (v, tokens, e, "tn"),
        "square 2048": (2048, 2048, 2048, "nn"),
    }


def matmul_rates(shapes: dict[str, tuple[int, int, int, str]], repeats: int) -> dict:
    """GFLOP/s of jnp.dot (jitted) and torch.mm at each shape, float32, round robin."""
    import torch

    rng = np.random.RandomState(0)
    fns, flops = {}, {}
    for label, (m, k, n, form) in shapes.items():
        a_shape = (k, m) if form == "tn" else (m, k)
        b_shape = (n, k) if form == "nt" else (k, n)
        a_np = rng.randn(*a_shape).astype(np.float32)
        b_np = rng.randn(*b_shape).astype(np.float32)
        dims = {"nn": ((1,), (0,)), "nt": ((1,), (1,)), "tn": ((0,), (0,))}[form]
        mm = jax.jit(lambda a, b, d=dims: jax.lax.dot_general(a, b, (d, ((), ()))))
        a_j, b_j = jnp.asarray(a_np), jnp.asarray(b_np)
        a_t, b_t = torch.from_numpy(a_np), torch.from_numpy(b_np)
        a_t = a_t.t() if form == "tn" else a_t
        b_t = b_t.t() if form == "nt" else b_t
        fns[f"jax|{label}"] = lambda f=mm, a=a_j, b=b_j: f(a, b).block_until_ready()
        fns[f"torch|{label}"] = lambda a=a_t, b=b_t: torch.mm(a, b)
        flops[label] = 2.0 * m * k * n
    timings = common.alternate_timings(fns, repeats, warmup=2)
    out = {}
    for label, fl in flops.items():
        jax_rate = fl / float(np.median(timings[f"jax|{label}"])) / 1e9
        torch_rate = fl / float(np.median(timings[f"torch|{label}"])) / 1e9
        out[label] = {
            "shape": shapes[label],
            "jax_gflops": jax_rate,
            "torch_gflops": torch_rate,
            "jax_over_torch": jax_rate / torch_rate,
        }
    return out


# ---------------------------------------------------------------------------- XLA flag variants


def serve() -> None:
    """Worker: our float32 step under this process's XLA_FLAGS, one step per request."""
    from experiments.benchmarks.learner_step import make_jax_step
    from experiments.benchmarks.peer_process import serve as serve_steps

    config = Qwen3Config.preset("demo")
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (BATCH, SEQ + 1))
    run, _ = make_jax_step(config, tokens)
    serve_steps(run, {"xla_flags": os.environ.get("XLA_FLAGS", "")})


def flag_variants(repeats: int) -> dict:
    """Median step ms of each `VARIANTS` worker, timed round robin; failures say why."""
    from experiments.benchmarks.peer_process import PeerProcess

    peers, seconds, failed = {}, {}, {}
    for name, flags in VARIANTS.items():
        peer = PeerProcess.start(
            sys.executable,
            "experiments.benchmarks.learner_profile",
            ["serve"],
            env={"XLA_FLAGS": flags},
        )
        if peer.available:
            peers[name], seconds[name] = peer, []
        else:
            failed[name] = peer.reason
    fns = {name: (lambda p=p, s=seconds[name]: s.append(p.step())) for name, p in peers.items()}
    try:
        common.alternate_timings(fns, repeats, warmup=2)
    finally:
        for peer in peers.values():
            peer.close()
    base = float(np.median(seconds["default"][-repeats:]))
    out = {}
    for name, s in seconds.items():
        median = float(np.median(s[-repeats:]))
        out[name] = {
            "xla_flags": VARIANTS[name],
            "ms": median * 1e3,
            "tokens_per_s": BATCH * SEQ / median,
            "speed_over_default": base / median,
            "max_over_min": max(s[-repeats:]) / min(s[-repeats:]),
        }
    return {"variants": out, "failed": failed}


# ---------------------------------------------------------------------------- main


def _print_table(ours: dict, hf: dict) -> None:
    print(
        f"{'category':32s} {'ours fwd':>9s} {'ours bwd':>9s} {'HF fwd':>9s} {'HF bwd':>9s} {'HF opt':>9s}"
    )
    for c in CATEGORIES:
        o, h = ours["ms_by_category"][c], hf["ms_by_category"][c]
        row = [o["forward"], o["backward"], h["forward"], h["backward"], h["optimizer"]]
        print(f"{c:32s} " + " ".join(f"{x:9.1f}" for x in row))


def main(steps: int, repeats: int) -> None:
    config = Qwen3Config.preset("demo")
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (BATCH, SEQ + 1))
    ours = ours_profile(config, tokens, steps)
    ours["ms_phases"] = ours_phases(config, tokens, repeats)
    hf = hf_profile(config, tokens, steps)
    matmuls = matmul_rates(step_matmuls(config, BATCH * SEQ), repeats)
    payload = {"config": "demo", "batch": BATCH, "seq_len": SEQ, "dtype": "float32"}
    payload.update(ours=ours, hf=hf, matmuls=matmuls)
    path = common.write_result("learner_profile", payload)
    _print_table(ours, hf)
    print("ours phases ms:", {k: round(v, 1) for k, v in ours["ms_phases"].items()})
    print("ours dot / rest ms:", {k: round(v, 1) for k, v in ours["ms_dot_vs_rest"].items()})
    print("HF phases ms:", {k: round(v, 1) for k, v in hf["ms_phases_wall"].items()})
    for label, r in matmuls.items():
        print(
            f"{label:30s} jax {r['jax_gflops']:6.1f}  torch {r['torch_gflops']:6.1f} GFLOP/s"
            f"  ({r['jax_over_torch']:.2f}x)"
        )
    print("->", path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=["profile", "serve"], default="profile")
    parser.add_argument("--steps", type=int, default=5, help="steps traced / profiled")
    parser.add_argument("--repeats", type=int, default=8, help="round-robin repeats of timings")
    parser.add_argument("--variants", action="store_true", help="time the XLA_FLAGS variants")
    args = parser.parse_args()
    if args.mode == "serve":
        serve()
    elif args.variants:
        result = flag_variants(args.repeats)
        path = common.write_result("learner_profile_variants", result)
        for name, r in result["variants"].items():
            print(f"{name:24s} {r['ms']:7.1f} ms  {r['speed_over_default']:.3f}x  {r['xla_flags']}")
        print("failed:", result["failed"] or "none", "->", path)
    else:
        main(args.steps, args.repeats)
