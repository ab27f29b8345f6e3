"""Trajectories -> TrainBatch: exact target shift, buckets, padding, packing."""

import numpy as np
import pytest

from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.rl.batching import (
    BatchingConfig,
    TrainBatch,
    bucket_length,
    bucket_rows,
    build_train_batch,
)


def traj(ids, mask, advantage=1.0, prompt_length=2):
    logprobs = [-0.1 * (i + 1) if m else 0.0 for i, m in enumerate(mask)]
    return Trajectory(
        task_id="t",
        group_index=0,
        seed=0,
        token_ids=ids,
        loss_mask=mask,
        rollout_logprobs=logprobs,
        prompt_length=prompt_length,
        advantage=advantage,
    )


def test_targets_are_shifted_by_one_exactly():
    t = traj([10, 11, 12, 13, 14], [0, 0, 1, 1, 0], advantage=-0.5)
    b = build_train_batch([t], config=BatchingConfig(seq_buckets=(4, 8)))
    assert b.shape == (1, 4)
    assert b.input_ids[0].tolist() == [10, 11, 12, 13]
    assert b.target_ids[0].tolist() == [11, 12, 13, 14]
    # position t predicts token t + 1: the sampled tokens 12 and 13 are targets 1 and 2
    assert b.loss_mask[0].tolist() == [0, 1, 1, 0]
    np.testing.assert_allclose(b.old_logprobs[0], [0.0, -0.3, -0.4, 0.0], rtol=1e-6)
    assert b.advantages[0].tolist() == [0.0, -0.5, -0.5, 0.0]
    assert b.positions[0].tolist() == [0, 1, 2, 3]
    assert b.segment_ids[0].tolist() == [1, 1, 1, 1]


def test_bucketing_and_row_padding():
    assert bucket_length(5, (4, 8, 16)) == 8 and bucket_length(8, (4, 8)) == 8
    with pytest.raises(ValueError, match="largest bucket"):
        bucket_length(17, (4, 8, 16))
    assert [bucket_rows(n, 2) for n in (1, 2, 3, 4, 5, 9)] == [2, 2, 4, 4, 8, 16]
    trajs = [traj(list(range(6)), [0, 0, 1, 1, 1, 1]), traj([1, 2, 3], [0, 1, 1])]
    b = build_train_batch(trajs, [1.0, 2.0], BatchingConfig(seq_buckets=(4, 8), row_multiple=4))
    assert b.shape == (4, 8)
    assert b.segment_ids[1].tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert b.loss_mask[2:].sum() == 0 and b.segment_ids[2:].sum() == 0
    assert b.advantages[1].tolist()[:2] == [2.0, 2.0]
    assert b.num_loss_tokens() == 4 + 2
    assert isinstance(b, TrainBatch)


def test_packing_restarts_positions_and_separates_segments():
    trajs = [
        traj([1, 2, 3, 4, 5], [0, 0, 1, 1, 1], 1.0),
        traj([6, 7, 8], [0, 1, 1], 2.0),
        traj([9, 10, 11, 12], [0, 1, 0, 1], 3.0),
    ]
    b = build_train_batch(trajs, config=BatchingConfig(seq_buckets=(8,), pack=True))
    assert b.shape == (2, 8)  # 4 + 2 + 3 positions -> rows [4, 3] and [2]
    assert b.segment_ids[0].tolist() == [1, 1, 1, 1, 2, 2, 2, 0]
    assert b.positions[0].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    assert b.input_ids[0].tolist() == [1, 2, 3, 4, 9, 10, 11, 0]
    assert b.target_ids[0].tolist() == [2, 3, 4, 5, 10, 11, 12, 0]
    assert b.advantages[0].tolist() == [0, 1, 1, 1, 3, 0, 3, 0]
    assert b.input_ids[1].tolist()[:2] == [6, 7] and b.segment_ids[1].tolist()[:3] == [1, 1, 0]
    # no target crosses from one packed sequence into the next
    assert b.loss_mask[0, 3] == 1 and b.target_ids[0, 3] == 5


def test_bad_input_is_reported():
    with pytest.raises(ValueError, match="no advantage"):
        build_train_batch([traj([1, 2], [0, 1], advantage=None)])
    with pytest.raises(ValueError, match="zero trajectories"):
        build_train_batch([])
    with pytest.raises(ValueError, match="at least 2"):
        build_train_batch([traj([1], [1], prompt_length=0)], [1.0])
    with pytest.raises(ValueError, match="ascending"):
        BatchingConfig(seq_buckets=(8, 4))
