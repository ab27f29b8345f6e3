"""Qwen3 grouped-query attention with per-head q/k RMSNorm before RoPE.

Shapes: B batch, T query tokens, S key slots, H query heads, K kv heads,
G = H / K heads per group, D head_dim. Queries are grouped as [B, K, G*T, D] and
keys/values kept as [B, K, S, D] (the KV cache keeps keys as [B, K, D, S]), so
both attention matmuls are batched over the leading (B, K) axes with no repeat of
keys/values across the group.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from orchestra_jax.models import qwen3_cache
from orchestra_jax.models.qwen3_config import Qwen3Config
from orchestra_jax.models.qwen3_layers import Linear, RMSNorm, apply_rope


def segment_causal_mask(segment_ids: jax.Array) -> jax.Array:
    """bool [B, T, T]: query t sees key s iff s <= t, same segment, and segment != 0.

    Packed sequences are contiguous runs of one segment id, so index order within a
    segment is causal order; padding (segment 0) sees nothing and is seen by no one.
    """
    t = segment_ids.shape[1]
    causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal[None] & same & (segment_ids[:, None, :] != 0)


def cache_mask(positions: jax.Array, kv_len: int) -> jax.Array:
    """bool [B, T, kv_len]: a query at position p attends to cache slots s <= p."""
    return jnp.arange(kv_len)[None, None, :] <= positions[:, :, None]


def grouped_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, keys_transposed: bool = False
) -> jax.Array:
    """softmax(q k^T / sqrt(D) + mask) v for q [B, T, H, D], k/v [B, K, S, D], mask [B, T, S].

    With `keys_transposed`, k is [B, K, D, S] (the KV cache's key layout, see
    `qwen3_cache`). Scores and softmax run in float32; returns [B, T, H, D] in q's
    dtype. Rows with no visible key (padding) get a uniform average instead of NaN.
    """
    b, t, h, d = q.shape
    kv_heads = k.shape[1]
    g = h // kv_heads
    # [B, T, K, G, D] -> [B, K, G, T, D]: query groups share their kv head's matmul.
    qg = q.reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4)
    spec = "bkgtd,bkds->bkgts" if keys_transposed else "bkgtd,bksd->bkgts"
    scores = jnp.einsum(spec, qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * (d**-0.5)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgts,bksd->bkgtd", probs, v.astype(q.dtype))
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def causal_blocked_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, block: int = 256
) -> jax.Array:
    """`grouped_attention` for a causal mask, skipping the key blocks no query sees.

    Queries are cut into blocks of `block` tokens; block i attends to keys
    [0, (i + 1) * block) only, since a causal mask hides every later key. The
    result is the same (the skipped scores would get zero weight), but a
    sequence of n blocks costs (n + 1) / 2n of the full T x T scores and softmax,
    which dominate the step of a small model on long sequences. Shorter or
    non-multiple lengths fall back to one block.
    """
    t = q.shape[1]
    if t <= block or t % block:
        return grouped_attention(q, k, v, mask)
    outs = [
        grouped_attention(
            q[:, i : i + block],
            k[:, :, : i + block],
            v[:, :, : i + block],
            mask[:, i : i + block, : i + block],
        )
        for i in range(0, t, block)
    ]
    return jnp.concatenate(outs, axis=1)


class Attention(nnx.Module):
    """Self-attention of one Qwen3 layer; reads/writes the KV cache when given one."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        e, d = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d
        self.q_proj = Linear(e, self.num_heads * d, config, rngs=rngs)
        self.k_proj = Linear(e, self.num_kv_heads * d, config, rngs=rngs)
        self.v_proj = Linear(e, self.num_kv_heads * d, config, rngs=rngs)
        self.o_proj = Linear(self.num_heads * d, e, config, rngs=rngs)
        self.q_norm = RMSNorm(d, config)
        self.k_norm = RMSNorm(d, config)

    def __call__(self, x, cos, sin, mask, cache=None):
        """x [B, T, E]; cos/sin [B, T, D/2]; mask [B, T, S].

        `cache` is None (keys are this call's tokens) or a tuple
        (cache_k, cache_v, slots [B, T], kv_len) with this layer's cache arrays
        (keys [B, K, D, S], values [B, K, S, D]): new keys/values go to `slots`, then
        attention reads the first kv_len slots. Returns (y, cache_k, cache_v) with the
        caches None when no cache was given.
        """
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is None:
            keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
            cache_k = cache_v = None
            # Without a cache the mask is causal (segment_causal_mask).
            out = causal_blocked_attention(q, keys, values, mask)
        else:
            cache_k, cache_v, slots, kv_len = cache
            cache_k, cache_v = qwen3_cache.write_layer(cache_k, cache_v, k, v, slots)
            keys_t, values = qwen3_cache.read_layer(cache_k, cache_v, kv_len)
            out = grouped_attention(q, keys_t, values, mask, keys_transposed=True)
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim)), cache_k, cache_v
