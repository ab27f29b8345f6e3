"""Qwen3 grouped-query attention with per-head q/k RMSNorm before RoPE.

Shapes: B batch, T query tokens, S key slots, H query heads, K kv heads,
G = H / K heads per group, D head_dim. Keys/values are [B, K, S, D] (the KV
cache keeps keys as [B, K, D, S]). Which keys a query sees is an
`AttentionMask` (coordinates and segment ids). The attention itself is the
implementation `config.attention` names (`attention_kernels.py`): without a
cache (training, scoring) and for a multi-token call on a cache (prefill);
a one-token decode step reads the cache directly (`grouped_attention`).
"""

from __future__ import annotations

from flax import nnx

from orchestra_jax.models.attention_kernels import get_attention, grouped_attention
from orchestra_jax.models.attention_mask import AttentionMask
from orchestra_jax.models.qwen3 import cache as qwen3_cache
from orchestra_jax.models.qwen3.config import Qwen3Config
from orchestra_jax.models.qwen3.layers import Linear, RMSNorm, apply_rope


class Attention(nnx.Module):
    """Self-attention of one Qwen3 layer; reads/writes the KV cache when given one."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        e, d = config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d
        self.q_proj = Linear(e, self.num_heads * d, config, rngs=rngs, target="q")
        self.k_proj = Linear(e, self.num_kv_heads * d, config, rngs=rngs, target="k")
        self.v_proj = Linear(e, self.num_kv_heads * d, config, rngs=rngs, target="v")
        self.o_proj = Linear(self.num_heads * d, e, config, rngs=rngs, target="o")
        self.q_norm = RMSNorm(d, config)
        self.k_norm = RMSNorm(d, config)
        self.attention = config.attention  # an `attention_kernels` name
        self.block_size = config.attention_block_size

    def __call__(self, x, cos, sin, mask: AttentionMask, cache=None):
        """x [B, T, E]; cos/sin [B, T, D/2]; mask: which of the S keys each query sees.

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
            out = get_attention(self.attention)(
                q, keys, values, mask, self_attention=True, block_size=self.block_size
            )
        else:
            cache_k, cache_v, slots, kv_len = cache
            cache_k, cache_v = qwen3_cache.write_layer(cache_k, cache_v, k, v, slots)
            keys_t, values = qwen3_cache.read_layer(cache_k, cache_v, kv_len)
            if t == 1:  # a decode step: one query per row, all its scores are one block.
                # In the cache's dtype: a float32 cache is read as it is (on CPU, bf16
                # batched matmuls this small are slower than float32 ones).
                out = grouped_attention(
                    q.astype(keys_t.dtype), keys_t, values, mask.dense(), keys_transposed=True
                ).astype(q.dtype)
            else:
                out = get_attention(self.attention)(
                    q,
                    keys_t.transpose(0, 1, 3, 2),
                    values,
                    mask,
                    self_attention=False,
                    block_size=self.block_size,
                )
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim)), cache_k, cache_v
