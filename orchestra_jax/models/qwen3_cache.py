"""Preallocated key/value cache for incremental Qwen3 decoding.

Layout: `k`, `v` are [layers, batch, kv_heads, max_len, head_dim]. With batch and
head leading, the decode attention einsums ("bkgd,bksd->bkgs" and
"bkgs,bksd->bkgd") are plain batched matmuls over the stored layout, so no step
ever transposes the cache; only the few new tokens are transposed on write.

Rule: the token at position p of row b is written to slot p of row b; a query at
position p attends to slots s <= p (and s < kv_len when the caller bounds the
attended prefix). Rows are independent, so rows may sit at different lengths
(continuous batching); stale slots beyond a row's current position are masked.

Prefilling one row of a large cache (a new request entering a free slot):
    sub = cache.take_rows(rows)                     # rows: int32 [R]
    logits, sub = model(ids, positions, cache=sub)  # ids/positions: [R, T]
    cache = cache.put_rows(rows, sub)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    """Keys and values, each [layers, batch, kv_heads, max_len, head_dim]. A JAX pytree."""

    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(cls, num_layers: int, batch_size: int, num_kv_heads: int, max_len: int,
              head_dim: int, dtype) -> "KVCache":
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def take_rows(self, rows: jax.Array) -> "KVCache":
        """The sub-cache of the given batch rows (int32 [R])."""
        return KVCache(self.k[:, rows], self.v[:, rows])

    def put_rows(self, rows: jax.Array, sub: "KVCache") -> "KVCache":
        """This cache with batch rows `rows` replaced by `sub`'s rows."""
        return KVCache(self.k.at[:, rows].set(sub.k), self.v.at[:, rows].set(sub.v))


def write_layer(cache_k: jax.Array, cache_v: jax.Array, layer: jax.Array, k: jax.Array,
                v: jax.Array, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Scatter new keys/values [B, T, K, D] of one layer into slots [B, T] of the full cache.

    Slots out of range (used for padding tokens) are dropped, so padding never
    overwrites a real entry.
    """
    b = jnp.arange(k.shape[0])[:, None, None]          # [B, 1, 1]
    h = jnp.arange(k.shape[2])[None, :, None]          # [1, K, 1]
    s = slots[:, None, :]                              # [B, 1, T]
    k_t = jnp.swapaxes(k, 1, 2).astype(cache_k.dtype)  # [B, K, T, D]: only new tokens move.
    v_t = jnp.swapaxes(v, 1, 2).astype(cache_v.dtype)
    cache_k = cache_k.at[layer, b, h, s].set(k_t, mode="drop")
    cache_v = cache_v.at[layer, b, h, s].set(v_t, mode="drop")
    return cache_k, cache_v


def read_layer(cache_k: jax.Array, cache_v: jax.Array, layer: jax.Array,
               kv_len: int) -> tuple[jax.Array, jax.Array]:
    """Keys and values [B, K, kv_len, D] of one layer: the first `kv_len` slots only."""
    b, h, _, d = cache_k.shape[1:]
    start = (layer, 0, 0, 0, 0)
    size = (1, b, h, kv_len, d)
    k = jax.lax.dynamic_slice(cache_k, start, size)[0]
    v = jax.lax.dynamic_slice(cache_v, start, size)[0]
    return k, v
