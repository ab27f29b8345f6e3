"""Matmuls in a compute dtype that accumulate in float32, forward and backward.

    y = dense(x, w, dtype)          # x [..., in], w [in, out]  -> [..., out]
    y = dense(x, w, dtype, w_t=True) # x [..., in], w [out, in] -> [..., out] (tied head)

Both operands are cast to `dtype` and multiplied with float32 accumulation
(`preferred_element_type`); the result is returned in `out_dtype` (default
`dtype`). The gradient is written out, in every precision:

    dx = (g · wᵀ) in float32, returned in x's dtype
    dw = (xᵀ · g) in float32, returned in w's dtype (float32 master weights keep
         their full-precision gradient); (gᵀ · x) for the tied head's [out, in]

with g the cotangent cast to `dtype`. In a lower precision (bfloat16) autodiff
of the forward alone would multiply a float32 cotangent by a bfloat16 operand,
which XLA runs as a float32 matmul (on CPUs with bf16 arithmetic, half the
speed), and XLA's CPU matmuls with a bfloat16 result are slower than float32
ones: bfloat16 operands with a float32 result are the fast case there, as on
TPUs and GPUs. In float32 the values are autodiff's; the written-out weight
gradient makes XLA's CPU backend read the cotangent as it is, where autodiff's
transposed form had it copy the cotangent transposed first, fused with its
producer (SwiGLU's backward written as a [F, tokens] loop): the demo learner
step runs ~1.2x faster (`docs/notes/2026-11-26-learner-cpu-profile.md`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _contract(x: jax.Array, w: jax.Array, w_t: bool) -> jax.Array:
    """x [..., in] · w ([in, out], or [out, in] when w_t), accumulated in float32."""
    dims = (((x.ndim - 1,), (1 if w_t else 0,)), ((), ()))
    return jax.lax.dot_general(x, w, dims, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _dense(x, w, dtype, out_dtype, w_t, x_dtype, w_dtype):
    del x_dtype, w_dtype
    return _contract(x.astype(dtype), w.astype(dtype), w_t).astype(out_dtype)


def _dense_fwd(x, w, dtype, out_dtype, w_t, x_dtype, w_dtype):
    del x_dtype, w_dtype
    x, w = x.astype(dtype), w.astype(dtype)  # the residuals the backward matmuls read
    return _contract(x, w, w_t).astype(out_dtype), (x, w)


def _dense_bwd(dtype, out_dtype, w_t, x_dtype, w_dtype, residuals, g):
    x, w = residuals
    g = g.astype(dtype)
    lead = x.ndim - 1
    # dx = g · wᵀ: contract g's last axis with w's output axis.
    dx = jax.lax.dot_general(
        g, w, (((lead,), (0 if w_t else 1,)), ((), ())), preferred_element_type=jnp.float32
    )
    # dw = xᵀ · g over every leading axis; [in, out], or [out, in] when w_t.
    axes = tuple(range(lead))
    if w_t:
        dw = jax.lax.dot_general(g, x, ((axes, axes), ((), ())), preferred_element_type=jnp.float32)
    else:
        dw = jax.lax.dot_general(x, g, ((axes, axes), ((), ())), preferred_element_type=jnp.float32)
    return dx.astype(x_dtype), dw.astype(w_dtype)


_dense.defvjp(_dense_fwd, _dense_bwd)


def dense(x: jax.Array, w: jax.Array, dtype, *, out_dtype=None, w_t: bool = False) -> jax.Array:
    """x · w in compute dtype `dtype`, float32 accumulation, result in `out_dtype`
    (default `dtype`); see the module docstring for the gradient."""
    dtype = jnp.dtype(dtype)
    out_dtype = dtype if out_dtype is None else jnp.dtype(out_dtype)
    return _dense(x, w, dtype, out_dtype, w_t, x.dtype, w.dtype)
