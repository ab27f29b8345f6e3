"""What one micro-batch contributes to a learner step: loss and metric sums.

An objective maps (model, reference model, micro-batch, full-batch loss
denominator, config) to (loss, stats). The loss is already divided by the full
batch's denominator, so the learner just adds micro-batch losses and gradients.
Stats are named by how they combine across micro-batches:

    "total/<name>"  added up as is (already normalised, like the loss)
    "token/<name>"  added up, then divided by the batch's loss-token count
    "max/<name>", "min/<name>"  maximum / minimum over micro-batches

Objectives: "grpo" (clipped policy gradient + KL + entropy bonus) and "sft"
(cross-entropy on loss-masked tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from orchestra_jax.registry import Registry
from orchestra_jax.rl import grpo
from orchestra_jax.rl.aggregation import aggregate
from orchestra_jax.rl.batching import TrainBatch
from orchestra_jax.rl.head_logprobs import auto_chunk_size, head_logprobs
from orchestra_jax.rl.sft import sft_loss
from orchestra_jax.rl.shared_prompts import SharedPromptBatch, shared_prompt_hidden_states

OBJECTIVES = Registry("learner objective")


def model_logprobs(
    model: nnx.Module, batch: TrainBatch, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """(log softmax(logits / T)[target] [B, T], logits [B, T, V]) for a TrainBatch."""
    logits = model(
        batch.input_ids,
        batch.positions,
        segment_ids=batch.segment_ids,
        prefix_segment_ids=batch.prefix_segment_ids,
    )
    return grpo.token_logprobs(logits, batch.target_ids, temperature), logits


def at_loss_positions(batch: TrainBatch) -> TrainBatch:
    """The per-token fields gathered at `batch.loss_index`: [B, T] -> [B, K].

    Padding entries (index −1) get loss mask 0, so every masked sum, count and
    aggregation over the result equals the one over the full batch. Segment ids
    are renumbered 1, 2, … along the gathered positions (ascending, so a packed
    sequence's loss positions are consecutive), 0 on padding entries: K columns
    then hold at most K ids, as `aggregation.sequence_token_counts` needs, and
    the same positions share an id as before.
    """
    valid = batch.loss_index >= 0
    index = jnp.where(valid, batch.loss_index, 0)
    take = lambda x: jnp.take_along_axis(x, index, axis=1)  # noqa: E731
    segments = take(batch.segment_ids)
    change = (segments[:, 1:] != segments[:, :-1]).astype(segments.dtype)
    dense = 1 + jnp.concatenate([jnp.zeros_like(segments[:, :1]), change], axis=1).cumsum(axis=1)
    return dataclasses.replace(
        batch,
        target_ids=take(batch.target_ids),
        segment_ids=jnp.where(valid, dense, 0).astype(segments.dtype),
        positions=take(batch.positions),
        prefix_segment_ids=None,  # attention's, not the loss's
        loss_mask=take(batch.loss_mask) * valid,
        advantages=take(batch.advantages) * valid,
        old_logprobs=take(batch.old_logprobs) * valid,
    )


def loss_position_logprobs(
    model: Any,  # a Qwen3ForCausalLM: hidden_states, head_weight, config
    batch: TrainBatch | SharedPromptBatch,
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    with_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None, TrainBatch]:
    """(log-probs [B, K], entropies [B, K] or None, the loss rows at their loss positions).

    Runs the transformer over all T positions but the LM head only at the K
    loss positions (`batch.loss_index`): exact, and far cheaper when the loss
    covers a small part of each row; the head and log-softmax run `chunk_size`
    tokens at a time (`rl/head_logprobs.py`; None: `auto_chunk_size` of the
    vocabulary). A SharedPromptBatch runs each group's prompt once
    (`rl/shared_prompts.py`); its B rows are its episodes.
    """
    if isinstance(batch, SharedPromptBatch):
        hidden, batch = shared_prompt_hidden_states(model, batch)
    else:
        hidden = model.hidden_states(
            batch.input_ids,
            batch.positions,
            segment_ids=batch.segment_ids,
            prefix_segment_ids=batch.prefix_segment_ids,
        )
    index = jnp.where(batch.loss_index >= 0, batch.loss_index, 0)
    view = at_loss_positions(batch)
    weight, tied = model.head_weight()
    logp, entropy = head_logprobs(
        jnp.take_along_axis(hidden, index[..., None], axis=1),
        weight,
        view.target_ids,
        dtype=model.config.dtype,
        temperature=temperature,
        chunk_size=chunk_size or auto_chunk_size(model.config.vocab_size),
        tied=tied,
        with_entropy=with_entropy,
    )
    return logp, entropy, view


@nnx.jit(static_argnames=("temperature",))
def compute_logprobs(model: nnx.Module, batch: TrainBatch, temperature: float = 1.0) -> jax.Array:
    """Jitted log p(target_ids[t]) at temperature T, [B, T] (reference model, evaluation)."""
    return model_logprobs(model, batch, temperature)[0]


def _masked_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
    return (values * mask).sum()


def _masked_extreme(values: jax.Array, mask: jax.Array, fn, fill: float) -> jax.Array:
    return fn(jnp.where(mask > 0, values, fill))


@OBJECTIVES.register("grpo")
def grpo_objective(
    model: nnx.Module,
    ref_model: nnx.Module | None,
    micro: TrainBatch,
    denominator: jax.Array,
    config: Any,
    *,
    proximal_logprobs: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
    """loss = policy_loss + kl_coef · KL − entropy_coef · H, each aggregated by `config.agg`.

    π_old, the policy of the PPO ratio ρ = π / π_old:
      `proximal_logprobs` given (the learner's log-probs at the loss positions
        before a batch's first mini-batch update): those.
      else without `tis_cap`: the rollout log-probs (π_old = π_rollout).
      else: the learner itself (one update per batch, so π_old = stop_gradient(π)
        at this step's parameters).
    With `tis_cap`, the gap between π_old and the rollout engine's policy (kernels,
    precision, or the policy versions an asynchronous rollout lags behind) is
    corrected by w = min(exp(log π_old − log π_rollout), C).
    """
    micro_full = micro
    logp, entropy, micro = loss_position_logprobs(
        model, micro_full, config.temperature, chunk_size=config.lm_head_chunk
    )
    assert entropy is not None
    mask, rollout = micro.loss_mask, micro.old_logprobs
    agg = dict(segment_ids=micro.segment_ids, norm_length=config.norm_length)
    if proximal_logprobs is not None:
        old = jax.lax.stop_gradient(proximal_logprobs.reshape(logp.shape))
    elif config.tis_cap is None:
        old = rollout
    else:
        old = jax.lax.stop_gradient(logp)
    cap, weights = config.tis_cap, None
    if cap is not None:
        weights = grpo.truncated_importance_weights(old, rollout, cap)
    pg_loss, pg = grpo.POLICY_LOSSES.get(config.loss)(
        logp,
        old,
        micro.advantages,
        mask,
        config,
        importance_weights=weights,
        denominator=denominator,
        segment_ids=micro.segment_ids,
    )
    num_tokens = jnp.maximum(mask.sum(), 1.0)  # the loss's token-means are over this count
    ratio = jnp.exp(logp - old)
    stats = {
        "total/pg_loss": pg_loss,
        "token/entropy": _masked_sum(entropy, mask),
        "token/logprob_gap": _masked_sum(jnp.abs(logp - rollout), mask),
        "token/ratio_mean": _masked_sum(ratio, mask),
        "max/ratio_max": _masked_extreme(ratio, mask, jnp.max, -jnp.inf),
        "min/ratio_min": _masked_extreme(ratio, mask, jnp.min, jnp.inf),
    }
    for name, value in pg.items():  # the loss's own token-means (e.g. clip fractions)
        if name not in ("loss_sum", "loss_denominator") and f"token/{name}" not in stats:
            stats[f"token/{name}"] = value * num_tokens
    if cap is not None and weights is not None:
        stats["token/tis_weight_mean"] = _masked_sum(weights, mask)
        stats["token/tis_capped_frac"] = _masked_sum(weights >= cap, mask)
        stats["max/tis_weight_max"] = _masked_extreme(weights, mask, jnp.max, -jnp.inf)
        stats["min/tis_weight_min"] = _masked_extreme(weights, mask, jnp.min, jnp.inf)
    loss = pg_loss
    if config.kl_coef:
        if ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        ref_logp, _, _ = loss_position_logprobs(
            ref_model,
            micro_full,
            config.temperature,
            chunk_size=config.lm_head_chunk,
            with_entropy=False,
        )
        kl = grpo.kl_penalty(logp, jax.lax.stop_gradient(ref_logp), config.kl_type)
        kl_loss = aggregate(kl, mask, config.agg, denominator=denominator, **agg)[0]
        loss = loss + config.kl_coef * kl_loss
        stats["total/kl_loss"] = kl_loss
        stats["token/kl"] = _masked_sum(kl, mask)
    if config.entropy_coef:
        entropy_loss = aggregate(entropy, mask, config.agg, denominator=denominator, **agg)[0]
        loss = loss - config.entropy_coef * entropy_loss
    stats["total/loss"] = loss
    return loss, stats


@OBJECTIVES.register("sft")
def sft_objective(
    model: nnx.Module,
    ref_model: nnx.Module | None,
    micro: TrainBatch,
    denominator: jax.Array,
    config: Any,
) -> tuple[jax.Array, dict]:
    """loss = mean NLL of the loss-masked target tokens (aggregated by `config.agg`).

    Always at temperature 1: SFT fits the distribution itself, not a sampler of it.
    """
    del ref_model
    logp, _, micro = loss_position_logprobs(
        model, micro, 1.0, chunk_size=config.lm_head_chunk, with_entropy=False
    )
    loss, _ = sft_loss(
        logp,
        micro.loss_mask,
        agg=config.agg,
        segment_ids=micro.segment_ids,
        norm_length=config.norm_length,
        denominator=denominator,
    )
    return loss, {"total/loss": loss, "token/nll": _masked_sum(-logp, micro.loss_mask)}


def empty_stats(shapes: dict) -> dict:
    """The identity of `combine_stats`: 0 for sums, −inf for maxima, +inf for minima."""
    fill = {"max": -jnp.inf, "min": jnp.inf}
    return {
        name: jnp.full(s.shape, fill.get(name.split("/")[0], 0.0), s.dtype)
        for name, s in shapes.items()
    }


def combine_stats(a: dict, b: dict) -> dict:
    """Merges two micro-batches' stats by their prefix rule (see module docstring)."""
    out = {}
    for name, value in a.items():
        if name.startswith("max/"):
            out[name] = jnp.maximum(value, b[name])
        elif name.startswith("min/"):
            out[name] = jnp.minimum(value, b[name])
        else:
            out[name] = value + b[name]
    return out


def finalize_stats(stats: dict, num_tokens: jax.Array) -> dict:
    """Strips prefixes; "token/" sums become means over the batch's loss tokens."""
    out = {}
    for name, value in stats.items():
        kind, short = name.split("/", 1)
        out[short] = value / jnp.maximum(num_tokens, 1.0) if kind == "token" else value
    return out
