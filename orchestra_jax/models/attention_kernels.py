"""Attention implementations, picked by `Qwen3Config.attention` (a registry key).

Each takes q [B, T, H, D], k, v [B, K, S, D], an `AttentionMask`, and keywords
`self_attention` (the mask is `AttentionMask.causal`: keys are the queries' own
tokens, coordinates their indices) and `block_size`; it returns [B, T, H, D] in
q's dtype, with scores and softmax in float32.

    "flash"   blocked online softmax with a recomputing backward pass
              (`flash_attention.py`); memory linear in T. Every backend.
    "xla"     the direct computation: all [T, S] scores at once (the reference).
    "cudnn"   `jax.nn.dot_product_attention(implementation="cudnn")` (GPU, bf16/fp16):
              causal with per-row lengths when every row of the batch is one
              sequence then padding (checked at run time), else "flash".
    "splash"  the Pallas splash-attention kernel (TPU): causal within segments
              for self-attention with T a multiple of 128, else "flash".
    "auto"    "cudnn" on GPU in bf16/fp16, "splash" on TPU, "flash" otherwise.

Rows with shared prefixes (`AttentionMask.q_prefix`, `rl/prefix_packing.py`) run
"flash" under "cudnn" and "splash": neither fused kernel takes that mask.

Any other key may be "package.module:attr" naming a function of the same signature.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from orchestra_jax.models.attention_mask import AttentionMask
from orchestra_jax.models.flash_attention import flash_attention
from orchestra_jax.registry import Registry

ATTENTION = Registry("attention implementation")


def grouped_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, keys_transposed: bool = False
) -> jax.Array:
    """softmax(q k^T / sqrt(D) + mask) v for q [B, T, H, D], k/v [B, K, S, D], mask [B, T, S].

    Queries are grouped as [B, K, G, T, D], so both matmuls are batched over (B, K)
    with no repeat of keys/values across the group. With `keys_transposed`, k is
    [B, K, D, S] (the KV cache's key layout, see `qwen3_cache`). Scores, softmax and
    both products accumulate in float32; returns [B, T, H, D] in q's dtype. Rows with
    no visible key get the uniform average of the values (their output is unused).
    """
    b, t, h, d = q.shape
    kv_heads = k.shape[1]
    g = h // kv_heads
    qg = q.reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4)
    spec = "bkgtd,bkds->bkgts" if keys_transposed else "bkgtd,bksd->bkgts"
    scores = jnp.einsum(spec, qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * (d**-0.5)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = jnp.einsum(
        "bkgts,bksd->bkgtd", probs, v.astype(q.dtype), preferred_element_type=jnp.float32
    )
    return out.astype(q.dtype).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


@ATTENTION.register("xla")
def xla_attention(q, k, v, mask: AttentionMask, *, self_attention: bool, block_size: int):
    """All scores at once: `grouped_attention` with the dense mask."""
    del self_attention, block_size
    return grouped_attention(q, k, v, mask.dense())


@ATTENTION.register("flash")
def flash(q, k, v, mask: AttentionMask, *, self_attention: bool, block_size: int):
    """`flash_attention` with square blocks of `block_size`."""
    del self_attention
    return flash_attention(q, k, v, mask, block_q=block_size, block_k=block_size)


def _single_sequence_lengths(mask: AttentionMask) -> tuple[jax.Array, jax.Array]:
    """(lengths [B], ok): each row's tokens before its first padding, and whether every
    row is one segment (id 1) then padding only."""
    seg = mask.q_segment
    length = jnp.sum(seg != 0, axis=1).astype(jnp.int32)
    expected = jnp.arange(seg.shape[1])[None, :] < length[:, None]
    ok = jnp.all((seg != 0) == expected) & jnp.all((seg == 0) | (seg == 1))
    return length, ok


def cudnn_causal(
    q, k, v, mask: AttentionMask, *, implementation: Literal["xla", "cudnn"], block_size: int
):
    """`jax.nn.dot_product_attention`, causal with per-row lengths, where the batch is one
    sequence a row; `flash_attention` otherwise (a run-time branch, both compiled)."""
    length, ok = _single_sequence_lengths(mask)

    def fused():
        out = jax.nn.dot_product_attention(
            q,
            k.transpose(0, 2, 1, 3),
            v.transpose(0, 2, 1, 3),
            is_causal=True,
            query_seq_lengths=length,
            key_value_seq_lengths=length,
            implementation=implementation,
        )
        # Padding rows (beyond a row's length) are zero, as in the other kernels.
        pad = jnp.arange(q.shape[1])[None, :] < length[:, None]
        return jnp.where(pad[:, :, None, None], out, 0).astype(q.dtype)

    def blocked():
        return flash_attention(q, k, v, mask, block_q=block_size, block_k=block_size)

    return jax.lax.cond(ok, fused, blocked)


@ATTENTION.register("cudnn")
def cudnn(q, k, v, mask: AttentionMask, *, self_attention: bool, block_size: int):
    """cuDNN's fused attention for one-sequence rows (see `cudnn_causal`), else "flash"."""
    if (
        not self_attention
        or q.dtype not in (jnp.bfloat16, jnp.float16)
        or mask.q_prefix is not None
    ):
        return flash(q, k, v, mask, self_attention=self_attention, block_size=block_size)
    return cudnn_causal(q, k, v, mask, implementation="cudnn", block_size=block_size)


@functools.cache
def _splash_kernel(t: int, group: int, interpret: bool):
    """A causal splash-attention MQA kernel for `group` query heads over length t."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(group)])
    block = min(512, t)
    sizes = sk.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    return sk.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def splash_causal(q, k, v, mask: AttentionMask, *, interpret: bool = False):
    """Causal attention within segments by the splash kernel, vmapped over rows and kv heads.

    T must be a multiple of 128. Padding (segment 0) only sees padding, so its output
    is set to 0 as in the other kernels.
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    b, t, h, d = q.shape
    kv_heads = k.shape[1]
    g = h // kv_heads
    kernel = _splash_kernel(t, g, interpret)
    qg = (q * np.asarray(d**-0.5, q.dtype)).reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4)

    def row(qr, kr, vr, seg):  # [K, G, T, D], [K, T, D], [K, T, D], [T]
        ids = sk.SegmentIds(q=seg, kv=seg)
        return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, ids))(qr, kr, vr)

    out: Any = jax.vmap(row)(qg, k.astype(q.dtype), v.astype(q.dtype), mask.q_segment)
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
    return jnp.where((mask.q_segment != 0)[:, :, None, None], out, 0).astype(q.dtype)


@ATTENTION.register("splash")
def splash(q, k, v, mask: AttentionMask, *, self_attention: bool, block_size: int):
    """The splash kernel for self-attention with T % 128 == 0, else "flash"."""
    if not self_attention or q.shape[1] % 128 or mask.q_prefix is not None:
        return flash(q, k, v, mask, self_attention=self_attention, block_size=block_size)
    return splash_causal(q, k, v, mask)


def auto_name(dtype) -> str:
    """What "auto" runs on this backend for compute dtype `dtype`."""
    platform = jax.default_backend()
    if platform == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    if platform == "tpu":
        return "splash"
    return "flash"


@ATTENTION.register("auto")
def auto(q, k, v, mask: AttentionMask, *, self_attention: bool, block_size: int):
    """The backend's best: "cudnn" on GPU in bf16/fp16, "splash" on TPU, else "flash"."""
    fn = ATTENTION.get(auto_name(q.dtype))
    return fn(q, k, v, mask, self_attention=self_attention, block_size=block_size)


def get_attention(name: str):
    """The implementation for a config string: a registry key or "package.module:attr"."""
    return ATTENTION.get(name)


def check_attention(name: str) -> None:
    """Raise a clear error (ValueError) for an attention name `get_attention` cannot resolve."""
    problem = ATTENTION.problem(name)
    if problem is not None:
        raise ValueError(problem)
