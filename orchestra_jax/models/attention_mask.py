"""Which keys each query sees, as per-token coordinates and segment ids (never [T, S]).

    visible(t, s) = kv_coord[s] <= q_coord[t]  and  q_segment[t] != 0  and
                    kv_segment[s] in {q_segment[t], q_prefix[t]}

(per batch row; without `q_prefix`, the segments must be equal). Two
constructors cover the model's two cases:

* `AttentionMask.causal(segment_ids, prefix_segment_ids=None)`: a sequence
  attending to itself. The coordinates are token indices, so attention is causal
  within a segment; packed sequences (segment ids 1, 2, …) stay apart and
  padding (0) sees nothing. `prefix_segment_ids` [B, T] names, per token, the
  segment of a shared prefix it also sees (0: none): a row holding one copy of a
  prefix and several continuations of it (`rl/prefix_packing.py`), each
  continuation its own segment, sees exactly what it would see written after
  its own copy of the prefix (the prefix's tokens come before it in the row).
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
    """int32 q_coord / q_segment [B, T] and kv_coord / kv_segment [B, S], and
    q_prefix [B, T] or None (no shared prefixes); a JAX pytree."""

    q_coord: jax.Array
    q_segment: jax.Array
    kv_coord: jax.Array
    kv_segment: jax.Array
    q_prefix: jax.Array | None = None

    @classmethod
    def causal(
        cls, segment_ids: jax.Array, prefix_segment_ids: jax.Array | None = None
    ) -> AttentionMask:
        """Causal self-attention within segments (0 = padding) of a [B, T] batch, each
        token also seeing the segment `prefix_segment_ids` names (0: none)."""
        segment_ids = jnp.asarray(segment_ids, jnp.int32)
        index = jnp.broadcast_to(
            jnp.arange(segment_ids.shape[1], dtype=jnp.int32), segment_ids.shape
        )
        prefix = None
        if prefix_segment_ids is not None:
            prefix = jnp.asarray(prefix_segment_ids, jnp.int32)
        return cls(index, segment_ids, index, segment_ids, prefix)

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
        if self.q_prefix is not None:
            prefix = self.q_prefix[:, :, None]
            same = same | ((self.kv_segment[:, None, :] == prefix) & (prefix != 0))
        return earlier & same & (self.q_segment[:, :, None] != 0)
