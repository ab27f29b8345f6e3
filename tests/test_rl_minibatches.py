"""PPO mini-batches and epochs: the ratio leaves 1, the clips act, 1 × 1 is one update."""

import dataclasses

import jax
import numpy as np
import pytest

from orchestra_jax.rl.learner import Learner, LearnerConfig, compute_logprobs
from tests.test_rl_learner import make_batch, new_model, params_of

# Big first Adam steps (small eps): the policy moves far enough in one update that
# the next mini-batch's ratios cross the clip ranges.
MOVING = LearnerConfig(learning_rate=0.1, adam_eps=1e-8, kl_coef=0.0, dual_clip=3.0)


def on_policy_batch(seed=0, episodes=4):
    """Each of `episodes` episodes twice (rows 2j, 2j + 1: one in each of two strided
    mini-batches), with the initial model's own log-probs as rollout log-probs, so
    ρ = 1 at first and the first mini-batch's update moves the second's ratios."""
    batch = make_batch(seed=seed, rows=episodes, row_multiple=episodes)
    batch = jax.tree.map(lambda x: np.repeat(np.asarray(x), 2, axis=0), batch)
    logp = np.asarray(compute_logprobs(new_model(), batch))
    return dataclasses.replace(batch, old_logprobs=logp * np.asarray(batch.loss_mask))


def rows(batch, i, n):
    return jax.tree.map(lambda x: x[i::n], batch)


def same_params(a, b):
    jax.tree.map(np.testing.assert_array_equal, params_of(a), params_of(b))


def test_one_minibatch_one_epoch_is_todays_step_exactly():
    batch = make_batch()
    today = Learner(new_model(), MOVING)
    explicit = Learner(new_model(), dataclasses.replace(MOVING, num_minibatches=1, num_epochs=1))
    want, got = today.train_step(batch), explicit.train_step(batch)
    assert want == got
    same_params(today, explicit)


def test_one_minibatch_through_the_minibatch_path_with_tis_matches():
    """π_old computed up front (the mini-batch path) = stop_gradient(π) in the step."""
    batch = make_batch()
    # adam_eps = 1: the update ≈ lr · g, so the parameters differ by lr times the
    # gradients' round-off. With MOVING's 1e-8 the first update is ≈ lr · g / |g|,
    # which turns a last-bit difference in a gradient near 0 into one of order lr.
    config = dataclasses.replace(MOVING, tis_cap=2.0, adam_eps=1.0)
    a, b = Learner(new_model(), config), Learner(new_model(), config)
    want, got = a.train_step(batch), b.minibatch_updates(batch)
    assert got["updates"] == 1.0
    for name in ("loss", "grad_norm", "ratio_mean", "tis_weight_mean"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, err_msg=name)
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
        params_of(a),
        params_of(b),
    )


def hand_clip_fractions(model, batch, config):
    """Token means of the clip indicators of `rl/grpo.ppo_token_losses`, by hand."""
    logp = np.asarray(compute_logprobs(model, batch), np.float64)
    ratio = np.exp(logp - np.asarray(batch.old_logprobs, np.float64))
    mask = np.asarray(batch.loss_mask) > 0
    adv = np.asarray(batch.advantages)
    high = (adv > 0) & (ratio > 1 + config.clip_high) & mask
    low = (adv < 0) & (ratio < 1 - config.clip_low) & mask
    dual = (adv < 0) & (ratio > config.dual_clip) & mask
    return {
        "pg_clip_frac_high": high.sum() / mask.sum(),
        "pg_clip_frac_low": low.sum() / mask.sum(),
        "dual_clip_frac": dual.sum() / mask.sum(),
    }


def test_clip_fractions_equal_a_hand_computed_case():
    batch = on_policy_batch()
    two = Learner(new_model(), dataclasses.replace(MOVING, num_minibatches=2))
    metrics = two.train_step(batch)
    assert metrics["updates"] == 2.0 and metrics["skipped"] == 0.0
    # The same first update by hand: one step on mini-batch 0, then mini-batch 1's ratios
    # under the parameters it left.
    one = Learner(new_model(), MOVING)
    first = one.train_step(rows(batch, 0, 2))
    for name in ("pg_clip_frac_high", "pg_clip_frac_low", "dual_clip_frac"):
        assert first[name] == 0.0, name  # ρ = 1 on policy: nothing clipped
    second = hand_clip_fractions(one.model, rows(batch, 1, 2), MOVING)
    assert all(value > 0 for value in second.values()), second
    for name, value in second.items():
        np.testing.assert_allclose(metrics[name], (0.0 + value) / 2, atol=1e-6, err_msg=name)
    assert metrics["ratio_max"] > 1 + MOVING.clip_high and metrics["ratio_min"] < 1


def test_epochs_take_the_ratio_off_one_and_count_updates():
    batch = on_policy_batch(seed=1)
    learner = Learner(new_model(), dataclasses.replace(MOVING, num_epochs=3, tis_cap=2.0))
    metrics = learner.train_step(batch)
    assert metrics["updates"] == 3.0 and learner.step == 3
    assert metrics["ratio_max"] > 1.01 or metrics["ratio_min"] < 0.99
    assert metrics["pg_clip_frac_high"] + metrics["pg_clip_frac_low"] > 0
    assert 0 < metrics["tis_weight_min"] <= metrics["tis_weight_max"] <= 2.0


def test_proximal_logprobs_are_the_models_at_the_loss_positions():
    batch = make_batch(seed=2)
    learner = Learner(new_model(), dataclasses.replace(MOVING, micro_batch_size=2, tis_cap=2.0))
    proximal = np.asarray(learner.proximal_logprobs(batch))
    full = np.asarray(compute_logprobs(new_model(), batch))
    index = np.asarray(batch.loss_index)
    valid = index >= 0
    want = np.take_along_axis(full, np.where(valid, index, 0), axis=1)
    np.testing.assert_allclose(proximal[valid], want[valid], rtol=1e-5, atol=1e-5)


def test_minibatch_rows_and_bad_values_fail_clearly():
    learner = Learner(
        new_model(), dataclasses.replace(MOVING, num_minibatches=4, micro_batch_size=2)
    )
    assert learner.row_multiple() == 8
    with pytest.raises(ValueError, match="row_multiple"):
        learner.train_step(make_batch(rows=4, row_multiple=4))
    with pytest.raises(ValueError, match="num_minibatches"):
        LearnerConfig(num_minibatches=0)


def test_sharded_minibatch_updates_equal_unsharded():
    from orchestra_jax.parallel.mesh import make_mesh

    batch = make_batch(seed=3, rows=16, row_multiple=16)
    # adam_eps = 1: updates ≈ lr · g, so float-level gradient differences stay small.
    config = dataclasses.replace(MOVING, adam_eps=1.0, num_minibatches=2, num_epochs=2, tis_cap=2.0)
    plain = Learner(new_model(), config)
    sharded = Learner(
        new_model(), dataclasses.replace(config, micro_batch_size=8), mesh=make_mesh(fsdp=8)
    )
    want, got = plain.train_step(batch), sharded.train_step(batch)
    for name in ("loss", "pg_clip_frac_high", "pg_clip_frac_low", "tis_weight_max"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
        params_of(sharded),
        params_of(plain),
    )
