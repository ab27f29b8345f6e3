"""Supervised fine-tuning objective: cross-entropy on loss-masked target tokens."""

from __future__ import annotations

import jax

from orchestra_jax.rl.aggregation import aggregate


def sft_loss(
    logprobs: jax.Array,
    loss_mask: jax.Array,
    *,
    agg: str = "token-mean",
    segment_ids: jax.Array | None = None,
    norm_length: int | None = None,
    denominator: jax.Array | float | None = None,
) -> tuple[jax.Array, dict]:
    """loss = agg_sum(−log p(target)) / denominator over tokens with mask 1.

    With the default token-mean this is the mean negative log-likelihood of the
    supervised tokens. As for `policy_loss`, pass the full batch's `denominator`
    when `logprobs` is a micro-batch.
    """
    loss, total, denom = aggregate(
        -logprobs,
        loss_mask,
        agg,
        segment_ids=segment_ids,
        norm_length=norm_length,
        denominator=denominator,
    )
    return loss, {"loss_sum": total, "loss_denominator": denom}
