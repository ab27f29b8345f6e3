"""Which keys each query sees, as per-token coordinates and segment ids (never [T, S]).

    visible(t, s) = kv_coord[s] <= q_coord[t]  and  kv_segment[s] == q_segment[t] != 0

(per batch row). Two constructors cover the model's two cases:

* `AttentionMask.causal(segment_ids)`: a sequence attending to itself. The
  coordinates are token indices, so attention is causal within a segment;
  packed sequences (segment ids 1, 2, …) stay apart and padding (0) sees nothing.
* `AttentionMask.cache(positions, kv_len, segment_ids)`: queries at `positions`
  reading a KV cache's first kv_len slots, slot s holding position s; padding
  queries (segment 0) see nothing.

Blocked kernels build each block's mask from these [B, T] / [B, S] arrays;
`dense()` gives the [B, T, S] boolean for the direct path.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class AttentionMask(NamedTuple):
    """int32 q_coord / q_segment [B, T] and kv_coord / kv_segment [B, S]; a JAX pytree."""

    q_coord: jax.Array
    q_segment: jax.Array
    kv_coord: jax.Array
    kv_segment: jax.Array

    @classmethod
    def causal(cls, segment_ids: jax.Array) -> AttentionMask:
        """Causal self-attention within segments (0 = padding) of a [B, T] batch."""
        segment_ids = jnp.asarray(segment_ids, jnp.int32)
        index = jnp.broadcast_to(
            jnp.arange(segment_ids.shape[1], dtype=jnp.int32), segment_ids.shape
        )
        return cls(index, segment_ids, index, segment_ids)

    @classmethod
    def cache(
        cls, positions: jax.Array, kv_len: int, segment_ids: jax.Array | None = None
    ) -> AttentionMask:
        """Queries at `positions` [B, T] reading cache slots s < kv_len with s <= position."""
        positions = jnp.asarray(positions, jnp.int32)
        b = positions.shape[0]
        live = (
            jnp.ones_like(positions)
            if segment_ids is None
            else (jnp.asarray(segment_ids) != 0).astype(jnp.int32)
        )
        slots = jnp.broadcast_to(jnp.arange(kv_len, dtype=jnp.int32), (b, kv_len))
        return cls(positions, live, slots, jnp.ones((b, kv_len), jnp.int32))

    def dense(self) -> jax.Array:
        """bool [B, T, S]: visible(t, s) as in the module docstring."""
        earlier = self.kv_coord[:, None, :] <= self.q_coord[:, :, None]
        same = self.kv_segment[:, None, :] == self.q_segment[:, :, None]
        return earlier & same & (self.q_segment[:, :, None] != 0)
