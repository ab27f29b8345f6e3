"""The learner's LM head runs only at loss positions; that must change nothing."""

import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rl.batching import BatchingConfig, build_train_batch, loss_positions
from orchestra_jax.rl.objectives import loss_position_logprobs, model_logprobs


class _Traj:
    def __init__(self, ids, mask, advantage):
        self.token_ids, self.loss_mask = ids, mask
        self.rollout_logprobs = [-0.5 * m for m in mask]
        self.advantage = advantage


def test_loss_positions_lists_masked_positions_then_padding():
    mask = np.array([[0, 1, 1, 0, 1], [0, 0, 0, 0, 0], [1] * 5], np.float32)
    index = loss_positions(mask)
    assert index.shape == (3, 5)  # K = 8 capped at T = 5
    np.testing.assert_array_equal(index[0], [1, 2, 4, -1, -1])
    np.testing.assert_array_equal(index[1], [-1] * 5)


@pytest.mark.parametrize("pack", [False, True])
def test_gathered_logprobs_equal_full_logprobs(pack):
    model = Qwen3ForCausalLM(Qwen3Config.preset("tiny", num_hidden_layers=1), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    trajs = []
    for n in (40, 25, 33):
        mask = [0] * 10 + rng.integers(0, 2, n - 10).tolist()
        trajs.append(_Traj(rng.integers(0, 256, n).tolist(), mask, float(rng.normal())))
    batch = build_train_batch(trajs, config=BatchingConfig(seq_buckets=(64,), pack=pack))
    full, _ = model_logprobs(model, batch)
    gathered, entropy, view = loss_position_logprobs(model, batch)
    assert entropy.shape == batch.loss_index.shape
    mask = np.asarray(batch.loss_mask) > 0
    np.testing.assert_allclose(
        np.asarray(gathered)[np.asarray(view.loss_mask) > 0],
        np.asarray(full)[mask],
        rtol=1e-5,
        atol=1e-6,
    )
    for name in ("advantages", "old_logprobs", "loss_mask"):
        assert np.asarray(getattr(view, name)).sum() == pytest.approx(
            np.asarray(getattr(batch, name)).sum(), rel=1e-6
        )
