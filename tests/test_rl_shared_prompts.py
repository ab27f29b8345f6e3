"""Shared-prompt learner batches: the layout, and log-probs, losses and updates
equal to those of the same episodes in an ordinary TrainBatch."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.parallel.mesh import make_mesh
from orchestra_jax.rl.batching import BatchingConfig, build_train_batch
from orchestra_jax.rl.learner import Learner, LearnerConfig
from orchestra_jax.rl.objectives import loss_position_logprobs
from orchestra_jax.rl.shared_prompts import SharedPromptBatch, build_shared_prompt_batch, loss_rows

CONFIG = Qwen3Config.preset("tiny", num_hidden_layers=2)
# adam_eps = 1: the first update is ≈ lr · g, so equal gradients give equal parameters.
EXACT = LearnerConfig(
    learning_rate=0.1, adam_eps=1.0, kl_coef=0.05, clip_low=0.2, clip_high=0.28, dual_clip=10.0
)
BUCKETS = (8, 16, 32, 64)


def episode(prompt, rest, mask, rng):
    ids = list(prompt) + [int(t) for t in rest]
    loss = [0] * len(prompt) + list(mask)
    logprobs = [float(-5.0 + rng.normal(scale=0.3)) if m else 0.0 for m in loss]
    return Trajectory(
        task_id="t",
        group_index=0,
        seed=0,
        token_ids=ids,
        loss_mask=loss,
        rollout_logprobs=logprobs,
        prompt_length=len(prompt),
        advantage=float(rng.normal()),
    )


def grpo_like_episodes(seed=0):
    """Groups of 4, 3, 1 and 2 episodes sharing prompts of 9, 17, 5 and 12 tokens;
    replies interleave sampled and observed (masked) tokens, as tool turns do."""
    rng = np.random.default_rng(seed)
    episodes = []
    for size, prompt_len in ((4, 9), (3, 17), (1, 5), (2, 12)):
        prompt = rng.integers(3, CONFIG.vocab_size, prompt_len).tolist()
        for _ in range(size):
            n = int(rng.integers(4, 15))
            mask = [1] + [int(m) for m in rng.integers(0, 2, n - 1)]
            episodes.append(episode(prompt, rng.integers(3, CONFIG.vocab_size, n), mask, rng))
    # An episode with no sampled token contributes nothing but must not break the batch.
    episodes.append(episode([5, 6, 7], [8, 9], [0, 0], rng))
    return episodes


def model():
    return Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(0))


def test_layout_keeps_one_prompt_per_group_and_every_episode_position():
    rng = np.random.default_rng(0)
    episodes = [
        episode([10, 11, 12], [13, 14, 15], [1, 0, 1], rng),
        episode([10, 11, 12], [16, 17], [1, 1], rng),
        episode([20, 21], [22, 23], [1, 1], rng),
    ]
    b = build_shared_prompt_batch(
        episodes, config=BatchingConfig(seq_buckets=(4, 8), row_multiple=1)
    )
    assert isinstance(b, SharedPromptBatch)
    # Shifted positions before the first loss position: feed 10, 11 (predict 11, 12).
    assert b.prompt_ids.tolist() == [[10, 11, 0, 0], [20, 0, 0, 0]]
    assert b.prompt_segment_ids.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    assert b.prompt_positions.tolist() == [[0, 1, 0, 0], [0, 0, 0, 0]]
    c = b.completions
    assert c.input_ids.shape == (2, 2, 4) and b.shape == (2, 4 + 2 * 4)
    # Episode 0 goes on from position 2: it feeds 12, 13, 14 and predicts 13, 14, 15.
    assert c.input_ids[0, 0].tolist() == [12, 13, 14, 0]
    assert c.target_ids[0, 0].tolist() == [13, 14, 15, 0]
    assert c.positions[0, 0].tolist() == [2, 3, 4, 0]
    assert c.loss_mask[0, 0].tolist() == [1, 0, 1, 0]
    assert c.input_ids[0, 1].tolist() == [12, 16, 0, 0]
    assert c.segment_ids[1, 1].tolist() == [0, 0, 0, 0]  # group 1 has one episode
    assert c.input_ids[1, 0].tolist() == [21, 22, 0, 0] and c.positions[1, 0, 0] == 1
    a = episodes[0].advantage
    np.testing.assert_allclose(c.advantages[0, 0], [a, 0, a, 0])
    rows = loss_rows(b)
    assert rows.input_ids.shape == (4, 4) and rows.loss_index.shape[0] == 4
    assert b.num_loss_tokens() == build_train_batch(episodes).num_loss_tokens() == 6


def test_groups_are_padded_to_the_row_multiple_and_pack_is_refused():
    b = build_shared_prompt_batch(
        grpo_like_episodes(), config=BatchingConfig(seq_buckets=BUCKETS, row_multiple=4)
    )
    assert b.prompt_ids.shape[0] == 8 and b.completions.input_ids.shape[1] == 4  # 5 groups
    assert b.completions.loss_mask[5:].sum() == 0
    with pytest.raises(ValueError, match="pack"):
        build_shared_prompt_batch(
            grpo_like_episodes(), config=BatchingConfig(seq_buckets=BUCKETS, pack=True)
        )
    with pytest.raises(ValueError, match="zero trajectories"):
        build_shared_prompt_batch([])


def _logprobs_by_position(logp, view):
    """{(row, position in its episode): log-prob} over a batch's loss positions."""
    logp, mask, pos = np.asarray(logp), np.asarray(view.loss_mask), np.asarray(view.positions)
    return {(int(r), int(pos[r, k])): float(logp[r, k]) for r, k in zip(*np.nonzero(mask))}


def test_loss_position_logprobs_equal_those_of_the_whole_episodes():
    episodes = grpo_like_episodes()
    plain = build_train_batch(episodes, config=BatchingConfig(seq_buckets=(64,)))
    shared = build_shared_prompt_batch(episodes, config=BatchingConfig(seq_buckets=BUCKETS))
    m = model()
    want, _, plain_view = loss_position_logprobs(m, plain, 0.7)
    got, _, shared_view = loss_position_logprobs(m, shared, 0.7)
    # Plain row i is episode i; in the shared batch, episode j of group g is row g·m + j.
    per_group = shared.completions.input_ids.shape[1]
    row_of = {
        i: g * per_group + j
        for g, group in enumerate(_group_order(episodes))
        for j, i in enumerate(group)
    }
    want_map = _logprobs_by_position(want, plain_view)
    got_map = _logprobs_by_position(got, shared_view)
    assert len(got_map) == len(want_map) == plain.num_loss_tokens()
    for (i, position), value in want_map.items():
        np.testing.assert_allclose(got_map[(row_of[i], position)], value, rtol=1e-5, atol=1e-5)


def _group_order(episodes):
    """Episode indices grouped as `build_shared_prompt_batch` groups them (first seen first)."""
    groups = {}
    for i, e in enumerate(episodes):
        first = e.loss_mask.index(1) if 1 in e.loss_mask else len(e.token_ids) - 1
        groups.setdefault(tuple(e.token_ids[:first]), []).append(i)
    return list(groups.values())


def params_of(learner):
    return jax.device_get(nnx.state(learner.model, nnx.Param))


@pytest.fixture(scope="module")
def plain_step():
    """One unsharded step on the episodes as an ordinary TrainBatch."""
    learner = Learner(model(), EXACT)
    learner.set_reference(jax.tree.map(lambda x: x * 1.01, learner.params))
    batch = build_train_batch(grpo_like_episodes(), config=BatchingConfig(seq_buckets=(64,)))
    return learner.train_step(batch), params_of(learner)


def assert_same_step(learner, plain_step):
    want_metrics, want_params = plain_step
    learner.set_reference(jax.tree.map(lambda x: x * 1.01, learner.params))
    batch = build_shared_prompt_batch(
        grpo_like_episodes(),
        config=BatchingConfig(seq_buckets=BUCKETS, row_multiple=learner.row_multiple()),
    )
    metrics = learner.train_step(batch)
    for name in (
        "loss",
        "pg_loss",
        "kl",
        "grad_norm",
        "entropy",
        "ratio_max",
        "logprob_gap",
        "num_loss_tokens",
    ):
        np.testing.assert_allclose(
            metrics[name], want_metrics[name], rtol=2e-5, atol=1e-7, err_msg=name
        )
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        params_of(learner),
        want_params,
    )


@pytest.mark.parametrize("micro", [None, 2])
def test_learner_step_equals_the_unshared_step(plain_step, micro):
    assert_same_step(
        Learner(model(), dataclasses.replace(EXACT, micro_batch_size=micro)), plain_step
    )


def test_sharded_step_equals_the_unshared_step(plain_step):
    mesh = make_mesh(fsdp=4, tensor=2)
    assert_same_step(
        Learner(model(), dataclasses.replace(EXACT, micro_batch_size=4), mesh=mesh), plain_step
    )
