"""The float32 learner step with alternative formulations of its slow pieces, against itself.

    python -m experiments.benchmarks.learner_code_variants [--repeats 8] [--variants NAME ...]

Each variant is `learner_step`'s plain float32 step (demo shape, 16 x 256)
traced with one piece of the model or loss replaced for the duration of its
compile; all variants are timed round robin in one process:

* baseline: the code as it is.
* loss_where: cross-entropy as logsumexp(logits) - the target's logit picked by
  a `where` over the vocabulary (its gradient is elementwise) instead of
  optax's `take_along_axis` (whose gradient is a scatter into [tokens, vocab]).
* dense_barrier: every float32 `matmul.dense` with a custom VJP whose incoming
  cotangent passes an `optimization_barrier`, so XLA cannot fuse the producer
  of the cotangent (e.g. SiLU's backward) into the transposed copy that the
  weight-gradient matmul reads.
* dense_x_first / dense_g_first: the same custom VJP without the barrier, the
  weight gradient as xᵀ·g or as (gᵀ·x)ᵀ (XLA's CPU layouts decide whether a
  [tokens, out] operand is copied transposed first).
* dense_autodiff: `matmul.dense` as autodiff of one dot (its float32 path before
  it took the custom VJP that the baseline runs).
* mlp_fused: gate and up projections as one matmul against the two kernels
  concatenated ([E, 2F]), split after.
* qkv_fused: q, k and v projections as one matmul ([E, (H + 2K) D]), split after.
* mlp_qkv_fused: both.
* attention_xla: the "xla" attention (all scores at once, autodiff) instead of
  "flash" (what "auto" runs on CPU: blocked, with a recomputing backward).
* highest_precision: the step under `jax.default_matmul_precision("highest")`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.benchmarks import common
from experiments.benchmarks.learner_step import BATCH, SEQ, jax_step_parts
from orchestra_jax.models import matmul
from orchestra_jax.models.attention_kernels import get_attention, xla_attention
from orchestra_jax.models.qwen3 import attention as qwen3_attention
from orchestra_jax.models.qwen3 import layers as qwen3_layers
from orchestra_jax.models.qwen3.attention import Attention
from orchestra_jax.models.qwen3.layers import apply_rope
from orchestra_jax.models.qwen3.model import Qwen3Config


def _xent_where(logits, labels):
    """Per-token cross-entropy with the target logit picked by a `where` (no gather)."""
    vocab = jnp.arange(logits.shape[-1])
    picked = jnp.sum(jnp.where(vocab == labels[..., None], logits, 0.0), axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - picked


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dense_vjp(x, w, w_t, how):
    dims = (((x.ndim - 1,), (1 if w_t else 0,)), ((), ()))
    return jax.lax.dot_general(x, w, dims)


def _dense_vjp_fwd(x, w, w_t, how):
    return _dense_vjp(x, w, w_t, how), (x, w)


def _dense_vjp_bwd(w_t, how, residuals, g):
    """dx = g·Wᵀ; the weight gradient from one dot over the token axes, as `how` says:
    "barrier" (g behind an optimization_barrier, dot as autodiff writes it), "x_first"
    (xᵀ·g, transposed after when w_t) or "g_first" (gᵀ·x, transposed after unless w_t)."""
    x, w = residuals
    if how == "barrier":
        g = jax.lax.optimization_barrier(g)
    lead = x.ndim - 1
    dx = jax.lax.dot_general(g, w, (((lead,), (0 if w_t else 1,)), ((), ())))
    axes = ((tuple(range(lead)), tuple(range(lead))), ((), ()))
    x_first = how == "x_first" or (how == "barrier" and not w_t)
    if x_first:
        dw = jax.lax.dot_general(x, g, axes)  # [in, out]
        return dx, dw.T if w_t else dw
    dw = jax.lax.dot_general(g, x, axes)  # [out, in]
    return dx, dw if w_t else dw.T


_dense_vjp.defvjp(_dense_vjp_fwd, _dense_vjp_bwd)


def _dense_replacement(how: str):
    def dense(x, w, dtype, *, out_dtype=None, w_t=False):
        out = _dense_vjp(x.astype(jnp.float32), w.astype(jnp.float32), w_t, how)
        return out.astype(out_dtype or dtype)

    return dense


def _patched(obj, name, value):
    @contextlib.contextmanager
    def context():
        old = getattr(obj, name)
        setattr(obj, name, value)
        try:
            yield
        finally:
            setattr(obj, name, old)

    return context()


def _mlp_fused(self, x):
    kernel = jnp.concatenate([self.gate_proj.kernel[...], self.up_proj.kernel[...]], axis=1)
    gate, up = jnp.split(matmul.dense(x, kernel, self.gate_proj.dtype), 2, axis=-1)
    return self.down_proj(jax.nn.silu(gate) * up)


def _attention_qkv_fused(self, x, cos, sin, mask, cache=None):
    """`Attention.__call__` without a cache, q, k and v from one matmul."""
    assert cache is None
    b, t, _ = x.shape
    h, k, d = self.num_heads, self.num_kv_heads, self.head_dim
    kernels = [self.q_proj.kernel[...], self.k_proj.kernel[...], self.v_proj.kernel[...]]
    qkv = matmul.dense(x, jnp.concatenate(kernels, axis=1), self.q_proj.dtype)
    q, key, v = jnp.split(qkv, [h * d, (h + k) * d], axis=-1)
    q = apply_rope(self.q_norm(q.reshape(b, t, h, d)), cos, sin)
    key = apply_rope(self.k_norm(key.reshape(b, t, k, d)), cos, sin)
    v = v.reshape(b, t, k, d)
    out = get_attention(self.attention)(
        q,
        key.transpose(0, 2, 1, 3),
        v.transpose(0, 2, 1, 3),
        mask,
        self_attention=True,
        block_size=self.block_size,
    )
    return self.o_proj(out.reshape(b, t, h * d)), None, None


def _all_fused():
    stack = contextlib.ExitStack()
    stack.enter_context(_patched(qwen3_layers.MLP, "__call__", _mlp_fused))
    stack.enter_context(_patched(Attention, "__call__", _attention_qkv_fused))
    return stack


def _dense_autodiff(x, w, dtype, *, out_dtype=None, w_t=False):
    """`matmul.dense` in float32 as it was before its custom VJP: autodiff of one dot."""
    dims = (((x.ndim - 1,), (1 if w_t else 0,)), ((), ()))
    return jax.lax.dot_general(x, w, dims).astype(out_dtype or dtype)


VARIANTS = {
    "baseline": contextlib.nullcontext,
    "loss_where": lambda: _patched(optax, "softmax_cross_entropy_with_integer_labels", _xent_where),
    "dense_barrier": lambda: _patched(qwen3_layers, "dense", _dense_replacement("barrier")),
    "dense_x_first": lambda: _patched(qwen3_layers, "dense", _dense_replacement("x_first")),
    "dense_g_first": lambda: _patched(qwen3_layers, "dense", _dense_replacement("g_first")),
    "dense_autodiff": lambda: _patched(qwen3_layers, "dense", _dense_autodiff),
    "mlp_fused": lambda: _patched(qwen3_layers.MLP, "__call__", _mlp_fused),
    "qkv_fused": lambda: _patched(Attention, "__call__", _attention_qkv_fused),
    "mlp_qkv_fused": _all_fused,
    "attention_xla": lambda: _patched(qwen3_attention, "get_attention", lambda name: xla_attention),
    "highest_precision": lambda: jax.default_matmul_precision("highest"),
}


def main(repeats: int, names: list[str]) -> None:
    config = Qwen3Config.preset("demo")
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (BATCH, SEQ + 1))
    fns, losses = {}, {}
    for name in ["baseline", *(n for n in names if n != "baseline")]:
        context = VARIANTS[name]
        train_step, state, batch = jax_step_parts(config, tokens)
        with context():  # the replacement is live while the step is traced and compiled
            state, loss = train_step(state, *batch)
        losses[name] = float(loss)
        holder = {"state": state}

        def run(holder=holder, train_step=train_step, batch=batch, context=context):
            with context():  # a context that is part of jit's cache key must be live every call
                holder["state"], value = train_step(holder["state"], *batch)
            value.block_until_ready()

        fns[name] = run
    summary = common.summarize(common.alternate_timings(fns, repeats, warmup=2))
    base = summary["baseline"]["median_s"]
    results = {
        name: {
            "ms": s["median_s"] * 1e3,
            "tokens_per_s": BATCH * SEQ / s["median_s"],
            "speed_over_baseline": base / s["median_s"],
            "max_over_min": s["max_s"] / s["min_s"],
            "first_loss": losses[name],
        }
        for name, s in summary.items()
    }
    path = common.write_result("learner_code_variants", {"variants": results})
    for name, r in results.items():
        print(
            f"{name:18s} {r['ms']:7.1f} ms  {r['speed_over_baseline']:.3f}x  "
            f"loss {r['first_loss']:.6f}  max/min {r['max_over_min']:.2f}"
        )
    print("->", path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args()
    main(args.repeats, args.variants)
