"""GRPO math, hand-computed: advantages, filters, clipped loss, aggregations, KL."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestra_jax.rl import grpo
from orchestra_jax.rl.aggregation import aggregate, loss_denominator, loss_sum
from orchestra_jax.rl.sft import sft_loss


def test_group_advantages_hand_computed():
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    # group 1: mean .25, sample std sqrt((.5625 + 3 * .0625) / 3) = .5; group 2 all equal -> 0
    np.testing.assert_allclose(
        grpo.group_advantages(rewards, 4, eps=0.0)[:4], [1.5, -0.5, -0.5, -0.5], rtol=1e-6
    )
    assert grpo.group_advantages(rewards, 4)[4:].tolist() == [0.0] * 4
    np.testing.assert_allclose(
        grpo.group_advantages(rewards, 4, eps=0.0, clip=1.0)[:4], [1.0, -0.5, -0.5, -0.5], rtol=1e-6
    )
    np.testing.assert_allclose(
        grpo.ADVANTAGES.get("dr_grpo")(rewards, 4)[:4], [0.75, -0.25, -0.25, -0.25]
    )


def test_group_advantages_bad_input():
    with pytest.raises(ValueError, match="groups of 3"):
        grpo.group_advantages([1.0, 2.0], 3)
    with pytest.raises(ValueError, match="group_size >= 2"):
        grpo.group_advantages([1.0, 2.0], 1)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        grpo.ADVANTAGES.get("gae")


def test_group_filters():
    rewards = [0.0, 1.0, 0.5, 0.5, 0.0, 0.1]  # stds: .707, 0, .0707
    assert grpo.reward_std_filter(rewards, 2, threshold=0.1).tolist() == [True, True] + [False] * 4
    assert grpo.format_filter([True, False]).tolist() == [True, False]
    assert grpo.answer_filter([0, 1, 0, 0], 2).tolist() == [True, True, False, False]


# ratio, advantage, expected per-token loss, which clip is active
CASES = [
    (1.5, 2.0, -2.0 * 1.28, "clipped_high"),  # A > 0, ratio above 1 + eps_high
    (0.5, 2.0, -2.0 * 0.5, None),  # A > 0, ratio low: unclipped
    (1.1, 2.0, -2.0 * 1.1, None),  # inside the trust region
    (0.5, -2.0, 2.0 * 0.8, "clipped_low"),  # A < 0, ratio below 1 - eps_low
    (5.0, -2.0, 2.0 * 5.0, None),  # A < 0, ratio high, under dual clip
    (20.0, -2.0, 2.0 * 10.0, "dual_clipped"),  # A < 0, beyond dual clip c = 10
    (3.0, 0.0, 0.0, None),  # zero advantage
]


@pytest.mark.parametrize("ratio,adv,expected,active", CASES)
def test_ppo_clip_corners(ratio, adv, expected, active):
    logp = jnp.full((1, 1), math.log(ratio))
    losses, flags = grpo.ppo_token_losses(
        logp, jnp.zeros((1, 1)), jnp.array([adv]), clip_low=0.2, clip_high=0.28, dual_clip=10.0
    )
    np.testing.assert_allclose(losses[0, 0], expected, rtol=1e-5)
    for name in ("clipped_low", "clipped_high", "dual_clipped"):
        assert flags[name][0, 0] == float(name == active), name
    grad = jax.grad(
        lambda lp: grpo.ppo_token_losses(lp, jnp.zeros((1, 1)), jnp.array([adv]), dual_clip=10.0)[
            0
        ].sum()
    )(logp)
    # gradient is -A * ratio when unclipped, zero when any clip is active
    np.testing.assert_allclose(grad[0, 0], 0.0 if active else -adv * ratio, rtol=1e-5, atol=1e-7)


def test_policy_loss_token_mean_and_metrics():
    ratios = jnp.array([[1.5, 0.5, 1.0, 7.0], [0.5, 20.0, 1.0, 1.0]])
    adv = jnp.array([2.0, -2.0])
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    loss, m = grpo.policy_loss(jnp.log(ratios), jnp.zeros_like(ratios), adv, mask, dual_clip=10.0)
    expected = (-2.56 - 1.0 - 2.0 + 1.6 + 20.0) / 5
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert float(m["loss_denominator"]) == 5.0
    np.testing.assert_allclose(
        [m["pg_clip_frac_high"], m["pg_clip_frac_low"], m["dual_clip_frac"]], [0.2, 0.2, 0.2]
    )
    weights = jnp.full(ratios.shape, 0.5)
    half, _ = grpo.policy_loss(
        jnp.log(ratios),
        jnp.zeros_like(ratios),
        adv,
        mask,
        dual_clip=10.0,
        importance_weights=weights,
    )
    np.testing.assert_allclose(half, expected / 2, rtol=1e-5)


def test_aggregations_hand_computed_with_packing():
    v = jnp.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    mask = jnp.array([[1, 1, 1, 0], [0, 1, 0, 1]])
    seg = jnp.array([[1, 1, 2, 0], [1, 1, 1, 1]])  # row 0 packs two sequences
    # sequences: (0,1): {1,2}, (0,2): {3}, (1,1): {6,8}
    np.testing.assert_allclose(aggregate(v, mask, "token-mean", segment_ids=seg)[0], 20 / 5)
    np.testing.assert_allclose(
        aggregate(v, mask, "seq-mean-token-mean", segment_ids=seg)[0],
        (1.5 + 3.0 + 7.0) / 3,
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        aggregate(v, mask, "seq-mean-token-sum-norm", segment_ids=seg, norm_length=10)[0],
        (3 / 10 + 3 / 10 + 14 / 10) / 3,
        rtol=1e-6,
    )
    # without segment ids every row is one sequence
    np.testing.assert_allclose(aggregate(v, mask, "seq-mean-token-mean")[0], (2.0 + 7.0) / 2)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(v, mask, "sum")


def test_empty_mask_gives_zero_loss():
    loss, _, _ = aggregate(jnp.ones((1, 3)), jnp.zeros((1, 3)), "seq-mean-token-mean")
    assert float(loss) == 0.0


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_sums_add_up_to_full_batch_loss(agg):
    rng = np.random.default_rng(0)
    v = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
    mask = jnp.asarray(rng.integers(0, 2, size=(6, 5)))
    seg = jnp.asarray(rng.integers(1, 3, size=(6, 5)))
    full, _, _ = aggregate(v, mask, agg, segment_ids=seg)
    denom = loss_denominator(mask, agg, segment_ids=seg)
    parts = sum(
        loss_sum(v[i : i + 2], mask[i : i + 2], agg, segment_ids=seg[i : i + 2])
        for i in range(0, 6, 2)
    )
    np.testing.assert_allclose(parts / denom, full, rtol=1e-6)


def test_kl_penalties_hand_computed_and_zero_at_reference():
    logp, ref = jnp.array([-1.0, -2.0]), jnp.array([-1.5, -2.0])
    np.testing.assert_allclose(grpo.kl_penalty(logp, ref, "k1"), [0.5, 0.0])
    np.testing.assert_allclose(grpo.kl_penalty(logp, ref, "mse"), [0.125, 0.0])
    np.testing.assert_allclose(
        grpo.kl_penalty(logp, ref, "k3"), [math.exp(-0.5) - 1 + 0.5, 0.0], rtol=1e-6
    )
    with pytest.raises(ValueError, match="unknown KL penalty"):
        grpo.kl_penalty(logp, ref, "k2")


def test_truncated_importance_weights():
    w = grpo.truncated_importance_weights(
        jnp.array([0.0, 0.0, -1.0]), jnp.array([0.0, -3.0, 0.0]), cap=2.0
    )
    np.testing.assert_allclose(w, [1.0, 2.0, math.exp(-1.0)], rtol=1e-6)


def test_token_logprobs_entropy_and_temperature():
    logits = jnp.array([[[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]]])
    targets = jnp.array([[1, 0]])
    lp = grpo.token_logprobs(logits, targets, temperature=2.0)
    np.testing.assert_allclose(lp[0, 0], -math.log(4), rtol=1e-6)
    np.testing.assert_allclose(lp[0, 1], 1.0 - math.log(math.e + 3), rtol=1e-6)  # logits / 2
    ent = grpo.entropy_from_logits(logits)
    np.testing.assert_allclose(ent[0, 0], math.log(4), rtol=1e-6)
    p = np.exp([2.0, 0, 0, 0]) / np.exp([2.0, 0, 0, 0]).sum()
    np.testing.assert_allclose(ent[0, 1], -(p * np.log(p)).sum(), rtol=1e-5)


def test_sft_loss_is_masked_mean_nll():
    loss, m = sft_loss(jnp.array([[-1.0, -2.0, -9.0]]), jnp.array([[1, 1, 0]]))
    np.testing.assert_allclose(loss, 1.5)
    assert float(m["loss_denominator"]) == 2.0


def test_format_penalty_rewards_replace_malformed_episodes_only():
    out = grpo.format_penalty_rewards([0.5, 1.0, 0.0], [True, False, True], penalty=-2.0)
    assert out.tolist() == [0.5, -2.0, 0.0]


def test_advantage_boost_adds_to_advantages_of_at_least_one():
    # b = 0.1, τ = 1: 1.5 and 1.0 get +0.1; 0.9999999 (1 in float32 arithmetic,
    # within the reference's 1e-5) too; 0.99, 0 and −1.2 are unchanged.
    adv = [1.5, 1.0, 0.9999999, 0.99, 0.0, -1.2]
    np.testing.assert_allclose(
        grpo.boost_advantages(adv, 0.1), [1.6, 1.1, 1.1, 0.99, 0.0, -1.2], rtol=1e-6
    )
    np.testing.assert_array_equal(grpo.boost_advantages(adv, 0.0), np.float32(adv))
    # After group_advantages: rewards (1, 0, 0, 0) -> (1.5, −0.5, −0.5, −0.5), boosted 1.6.
    boosted = grpo.boost_advantages(grpo.group_advantages([1.0, 0.0, 0.0, 0.0], 4, eps=0.0), 0.1)
    np.testing.assert_allclose(boosted, [1.6, -0.5, -0.5, -0.5], rtol=1e-6)


def test_answered_filter_is_per_episode():
    # Group filter: a group with one answer keeps both; per episode: only the answer.
    assert grpo.answer_filter([1, 0, 0, 0], 2).tolist() == [True, True, False, False]
    assert grpo.answered_filter([True, False, False, False]).tolist() == [
        True,
        False,
        False,
        False,
    ]
