"""Preallocated key/value cache for incremental Qwen3 decoding.

Layout: one array per layer. Layer i's keys `k[i]` are stored transposed,
[batch, kv_heads, head_dim, max_len], and its values `v[i]` as
[batch, kv_heads, max_len, head_dim]. So both decode attention products are
plain batched matmuls over the stored layout: scores q·K^T contract head_dim with
K^T's rows and the output p·V contracts slots with V's rows (on CPU, storing keys
[.., max_len, head_dim] made the score product, which then contracts both
operands' minor axes, 2x slower). No step ever transposes the cache, nor the new
tokens: each (row, token) writes one [kv_heads, head_dim] window. Separate arrays per layer (not one
stacked [layers, ...] array) let attention read a layer's cache as it is: a
slice of a stacked cache is a copy of the layer on every step (about 40 % of a
demo-model decode step at 512 slots on CPU).

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

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from orchestra_jax.models.qwen3.layers import as_bits, from_bits


class KVCache(NamedTuple):
    """Per layer: keys [batch, kv_heads, head_dim, max_len], values [batch, kv_heads,
    max_len, head_dim] (tuples over layers). A JAX pytree."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @classmethod
    def zeros(
        cls, num_layers: int, batch_size: int, num_kv_heads: int, max_len: int, head_dim: int, dtype
    ) -> KVCache:
        k_shape = (batch_size, num_kv_heads, head_dim, max_len)
        v_shape = (batch_size, num_kv_heads, max_len, head_dim)
        return cls(
            tuple(jnp.zeros(k_shape, dtype) for _ in range(num_layers)),
            tuple(jnp.zeros(v_shape, dtype) for _ in range(num_layers)),
        )

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def batch_size(self) -> int:
        return self.v[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.v[0].shape[2]

    def _map(self, fn_k: Callable, fn_v: Callable, *others: KVCache) -> KVCache:
        return KVCache(
            tuple(fn_k(*xs) for xs in zip(self.k, *(o.k for o in others))),
            tuple(fn_v(*xs) for xs in zip(self.v, *(o.v for o in others))),
        )

    def take_rows(self, rows: jax.Array) -> KVCache:
        """The sub-cache of the given batch rows (int32 [R])."""
        take = lambda x: from_bits(as_bits(x)[rows], x.dtype)  # noqa: E731 (see write_layer)
        return self._map(take, take)

    def put_rows(self, rows: jax.Array, sub: KVCache) -> KVCache:
        """This cache with batch rows `rows` replaced by `sub`'s rows (index >= batch: dropped)."""

        def put(x, s):
            return from_bits(
                as_bits(x).at[rows].set(as_bits(s.astype(x.dtype)), mode="drop"), x.dtype
            )

        return self._map(put, put, sub)

    def put_prefix(self, rows: jax.Array, sub: KVCache) -> KVCache:
        """Rows `rows` [R] get `sub`'s first sub.max_len slots (row index >= batch: dropped).

        Later slots of those rows keep their old values; the masking rule above
        keeps them unread until overwritten.
        """
        t = sub.max_len

        def put_k(x, s):
            bits = as_bits(x).at[rows, :, :, :t].set(as_bits(s.astype(x.dtype)), mode="drop")
            return from_bits(bits, x.dtype)

        def put_v(x, s):
            bits = as_bits(x).at[rows, :, :t].set(as_bits(s.astype(x.dtype)), mode="drop")
            return from_bits(bits, x.dtype)

        return self._map(put_k, put_v, sub)

    def resized(self, length: int) -> KVCache:
        """The cache with `length` slots per row: cut, or zero-padded at the end."""

        def fit(x, axis):
            if length <= x.shape[axis]:
                return jax.lax.slice_in_dim(x, 0, length, axis=axis)
            pad = [(0, 0)] * x.ndim
            pad[axis] = (0, length - x.shape[axis])
            return jnp.pad(x, pad)

        return self._map(lambda x: fit(x, 3), lambda x: fit(x, 2))


def write_layer(
    cache_k: jax.Array, cache_v: jax.Array, k: jax.Array, v: jax.Array, slots: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Write one layer's new keys/values [B, T, K, D] into slots [B, T] of its cache.

    One scatter index per (row, token), each writing a [K, D] window, so nothing is
    transposed and a decode step scatters B windows, not B*K*D scalars. Slots out
    of range (used for padding tokens) are dropped, so padding never overwrites a
    real entry.
    """
    rows = jnp.arange(k.shape[0])[:, None]  # [B, 1], broadcast against slots [B, T]
    # Indexing [rows, :, :, slots] / [rows, :, slots] selects [B, T, K, D]: k's own layout.
    # 16-bit caches are scattered as uint16 bit patterns (`qwen3_layers.as_bits`).
    dtype = cache_k.dtype
    new_k, new_v = as_bits(k.astype(dtype)), as_bits(v.astype(dtype))
    cache_k = as_bits(cache_k).at[rows, :, :, slots].set(new_k, mode="drop")
    cache_v = as_bits(cache_v).at[rows, :, slots].set(new_v, mode="drop")
    return from_bits(cache_k, dtype), from_bits(cache_v, dtype)


def read_layer(cache_k: jax.Array, cache_v: jax.Array, kv_len: int) -> tuple[jax.Array, jax.Array]:
    """Keys^T [B, K, D, kv_len] and values [B, K, kv_len, D]: the first `kv_len` slots.

    At kv_len == max_len these are the stored arrays themselves (no copy).
    """
    if kv_len == cache_v.shape[2]:
        return cache_k, cache_v
    return cache_k[..., :kv_len], cache_v[:, :, :kv_len]
