"""Packed learner batches: loss and gradients those of one sample a row, to float32 round-off.

Hand-built samples of very uneven lengths (3 to 90 positions), every aggregation,
KL, truncated importance sampling and the entropy bonus on, with the `xla`
attention and (per-token and per-sample aggregations) the blocked `flash` one, on
one device and with the batch's rows split over 8 (conftest's fake CPU devices).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.parallel.mesh import batch_sharding, make_mesh
from orchestra_jax.rl.aggregation import AGGREGATIONS, loss_denominator
from orchestra_jax.rl.batching import (
    BatchingConfig,
    build_train_batch,
    pack_batch,
    place_minibatches,
)
from orchestra_jax.rl.learner import LearnerConfig
from orchestra_jax.rl.objectives import OBJECTIVES

BUCKETS = (16, 32, 64, 128)
LENGTHS = (4, 91, 12, 40, 5, 63, 27, 3, 18, 55)


@dataclasses.dataclass
class _Sample:
    token_ids: list
    loss_mask: list
    rollout_logprobs: list
    advantage: float


def uneven_samples(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in LENGTHS:
        prompt = int(rng.integers(1, max(n // 2, 2)))
        mask = [0] * prompt + rng.integers(0, 2, n - prompt).tolist()
        mask[-1] = 1  # every sample has a loss token
        logprobs = (-rng.exponential(1.0, n) * np.asarray(mask)).tolist()
        out.append(_Sample(rng.integers(0, 256, n).tolist(), mask, logprobs, float(rng.normal())))
    return out


def _models(attention):
    config = Qwen3Config.preset(
        "tiny", num_hidden_layers=1, attention=attention, attention_block_size=16
    )
    return (
        Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)),
        Qwen3ForCausalLM(config, rngs=nnx.Rngs(1)),
    )


def _learner_config(agg):
    return LearnerConfig(
        agg=agg,
        norm_length=100 if agg == "seq-mean-token-sum-norm" else None,
        kl_coef=0.1,
        entropy_coef=0.01,
        tis_cap=2.0,
        lm_head_chunk=8,
    )


def loss_and_grads(model, ref, batch, config, mesh=None):
    """The grpo objective's loss and gradient over `batch` as the learner takes them
    (denominator over the whole batch)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    objective = OBJECTIVES.get("grpo")

    def loss(p, b):
        denominator = loss_denominator(
            b.loss_mask, config.agg, segment_ids=b.segment_ids, norm_length=config.norm_length
        )
        return objective(nnx.merge(graphdef, p, rest), ref, b, denominator, config)[0]

    fn = jax.jit(jax.value_and_grad(loss))
    if mesh is None:
        return fn(params, batch)
    with jax.set_mesh(mesh):
        batch = jax.device_put(batch, batch_sharding(mesh))
        params = jax.device_put(params, NamedSharding(mesh, P()))
        return fn(params, batch)


def assert_same(a, b):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    np.testing.assert_allclose(float(loss_a), float(loss_b), rtol=2e-5, atol=1e-7)
    for x, y in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        scale = float(jnp.max(jnp.abs(y))) + 1e-12
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=2e-5 * scale)


def test_packed_rows_hold_fewer_positions_and_keep_samples_apart():
    samples = uneven_samples()
    unpacked = build_train_batch(samples, config=BatchingConfig(seq_buckets=BUCKETS))
    packed = pack_batch(samples, config=BatchingConfig(seq_buckets=BUCKETS, pack=True))
    tokens = sum(n - 1 for n in LENGTHS)
    assert unpacked.shape == (16, 128)
    rows, length = packed.shape
    assert rows * length < 0.5 * unpacked.shape[0] * unpacked.shape[1]
    assert rows * length - tokens <= length  # first-fit decreasing fills all but one row
    assert np.asarray(packed.loss_mask).sum() == np.asarray(unpacked.loss_mask).sum()
    # every sample is one segment, positions from 0
    seg, pos = np.asarray(packed.segment_ids), np.asarray(packed.positions)
    segments = [(r, s) for r in range(rows) for s in np.unique(seg[r]) if s]
    assert sorted(int((seg[r] == s).sum()) for r, s in segments) == sorted(n - 1 for n in LENGTHS)
    for r, s in segments:
        np.testing.assert_array_equal(pos[r][seg[r] == s], np.arange((seg[r] == s).sum()))


@pytest.mark.parametrize(
    "agg, attention",
    [(agg, "xla") for agg in AGGREGATIONS]
    + [("token-mean", "flash"), ("seq-mean-token-mean", "flash")],
)
def test_packed_loss_and_gradients_equal_unpacked(agg, attention):
    model, ref = _models(attention)
    config = _learner_config(agg)
    samples = uneven_samples()
    unpacked = build_train_batch(samples, config=BatchingConfig(seq_buckets=BUCKETS))
    packed = pack_batch(samples, config=BatchingConfig(seq_buckets=BUCKETS, pack=True))
    assert packed.segment_ids.max() >= 3  # rows really hold several samples
    assert_same(
        loss_and_grads(model, ref, packed, config), loss_and_grads(model, ref, unpacked, config)
    )


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_packed_loss_and_gradients_equal_unpacked_on_8_devices(agg):
    assert jax.device_count() >= 8
    mesh = make_mesh(8, 1, 1, devices=jax.devices()[:8])
    model, ref = _models("xla")
    config = _learner_config(agg)
    samples = uneven_samples(seed=1)
    unpacked = build_train_batch(
        samples, config=BatchingConfig(seq_buckets=BUCKETS, row_multiple=8)
    )
    packed = pack_batch(
        samples, config=BatchingConfig(seq_buckets=BUCKETS, row_multiple=8, pack=True)
    )
    assert packed.shape[0] == 8
    sharded = loss_and_grads(model, ref, packed, config, mesh)
    assert_same(sharded, loss_and_grads(model, ref, unpacked, config))
    assert_same(sharded, loss_and_grads(model, ref, packed, config))


def test_packed_minibatches_equal_placed_minibatches():
    """Mini-batches of m samples in order (the reference's), each packed into its own
    rows at i, n + i, …: each mini-batch's loss and gradients those of
    `place_minibatches`' unpacked one."""
    model, ref = _models("xla")
    config = _learner_config("seq-mean-token-mean")
    samples = uneven_samples(seed=2)
    sizes = [4, 4, 2]
    bounds = np.cumsum([0, *sizes])
    groups = [range(bounds[i], bounds[i + 1]) for i in range(3)]
    packed = pack_batch(
        samples, config=BatchingConfig(seq_buckets=BUCKETS, pack=True), minibatches=groups
    )
    placed = place_minibatches(
        build_train_batch(samples, config=BatchingConfig(seq_buckets=BUCKETS)), sizes, 4
    )
    for i in range(3):
        mine = jax.tree.map(lambda x, i=i: x[i::3], packed)
        theirs = jax.tree.map(lambda x, i=i: x[i::3], placed)
        assert mine.shape[0] * mine.shape[1] < theirs.shape[0] * theirs.shape[1]
        assert_same(
            loss_and_grads(model, ref, mine, config), loss_and_grads(model, ref, theirs, config)
        )


def test_pack_batch_refuses_a_sample_twice_or_missing():
    samples = uneven_samples()
    with pytest.raises(ValueError, match="once"):
        pack_batch(samples, minibatches=[range(5), range(4, 10)])


def test_config_refuses_packing_with_shared_prompts_or_a_padded_length_norm():
    from experiments.configs import grpo_hle
    from orchestra_jax.training import builders, experiment_config

    config = grpo_hle.get_config("demo")  # shares prompts
    config.rl.pack = True
    assert any("do not combine" in e for e in experiment_config.problems(config))
    config.rl.share_prompts = False
    assert not any("rl.pack" in e for e in experiment_config.problems(config))
    config.rl.loss_agg = "seq-mean-token-sum-norm"
    assert any("padded row length" in e for e in experiment_config.problems(config))
    config.rl.loss_agg = "token-mean"
    assert builders.build_batching(config, 4).pack


def test_gathered_segments_stay_apart_when_ids_exceed_the_loss_width():
    """A packed row of 12 samples, loss tokens only in the last two: their segment ids
    (11, 12) exceed K = 8 gathered columns, yet each keeps its own per-sample mean."""
    from orchestra_jax.rl.aggregation import aggregate
    from orchestra_jax.rl.objectives import at_loss_positions

    samples = [_Sample([1, 2], [0, 0], [0.0, 0.0], 1.0) for _ in range(10)]
    samples += [_Sample([1, 2, 3, 4], [0, 1, 1, 1], [0.0, -1.0, -1.0, -1.0], 1.0)]
    samples += [_Sample([1, 2], [0, 1], [0.0, -2.0], 1.0)]
    batch = build_train_batch(samples, config=BatchingConfig(seq_buckets=(32,), pack=True))
    assert batch.shape[0] == 1 and batch.loss_index.shape[1] == 8
    view = at_loss_positions(batch)
    values = jnp.asarray(view.old_logprobs)
    loss = aggregate(values, view.loss_mask, "seq-mean-token-mean", segment_ids=view.segment_ids)
    np.testing.assert_allclose(float(loss[0]), (-1.0 + -2.0) / 2, rtol=1e-6)
