"""Packed rows sharing common prefixes: loss and gradients those of one sample a row.

Hand-built samples shaped like the reference's rebuilt turns: a system part every
sample starts with, a problem per task, documents that grow turn by turn within
an episode, an instruction, then the turn's reply (its loss tokens), of very
uneven lengths. Every aggregation with KL, truncated importance sampling and the
entropy bonus on; the `xla` and blocked `flash` attention; one device and 8.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.attention_mask import AttentionMask
from orchestra_jax.models.flash_attention import flash_attention
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.parallel.mesh import make_mesh
from orchestra_jax.rl.aggregation import AGGREGATIONS
from orchestra_jax.rl.batching import (
    BatchingConfig,
    build_train_batch,
    pack_batch,
    shifted_sequences,
)
from orchestra_jax.rl.prefix_packing import (
    by_tokens,
    families,
    pack_shared_prefixes,
    shareable_length,
)
from tests.test_rl_packing import _learner_config, _models, _Sample, assert_same, loss_and_grads

BUCKETS = (32, 64, 128, 256)


def rebuilt_turns(seed=0, tasks=2, episodes=2, turns=3):
    """Samples system + problem + documents so far + instruction + reply."""
    rng = np.random.default_rng(seed)
    tokens = lambda n: rng.integers(0, 256, n).tolist()  # noqa: E731
    system, instruction = tokens(24), tokens(4)
    out = []
    for _ in range(tasks):
        problem = tokens(int(rng.integers(3, 12)))
        for _ in range(episodes):
            advantage = float(rng.normal())
            docs = []
            for _ in range(turns):
                reply = tokens(int(rng.integers(2, 30)))
                ids = system + problem + docs + instruction + reply
                prompt = len(ids) - len(reply)
                mask = [0] * prompt + rng.integers(0, 2, len(reply)).tolist()
                mask[-1] = 1
                logprobs = (-rng.exponential(1.0, len(ids)) * np.asarray(mask)).tolist()
                out.append(_Sample(ids, mask, logprobs, advantage))
                docs = docs + tokens(int(rng.integers(4, 20)))
    order = rng.permutation(len(out))  # families are found whatever the order
    return [out[i] for i in order]


def _config(**kw):
    return BatchingConfig(seq_buckets=BUCKETS, pack=True, **kw)


def test_families_share_their_common_prefix_and_hold_every_sample_once():
    samples = rebuilt_turns()
    seqs = shifted_sequences(samples)
    fams = families(seqs, by_tokens(seqs, range(len(seqs))), capacity=256)
    assert sorted(m for f in fams for m in f.members) == list(range(len(seqs)))
    assert any(len(f.members) > 1 for f in fams)
    for f in fams:
        assert 0 < f.prefix <= min(shareable_length(seqs[m]) for m in f.members)
        first = seqs[f.members[0]]["input_ids"][: f.prefix]
        for m in f.members:
            np.testing.assert_array_equal(seqs[m]["input_ids"][: f.prefix], first)


def test_shared_rows_hold_fewer_positions_than_packed_rows():
    samples = rebuilt_turns()
    packed = pack_batch(samples, config=_config())
    shared = pack_shared_prefixes(samples, config=_config())
    assert np.asarray(shared.loss_mask).sum() == np.asarray(packed.loss_mask).sum()
    written = lambda b: int((np.asarray(b.segment_ids) > 0).sum())  # noqa: E731
    # 24 system positions + a problem, shared across at least each task's samples
    assert written(shared) < 0.6 * written(packed)
    assert shared.shape[0] * shared.shape[1] <= packed.shape[0] * packed.shape[1]
    # each member's rest continues its prefix's positions; the prefix reads nothing extra
    seg = np.asarray(shared.segment_ids)
    pre = np.asarray(shared.prefix_segment_ids)
    pos = np.asarray(shared.positions)
    for r in range(seg.shape[0]):
        for s in np.unique(pre[r][pre[r] > 0]):
            prefix_len = int((seg[r] == s).sum())
            assert (pre[r][seg[r] == s] == 0).all()
            for m in np.unique(seg[r][pre[r] == s]):
                assert pos[r][seg[r] == m][0] == prefix_len


@pytest.mark.parametrize(
    "agg, attention",
    [(agg, "xla") for agg in AGGREGATIONS if agg != "seq-mean-token-sum-norm"]
    + [("seq-mean-token-sum-norm", "xla")]
    + [("token-mean", "flash"), ("seq-mean-token-mean", "flash")],
)
def test_shared_prefix_loss_and_gradients_equal_unpacked(agg, attention):
    model, ref = _models(attention)
    config = _learner_config(agg)
    samples = rebuilt_turns(seed=1)
    unpacked = build_train_batch(samples, config=BatchingConfig(seq_buckets=BUCKETS))
    shared = pack_shared_prefixes(samples, config=_config())
    assert np.asarray(shared.prefix_segment_ids).max() > 0  # rows really share prefixes
    assert_same(
        loss_and_grads(model, ref, shared, config), loss_and_grads(model, ref, unpacked, config)
    )


def test_shared_prefix_loss_and_gradients_equal_unpacked_on_8_devices():
    assert jax.device_count() >= 8
    mesh = make_mesh(8, 1, 1, devices=jax.devices()[:8])
    model, ref = _models("xla")
    config = _learner_config("seq-mean-token-sum")
    samples = rebuilt_turns(seed=2, tasks=3)
    unpacked = build_train_batch(samples, config=BatchingConfig(seq_buckets=BUCKETS))
    shared = pack_shared_prefixes(samples, config=_config(row_multiple=8))
    assert shared.shape[0] == 8
    assert_same(
        loss_and_grads(model, ref, shared, config, mesh),
        loss_and_grads(model, ref, unpacked, config),
    )


def test_shared_prefix_minibatches_share_only_within_each():
    model, ref = _models("xla")
    config = _learner_config("token-mean")
    samples = rebuilt_turns(seed=3)
    groups = [range(0, 5), range(5, 10), range(10, 12)]
    shared = pack_shared_prefixes(samples, config=_config(), minibatches=groups)
    for i, group in enumerate(groups):
        mine = jax.tree.map(lambda x, i=i: x[i::3], shared)
        alone = build_train_batch(
            [samples[j] for j in group], config=BatchingConfig(seq_buckets=BUCKETS)
        )
        assert_same(
            loss_and_grads(model, ref, mine, config), loss_and_grads(model, ref, alone, config)
        )


def test_pack_shared_prefixes_refuses_a_sample_twice_or_missing():
    with pytest.raises(ValueError, match="once"):
        pack_shared_prefixes(rebuilt_turns(), minibatches=[range(5), range(4, 12)])


def _prefix_row_mask():
    """One row: [prefix 0..9 (seg 1)] [rest a (seg 2, reads 1)] [rest b (seg 3, reads 1)]
    [a lone sequence (seg 4)] [padding]; positions restart per sequence."""
    seg = np.array([1] * 10 + [2] * 7 + [3] * 9 + [4] * 5 + [0] * 1, np.int32)
    pre = np.where((seg == 2) | (seg == 3), 1, 0).astype(np.int32)
    return jnp.asarray(seg[None]), jnp.asarray(pre[None])


def test_mask_sees_the_prefix_and_its_own_rest_only():
    seg, pre = _prefix_row_mask()
    dense = np.asarray(AttentionMask.causal(seg, pre).dense())[0]
    s = np.asarray(seg)[0]
    for t in range(len(s)):
        for k in range(len(s)):
            own = s[k] == s[t] != 0
            prefix = s[t] in (2, 3) and s[k] == 1
            assert dense[t, k] == ((own or prefix) and k <= t), (t, k)


@pytest.mark.parametrize("block", [4, 8])
def test_flash_with_shared_prefixes_equals_the_direct_computation(block):
    seg, pre = _prefix_row_mask()
    mask = AttentionMask.causal(seg, pre)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(1, 32, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 2, 32, 8)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(1, 2, 32, 8)), jnp.float32)
    dense = mask.dense()

    def direct(q, k, v):
        qg = q.reshape(1, 32, 2, 2, 8).transpose(0, 2, 3, 1, 4)
        s = jnp.einsum("bkgtd,bksd->bkgts", qg, k) * 8**-0.5
        s = jnp.where(dense[:, None, None], s, -jnp.inf)
        p = jnp.nan_to_num(jax.nn.softmax(s, axis=-1))
        out = jnp.einsum("bkgts,bksd->bkgtd", p, v).transpose(0, 3, 1, 2, 4).reshape(1, 32, 4, 8)
        return jnp.where((seg != 0)[:, :, None, None], out, 0)

    flash = lambda q, k, v: flash_attention(q, k, v, mask, block_q=block, block_k=block)  # noqa: E731
    np.testing.assert_allclose(flash(q, k, v), direct(q, k, v), atol=2e-6)
    cot = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    grads = [jax.vjp(f, q, k, v)[1](cot) for f in (flash, direct)]
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_model_refuses_prefix_segments_with_a_cache():
    config = Qwen3Config.preset("tiny", num_hidden_layers=1)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    ids = jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="without a cache"):
        model(ids, ids, prefix_segment_ids=ids, cache=model.init_cache(1, 8))


def test_flash_skips_the_other_continuations_of_a_prefix():
    """[prefix (seg 1)][a (2, reads 1)][b (3, reads 1)][lone (4)], 64 positions each,
    blocks of 32: b's query blocks read the prefix's blocks and their own, never a's
    (NaN values there change nothing)."""
    from orchestra_jax.models.flash_attention import _Blocks

    seg = jnp.asarray(np.repeat(np.arange(1, 5), 64)[None].astype(np.int32))
    pre = jnp.asarray(np.where((seg == 2) | (seg == 3), 1, 0).astype(np.int32))
    mask = AttentionMask.causal(seg, pre)
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.normal(size=(1, 256, 2, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 256, 8)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(1, 1, 256, 8)), jnp.float32)
    blocks = _Blocks(q, k, mask, 32, 32)
    np.testing.assert_array_equal(blocks.first_kv, [0, 0, 2, 2, 4, 4, 6, 6])
    np.testing.assert_array_equal(blocks.num_kv, [1, 2, 3, 4, 5, 6, 7, 8])
    np.testing.assert_array_equal(blocks.first_prefix, [0, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(blocks.end_prefix, [0, 0, 2, 2, 2, 2, 0, 0])
    poisoned = v.at[:, :, 64:128].set(jnp.nan)  # a's values
    out = flash_attention(q, k, poisoned, mask, block_q=32, block_k=32)
    assert np.all(np.isfinite(np.asarray(out[:, 128:])))
    want = flash_attention(q, k, v, mask, block_q=256, block_k=256)  # one block: all read
    np.testing.assert_allclose(out[:, 128:], want[:, 128:], atol=2e-6)
