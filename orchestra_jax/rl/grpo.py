"""GRPO's math as small pure functions: advantages, filters, policy loss, KL.

Shapes: rewards and per-episode masks are flat [N] arrays ordered group by group
(G consecutive episodes per task); per-token arrays are [B, T] and aligned with
*targets*: index t holds quantities of the token predicted at position t.

Registries (config strings, or "package.module:attr" for one's own):
  ADVANTAGES     `rl.advantage`: (rewards [N], group_size, *, clip) -> advantages [N]
  POLICY_LOSSES  `rl.loss`: a `PolicyLossFn` (see there)
  KL_PENALTIES   `rl.kl_type`: (logprobs, ref_logprobs) -> per-token KL estimate
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from orchestra_jax.registry import Registry
from orchestra_jax.rl.aggregation import aggregate


class PolicyLossFn(Protocol):
    """One signature for every policy loss (as verl's `PolicyLossFn`).

        loss, metrics = fn(logprobs, old_logprobs, advantages, loss_mask, config,
                           importance_weights=w, denominator=d, segment_ids=s)

    Per-token arrays are [B, T]; `advantages` is [B] or [B, T]. `config` is the
    learner's (`rl/learner.LearnerConfig`: clip ranges, `agg`, `norm_length`, …).
    `importance_weights` (or None) multiply each token's loss; `denominator` is
    the full batch's loss denominator (micro-batch losses then add up to the
    batch's); `segment_ids` tell packed sequences apart for the aggregation.
    `metrics` holds "loss_sum", "loss_denominator" and any number of token-means
    over the loss tokens (the learner logs them by name).
    """

    def __call__(
        self,
        logprobs: jax.Array,
        old_logprobs: jax.Array,
        advantages: jax.Array,
        loss_mask: jax.Array,
        config: Any,
        *,
        importance_weights: jax.Array | None = None,
        denominator: jax.Array | float | None = None,
        segment_ids: jax.Array | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]: ...


ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
KL_PENALTIES = Registry("KL penalty")


def _groups(values, group_size: int, what: str) -> jax.Array:
    values = jnp.asarray(values, jnp.float32)
    if values.ndim != 1:
        raise ValueError(f"{what} must be a flat [N] array, got shape {values.shape}")
    if group_size < 1 or values.shape[0] % group_size:
        raise ValueError(f"{values.shape[0]} {what} do not split into groups of {group_size}")
    return values.reshape(-1, group_size)


def _group_std(groups: jax.Array) -> jax.Array:
    if groups.shape[1] < 2:
        raise ValueError("a group standard deviation needs group_size >= 2")
    return groups.std(axis=1, ddof=1, keepdims=True)


@ADVANTAGES.register("grpo")
def group_advantages(
    rewards,
    group_size: int,
    *,
    eps: float = 1e-6,
    scale_by_std: bool = True,
    clip: float | None = None,
) -> jax.Array:
    """A_i = clip((r_i − mean_g) / (std_g + eps), −clip, clip) within each group g.

    std_g is the sample standard deviation (ddof = 1); with `scale_by_std=False`
    A_i = r_i − mean_g (Dr. GRPO). A group whose rewards are all equal gets A = 0.
    """
    groups = _groups(rewards, group_size, "rewards")
    centred = groups - groups.mean(axis=1, keepdims=True)
    if scale_by_std:
        centred = centred / (_group_std(groups) + eps)
    if clip is not None:
        centred = jnp.clip(centred, -clip, clip)
    return centred.reshape(-1)


ADVANTAGES.register("dr_grpo", functools.partial(group_advantages, scale_by_std=False))


def reward_std_filter(rewards, group_size: int, *, threshold: float = 0.1) -> jax.Array:
    """keep_i = std_g > threshold for the group g of episode i (sample std, ddof = 1).

    Groups whose rewards barely differ carry no ranking signal (the reference
    drops std <= 0.1).
    """
    groups = _groups(rewards, group_size, "rewards")
    keep = _group_std(groups) > threshold
    return jnp.broadcast_to(keep, groups.shape).reshape(-1)


# What happens to malformed tool calls: "turn" (reference) takes those turns out
# of the loss, "episode" drops episodes with any, "off" trains on them, and
# "penalty" trains on them with a fixed low reward (`format_penalty_rewards`).
FORMAT_FILTERS = ("turn", "episode", "off", "penalty")
DEFAULT_FORMAT_PENALTY = -1.0  # below every reward the reward registry produces


def format_filter(format_valid) -> jax.Array:
    """keep_i = episode i wrote only well-formed tool calls (`Trajectory.format_valid`)."""
    return jnp.asarray(format_valid, dtype=bool).reshape(-1)


def format_penalty_rewards(rewards, format_valid, penalty: float) -> jax.Array:
    """r_i for well-formed episodes, `penalty` for episodes with a malformed call.

    With a penalty below every reachable reward, a malformed episode ranks last
    in its group, so its advantage is negative and the update pushes the policy
    away from the malformed call (a format reward). Filtering malformed turns
    out instead (the reference) teaches nothing about the format, which a
    policy too small to have a format prior can then lose under updates that
    push down the tokens of valid but poor calls.
    """
    rewards = jnp.asarray(rewards, jnp.float32).reshape(-1)
    valid = jnp.asarray(format_valid, dtype=bool).reshape(-1)
    return jnp.where(valid, rewards, jnp.float32(penalty))


def answered_filter(answered) -> jax.Array:
    """keep_i = episode i answered (`rl.drop_no_answer`), whatever its group did.

    Per episode, so it drops every sample an episode makes, one or one per
    turn. The reference keeps only turn samples of rollouts with a valid answer
    (`valid_answers` in `LLMGenerationManager.run_llm_loop`,
    training/lead_agent/llm_agent/generation_quick3.py), after their rewards
    and advantages were computed over the whole group.
    """
    return jnp.asarray(answered, dtype=bool).reshape(-1)


# The reference's boost: on samples with A ≥ 1 (its threshold, less 1e-5).
ADVANTAGE_BOOST_THRESHOLD = 1.0


def boost_advantages(
    advantages, boost: float, *, threshold: float = ADVANTAGE_BOOST_THRESHOLD
) -> jax.Array:
    """Â_i = A_i + b · [A_i ≥ τ − 1e-5], with b = `boost` (`rl.advantage_boost`), τ = `threshold`.

    A_i is the episode's group advantage after clipping; b = 0 returns A
    unchanged. The reference adds b = 0.1 to every sample whose advantage is
    at least τ = 1 ("correct sample advantage boost": `boost_high_score_advantages`
    in training/verl/nvidia/utils/utils.py, called by `DataParallelPPOActor.
    update_policy` in training/verl/workers/actor/dp_actor.py, whose "scores"
    are the advantages there). The boosted advantages of a group no longer
    sum to 0.
    """
    advantages = jnp.asarray(advantages, jnp.float32)
    if boost == 0:
        return advantages
    return jnp.where(advantages >= threshold - 1e-5, advantages + boost, advantages)


def answer_filter(has_valid_answer, group_size: int) -> jax.Array:
    """keep_i = at least one episode of i's group produced a valid final answer.

    A group where nobody answered (all hit max turns / context / errors) only
    teaches the format, and rewards are all zero anyway.
    """
    groups = _groups(has_valid_answer, group_size, "answer flags") > 0
    return jnp.broadcast_to(groups.any(axis=1, keepdims=True), groups.shape).reshape(-1)


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log softmax(logits / T)[target] per position: [B, T, V], [B, T] -> [B, T] float32."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def entropy_from_logits(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """H = logsumexp(z) − Σ_v softmax(z)_v z_v with z = logits / T, per position [B, T]."""
    z = logits.astype(jnp.float32) / temperature
    return jax.nn.logsumexp(z, axis=-1) - (jax.nn.softmax(z, axis=-1) * z).sum(axis=-1)


@KL_PENALTIES.register("k1")
def kl_k1(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """k1 = Δ with Δ = log π − log π_ref (unbiased, can be negative per token)."""
    return logprobs - ref_logprobs


@KL_PENALTIES.register("mse")
def kl_mse(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """k2 = ½ Δ² with Δ = log π − log π_ref (the reference uses it, coefficient 1e-4)."""
    return 0.5 * jnp.square(logprobs - ref_logprobs)


@KL_PENALTIES.register("k3")
def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """k3 = exp(−Δ) − 1 + Δ with Δ = log π − log π_ref (≥ 0, unbiased for KL(π‖π_ref))."""
    delta = logprobs - ref_logprobs
    return jnp.exp(-delta) - 1.0 + delta


def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, kind: str = "mse") -> jax.Array:
    """Per-token KL estimate `kind` ∈ {"k1", "mse", "k3"} (see the registered functions)."""
    return KL_PENALTIES.get(kind)(logprobs, ref_logprobs)


def truncated_importance_weights(
    old_logprobs: jax.Array, rollout_logprobs: jax.Array, cap: float
) -> jax.Array:
    """w = min(exp(log π_old − log π_rollout), C), no gradient.

    Corrects for the rollout engine sampling from a slightly different
    distribution than the learner computes (kernels, precision).
    """
    if cap <= 0:
        raise ValueError(f"importance-weight cap must be > 0, got {cap}")
    w = jnp.minimum(jnp.exp(old_logprobs - rollout_logprobs), cap)
    return jax.lax.stop_gradient(w)


def ppo_token_losses(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token clipped surrogate and where each clip is active.

        ρ  = exp(log π − log π_old)
        ℓ  = max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high))
        ℓ ← min(ℓ, −A c)   where A < 0, with dual clip c > 1

    Indicators (1.0 where the clip removes the gradient): "clipped_low" (A < 0,
    ρ < 1 − ε_low), "clipped_high" (A > 0, ρ > 1 + ε_high), "dual_clipped"
    (A < 0, ρ > c). `advantages` may be [B] (one per row) or [B, T].
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual clip c must be > 1, got {dual_clip}")
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    advantages = jnp.broadcast_to(advantages, logprobs.shape)
    ratio = jnp.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    losses = jnp.maximum(unclipped, clipped)
    negative = advantages < 0
    flags = {
        "clipped_low": (negative & (ratio < 1.0 - clip_low)).astype(jnp.float32),
        "clipped_high": ((advantages > 0) & (ratio > 1.0 + clip_high)).astype(jnp.float32),
        "dual_clipped": jnp.zeros_like(ratio),
    }
    if dual_clip is not None:
        dual = negative & (ratio > dual_clip)
        losses = jnp.where(dual, -advantages * dual_clip, losses)
        flags["dual_clipped"] = dual.astype(jnp.float32)
    return losses, {"ratio": ratio, **flags}


METRIC_NAMES = {
    "ratio": "ratio_mean",
    "clipped_low": "pg_clip_frac_low",
    "clipped_high": "pg_clip_frac_high",
    "dual_clipped": "dual_clip_frac",
}


def policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    segment_ids: jax.Array | None = None,
    norm_length: int | None = None,
    importance_weights: jax.Array | None = None,
    denominator: jax.Array | float | None = None,
) -> tuple[jax.Array, dict]:
    """PPO clipped surrogate (see `ppo_token_losses`), weighted and aggregated.

        loss = agg_sum(w ⊙ ℓ) / denominator

    with w the truncated importance weights (1 when None) and the aggregation
    `agg` of `rl/aggregation.py`. Give the full batch's `denominator` to make
    micro-batch losses add up to the full-batch loss.

    Returns (loss, metrics): metrics hold "loss_sum", "loss_denominator" and the
    token-means over loss tokens of the ratio and of the clip indicators
    ("pg_clip_frac_low", "pg_clip_frac_high", "dual_clip_frac").
    """
    losses, flags = ppo_token_losses(
        logprobs,
        old_logprobs,
        advantages,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
    )
    if importance_weights is not None:
        losses = losses * importance_weights
    loss, total, denom = aggregate(
        losses,
        loss_mask,
        agg,
        segment_ids=segment_ids,
        norm_length=norm_length,
        denominator=denominator,
    )
    mask = loss_mask.astype(jnp.float32)
    num_tokens = jnp.maximum(mask.sum(), 1.0)
    metrics = {"loss_sum": total, "loss_denominator": denom}
    for flag, name in METRIC_NAMES.items():
        metrics[name] = (flags[flag] * mask).sum() / num_tokens
    return loss, metrics


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    config: Any,
    *,
    importance_weights: jax.Array | None = None,
    denominator: jax.Array | float | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
    """`policy_loss` as a `PolicyLossFn`: clip ranges, dual clip and aggregation
    from `config` (`clip_low`, `clip_high`, `dual_clip`, `agg`, `norm_length`)."""
    return policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        dual_clip=config.dual_clip,
        agg=config.agg,
        segment_ids=segment_ids,
        norm_length=config.norm_length,
        importance_weights=importance_weights,
        denominator=denominator,
    )
