"""Preallocated key/value cache for incremental Qwen3 decoding.

Layout: one array per layer. `k[i]`, `v[i]` are layer i's keys and values,
[batch, kv_heads, max_len, head_dim]. Separate arrays (not one stacked
[layers, ...] array) let attention read a layer's keys as they are: a slice of
a stacked cache is a copy of the whole layer on every step (about 40 % of a
demo-model decode step on CPU), and a per-layer buffer is also updated in place
under donation. With batch and head leading, the decode attention einsums
("bkgd,bksd->bkgs" and "bkgs,bksd->bkgd") are plain batched matmuls over the
stored layout, so no step ever transposes the cache; only the few new tokens
are transposed on write.

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

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    """Per-layer keys and values: tuples of [batch, kv_heads, max_len, head_dim]. A pytree."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @classmethod
    def zeros(cls, num_layers: int, batch_size: int, num_kv_heads: int, max_len: int,
              head_dim: int, dtype) -> "KVCache":
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        return cls(tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
                   tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)))

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def batch_size(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    def map(self, fn: Callable[[jax.Array], jax.Array]) -> "KVCache":
        """The cache with `fn` applied to every layer's keys and values."""
        return KVCache(tuple(map(fn, self.k)), tuple(map(fn, self.v)))

    def map2(self, fn: Callable[[jax.Array, jax.Array], jax.Array], other: "KVCache") -> "KVCache":
        """fn(mine, other's) for every layer's keys and values."""
        return KVCache(tuple(map(fn, self.k, other.k)), tuple(map(fn, self.v, other.v)))

    def take_rows(self, rows: jax.Array) -> "KVCache":
        """The sub-cache of the given batch rows (int32 [R])."""
        return self.map(lambda x: x[rows])

    def put_rows(self, rows: jax.Array, sub: "KVCache") -> "KVCache":
        """This cache with batch rows `rows` replaced by `sub`'s rows."""
        return self.map2(lambda x, s: x.at[rows].set(s), sub)


def write_layer(cache_k: jax.Array, cache_v: jax.Array, k: jax.Array, v: jax.Array,
                slots: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Scatter one layer's new keys/values [B, T, K, D] into slots [B, T] of its cache.

    Slots out of range (used for padding tokens) are dropped, so padding never
    overwrites a real entry.
    """
    b = jnp.arange(k.shape[0])[:, None, None]          # [B, 1, 1]
    h = jnp.arange(k.shape[2])[None, :, None]          # [1, K, 1]
    s = slots[:, None, :]                              # [B, 1, T]
    k_t = jnp.swapaxes(k, 1, 2).astype(cache_k.dtype)  # [B, K, T, D]: only new tokens move.
    v_t = jnp.swapaxes(v, 1, 2).astype(cache_v.dtype)
    cache_k = cache_k.at[b, h, s].set(k_t, mode="drop")
    cache_v = cache_v.at[b, h, s].set(v_t, mode="drop")
    return cache_k, cache_v


def read_layer(cache_k: jax.Array, cache_v: jax.Array, kv_len: int) -> tuple[jax.Array, jax.Array]:
    """Keys and values [B, K, kv_len, D] of one layer: the first `kv_len` slots only.

    At kv_len == max_len this is the stored array itself (no copy).
    """
    if kv_len == cache_k.shape[2]:
        return cache_k, cache_v
    return cache_k[:, :, :kv_len], cache_v[:, :, :kv_len]
