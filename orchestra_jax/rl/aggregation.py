"""Reducing per-token losses to a scalar, as (sum, denominator) pairs.

A loss over a batch is `loss_sum(values) / loss_denominator(mask)`. Splitting it
this way makes gradient accumulation exact: with the denominator computed once
over the *whole* batch, Σ_k loss_sum(micro-batch k) / denominator equals the
full-batch loss, whatever the micro-batches look like.

Aggregations (m = loss mask, v = per-token values, s = sequences, i.e. (row,
segment) pairs, n_s = Σ_{t∈s} m_t, N = #sequences with n_s > 0, L = norm length):

  "token-mean"               Σ_t m_t v_t / Σ_t m_t
  "seq-mean-token-sum"       (1/N) Σ_s Σ_{t∈s} m_t v_t
  "seq-mean-token-mean"      (1/N) Σ_s (1/n_s) Σ_{t∈s} m_t v_t
  "seq-mean-token-sum-norm"  (1/N) Σ_s (1/L) Σ_{t∈s} m_t v_t   (Dr. GRPO; L fixed)

Sequences are told apart by `segment_ids` (packed rows hold several), or are
whole rows when `segment_ids` is None. A packed batch (rl/batching.py) gives
each sample its own segment, so every aggregation, the per-sequence ones
included, is that of the same samples one a row; only "seq-mean-token-sum-norm"
with L left to the padded length T would differ (packing changes T), which is
why the learner's config gives packing a fixed L or refuses it
(`rl/config.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def check_aggregation(agg: str) -> None:
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {agg!r}; expected one of {AGGREGATIONS}")


def sequence_token_counts(
    loss_mask: jax.Array, segment_ids: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """(n_s of each token's sequence [B, T], N = #sequences with at least one loss token).

    A sequence is a (row, segment id) pair; `segment_ids=None` means one per row.
    """
    mask = loss_mask.astype(jnp.float32)
    batch, length = mask.shape
    if segment_ids is None:
        per_row = mask.sum(axis=1, keepdims=True)
        return jnp.broadcast_to(per_row, mask.shape), (per_row > 0).sum().astype(jnp.float32)
    # Segment ids are < T + 1 per row, so (row, segment) -> row * (T + 1) + segment is unique.
    flat_ids = (jnp.arange(batch)[:, None] * (length + 1) + segment_ids).reshape(-1)
    num = batch * (length + 1)
    counts = jax.ops.segment_sum(mask.reshape(-1), flat_ids, num_segments=num)
    per_token = counts[flat_ids].reshape(mask.shape)
    return per_token, (counts > 0).sum().astype(jnp.float32)


def loss_denominator(
    loss_mask: jax.Array,
    agg: str,
    *,
    segment_ids: jax.Array | None = None,
    norm_length: int | None = None,
) -> jax.Array:
    """Σ m (token-mean), N (seq-mean-token-sum, seq-mean-token-mean) or N · L
    (seq-mean-token-sum-norm).

    L defaults to the padded length T. Compute it over the full batch when
    accumulating over micro-batches.
    """
    check_aggregation(agg)
    if agg == "token-mean":
        return loss_mask.astype(jnp.float32).sum()
    _, num_seqs = sequence_token_counts(loss_mask, segment_ids)
    if agg in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return num_seqs
    return num_seqs * float(norm_length if norm_length is not None else loss_mask.shape[1])


def loss_sum(
    values: jax.Array, loss_mask: jax.Array, agg: str, *, segment_ids: jax.Array | None = None
) -> jax.Array:
    """Σ m v (token-mean, seq-mean-token-sum, seq-mean-token-sum-norm) or Σ m v / n_s
    (seq-mean-token-mean)."""
    check_aggregation(agg)
    weighted = values * loss_mask.astype(values.dtype)
    if agg == "seq-mean-token-mean":
        counts, _ = sequence_token_counts(loss_mask, segment_ids)
        weighted = weighted / jnp.maximum(counts, 1.0)
    return weighted.sum()


def aggregate(
    values: jax.Array,
    loss_mask: jax.Array,
    agg: str = "token-mean",
    *,
    segment_ids: jax.Array | None = None,
    norm_length: int | None = None,
    denominator: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(loss, sum, denominator) with loss = sum / max(denominator, 1e-8) (0 when empty).

    Pass the full batch's `denominator` when `values` is one micro-batch.
    """
    total = loss_sum(values, loss_mask, agg, segment_ids=segment_ids)
    if denominator is None:
        denominator = loss_denominator(
            loss_mask, agg, segment_ids=segment_ids, norm_length=norm_length
        )
    denominator = jnp.asarray(denominator, jnp.float32)
    return total / jnp.maximum(denominator, 1e-8), total, denominator
