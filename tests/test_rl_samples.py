"""Sample units: turn samples' tokens, masks and advantages; ⌈N / minibatch_size⌉
updates a step with π_old the learner's, mini-batches of minibatch_size samples in
order with the remainder last, placeholder rows that change nothing."""

import dataclasses

import jax
import numpy as np
import pytest

from orchestra_jax.agent.context import RebuildContext
from orchestra_jax.rl.batching import BatchingConfig, build_train_batch, place_minibatches
from orchestra_jax.rl.learner import Learner, LearnerConfig
from orchestra_jax.rl.samples import SAMPLE_UNITS, episode_samples, samples_of, turn_samples
from tests.test_agent_context import rebuild_episode
from tests.test_agent_loop import THREE_TURNS, TOK, FakeTool, call, run, scripted, spec
from tests.test_rl_learner import CONFIG, new_model


def generated(text):
    return TOK.encode(text + "<|im_end|>")


def test_rebuilt_turns_are_samples_of_their_own_prompt_and_generation():
    traj, requests, script = rebuild_episode()
    traj.advantage = 0.75
    samples = turn_samples([traj])
    assert [s.turn for s in samples] == [0, 1, 2]
    for s, ids, text in zip(samples, requests, script):
        gen = generated(text)
        assert s.token_ids == ids + gen
        assert s.loss_mask == [0] * len(ids) + [1] * len(gen)
        assert s.advantage == 0.75 and s.task_id == "t0"
        lp = s.rollout_logprobs
        assert lp[: len(ids)] == [0.0] * len(ids) and all(x < 0 for x in lp[len(ids) :])


def test_history_turns_are_prefixes_with_the_loss_on_their_own_turn_only():
    tools = [FakeTool("search", "hits"), FakeTool("answer", final=True)]
    engine = scripted({"t0/0": THREE_TURNS})
    [traj] = run([spec(tools)], engine)
    traj.advantage = -1.5
    samples = turn_samples([traj])
    assert len(samples) == 3
    for s, request, text in zip(samples, engine.requests, THREE_TURNS):
        ids, gen = list(request.input_ids), generated(text)
        assert s.token_ids == ids + gen  # the sequence so far, then the turn
        assert s.loss_mask == [0] * len(ids) + [1] * len(gen)  # earlier turns masked
        assert s.advantage == -1.5
    assert samples[-1].token_ids == traj.token_ids
    assert episode_samples([traj]) == [traj]
    assert SAMPLE_UNITS.get("turn") is turn_samples
    assert samples_of("orchestra_jax.rl.samples:turn_samples", [traj]) == samples  # one's own


def test_a_malformed_turn_gives_no_sample_under_the_format_filter():
    tools = [FakeTool("search", "hits"), FakeTool("answer", final=True)]
    script = [call("search", q="x"), call("nope", q="y"), call("answer", q="42")]
    [traj] = run([spec(tools)], scripted({"t0/0": script}), context=RebuildContext())
    assert [t.format_valid for t in traj.turns] == [True, False, True]
    traj.advantage = 1.0
    filtered = dataclasses.replace(traj, loss_mask=traj.loss_mask_without_invalid_turns())
    assert [s.turn for s in samples_of("turn", [filtered])] == [0, 2]
    assert [s.turn for s in samples_of("turn", [traj])] == [0, 1, 2]


def test_a_turn_past_the_tokens_fails_clearly():
    [traj] = run([spec([FakeTool("answer", final=True)])], scripted({"t0/0": [call("answer")]}))
    traj.turns[0].prompt_start = 5
    with pytest.raises(ValueError, match="past its"):
        turn_samples([traj])


@dataclasses.dataclass
class Piece:
    token_ids: list
    loss_mask: list
    rollout_logprobs: list
    advantage: float


def pieces(n, seed=0):
    """`n` samples whose rollout log-probs are far from the model's."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(6, 13))
        mask = [0] * 3 + [1] * (length - 3)
        out.append(
            Piece(
                rng.integers(3, CONFIG.vocab_size, length).tolist(),
                mask,
                [-9.0 * m for m in mask],
                float(rng.normal()),
            )
        )
    return out


def test_updates_per_step_are_ceil_samples_over_minibatch_size():
    config = LearnerConfig(learning_rate=1e-3, kl_coef=0.0, minibatch_size=2)
    learner = Learner(new_model(), config)
    assert [learner.minibatches_for(n) for n in (1, 2, 3, 5, 16)] == [1, 1, 2, 3, 8]
    sixteen = Learner(new_model(), dataclasses.replace(config, minibatch_size=16))
    assert [sixteen.minibatches_for(n) for n in (1, 16, 17, 40, 48)] == [1, 1, 2, 3, 3]
    samples = pieces(5)
    n = learner.minibatches_for(len(samples))
    batch = build_train_batch(
        samples,
        config=BatchingConfig(
            seq_buckets=(16,), row_multiple=learner.row_multiple(num_minibatches=n)
        ),
    )
    metrics = learner.train_step(batch, num_minibatches=n)
    assert metrics["updates"] == 3.0 and learner.step == 3 and metrics["skipped"] == 0.0


def test_old_logprobs_are_the_learners_before_the_first_update():
    """One mini-batch: ρ = π / π_old = 1 although the rollout log-probs are −9."""
    learner = Learner(new_model(), LearnerConfig(kl_coef=0.0, minibatch_size=16))
    batch = build_train_batch(pieces(4, seed=1), config=BatchingConfig(seq_buckets=(16,)))
    metrics = learner.train_step(batch, num_minibatches=learner.minibatches_for(4))
    assert metrics["updates"] == 1.0
    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, atol=1e-5)
    np.testing.assert_allclose([metrics["ratio_min"], metrics["ratio_max"]], 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        LearnerConfig(minibatch_size=16, num_minibatches=2)


def placed(samples, sizes, rows):
    batch = build_train_batch(samples, config=BatchingConfig(seq_buckets=(16,)))
    return place_minibatches(batch, sizes, rows)


def test_minibatches_hold_minibatch_size_samples_in_order_then_the_remainder():
    learner = Learner(new_model(), LearnerConfig(kl_coef=0.0, minibatch_size=3))
    assert [learner.minibatch_sizes(n) for n in (1, 3, 7, 9)] == [[1], [3], [3, 3, 1], [3, 3, 3]]
    assert [learner.minibatch_rows(n) for n in (1, 2, 3, 7)] == [1, 2, 4, 4]
    assert Learner(new_model(), LearnerConfig(kl_coef=0.0)).minibatch_sizes(7) is None
    samples = pieces(7)
    batch = placed(samples, [3, 3, 1], 4)
    assert batch.shape[0] == 12
    for i, members in enumerate([[0, 1, 2], [3, 4, 5], [6]]):
        rows = np.asarray(batch.input_ids)[i::3]
        for j, k in enumerate(members):
            ids = samples[k].token_ids[:-1]
            assert rows[j, : len(ids)].tolist() == ids
        empty = slice(len(members), None)  # placeholders: nothing to train on
        assert not np.asarray(batch.loss_mask)[i::3][empty].any()
        assert not np.asarray(batch.segment_ids)[i::3][empty].any()
        assert (np.asarray(batch.loss_index)[i::3][empty] == -1).all()
    with pytest.raises(ValueError, match="fit 2 rows"):
        place_minibatches(build_train_batch(samples), [3, 3, 1], 2)


def test_placeholder_rows_change_no_update_and_the_remainder_is_scaled():
    """The same mini-batch padded to 4 or to 16 rows gives the same loss, gradient and
    parameters; a remainder of one sample in mini-batches of 3 moves by a third of its
    gradient."""
    samples = pieces(3, seed=2)
    params, metrics = {}, {}
    for rows in (4, 16):
        config = LearnerConfig(learning_rate=1e-3, kl_coef=0.0, minibatch_size=3)
        learner = Learner(new_model(), config)
        metrics[rows] = learner.train_step(
            placed(samples, [3], rows), num_minibatches=1, minibatch_sizes=[3]
        )
        params[rows] = jax.device_get(learner.params)
    for name in ("loss", "grad_norm", "num_loss_tokens"):
        np.testing.assert_allclose(metrics[4][name], metrics[16][name], rtol=1e-5)
    jax.tree.map(  # Adam's first step is ±lr where |g| >> eps: compare at 1 % of lr
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params[4], params[16]
    )
    norms = {}
    for size in (1, 3):
        learner = Learner(new_model(), LearnerConfig(kl_coef=0.0, minibatch_size=size))
        norms[size] = learner.train_step(
            placed(samples[:1], [1], 4), num_minibatches=1, minibatch_sizes=[1]
        )["grad_norm"]
    np.testing.assert_allclose(norms[3], norms[1] / 3, rtol=1e-5)
