"""KV-cache decoding, packing and padding agree with the plain full forward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM

ATOL = 1e-5


@functools.partial(nnx.jit, static_argnames="kv_len")
def forward(model, ids, positions, segment_ids=None, cache=None, kv_len=None):
    """Jitted call: one compile per shape is far cheaper than op-by-op dispatch."""
    return model(ids, positions, segment_ids=segment_ids, cache=cache, kv_len=kv_len)


@pytest.fixture(scope="module")
def model():
    return Qwen3ForCausalLM(Qwen3Config.preset("tiny"), rngs=nnx.Rngs(0))


def _ids(batch, length, seed=0):
    return jnp.asarray(np.random.RandomState(seed).randint(0, 256, (batch, length)), jnp.int32)


def _positions(batch, length):
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


@pytest.mark.parametrize("scan", [False, True])
def test_token_by_token_decode_equals_full_forward(scan):
    m = Qwen3ForCausalLM(Qwen3Config.preset("tiny", scan_layers=scan), rngs=nnx.Rngs(0))
    ids, pos = _ids(2, 10), _positions(2, 10)
    full = forward(m, ids, pos)
    cache = m.init_cache(2, 32)
    logits, cache = forward(m, ids[:, :4], pos[:, :4], cache=cache)  # prefill 4 tokens
    outs = [logits]
    for t in range(4, 10):
        logits, cache = forward(m, ids[:, t : t + 1], pos[:, t : t + 1], cache=cache, kv_len=16)
        outs.append(logits)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=ATOL)


def test_rope_table_lookup_gives_identical_logits(model):
    """`rope_table` (the decode loop's cos/sin lookup) changes nothing, bit for bit."""
    ids = _ids(3, 6)
    pos = jnp.asarray(
        [[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24, 25]], jnp.int32
    )
    table = model.rope_table(32)
    call = nnx.jit(lambda m, ids, pos, cache, table: m(ids, pos, cache=cache, rope_table=table))
    with_table, _ = call(model, ids, pos, model.init_cache(3, 32), table)
    without, _ = forward(model, ids, pos, cache=model.init_cache(3, 32))
    np.testing.assert_array_equal(with_table, without)
    full = nnx.jit(lambda m, ids, pos, table: m(ids, pos, rope_table=table))(model, ids, pos, table)
    np.testing.assert_array_equal(full, forward(model, ids, pos))


def test_rows_at_different_lengths(model):
    """Continuous batching: each row decodes at its own position."""
    a, b = _ids(1, 7, seed=1), _ids(1, 3, seed=2)
    want_a, want_b = forward(model, a, _positions(1, 7)), forward(model, b, _positions(1, 3))
    cache = model.init_cache(2, 16)
    _, sub = forward(model, a[:, :6], _positions(1, 6), cache=cache.take_rows(jnp.array([0])))
    cache = cache.put_rows(jnp.array([0]), sub)
    _, sub = forward(model, b[:, :2], _positions(1, 2), cache=cache.take_rows(jnp.array([1])))
    cache = cache.put_rows(jnp.array([1]), sub)
    step_ids = jnp.concatenate([a[:, 6:7], b[:, 2:3]])
    step_pos = jnp.array([[6], [2]], jnp.int32)
    logits, _ = forward(model, step_ids, step_pos, cache=cache, kv_len=8)
    np.testing.assert_allclose(logits[0, 0], want_a[0, 6], atol=ATOL)
    np.testing.assert_allclose(logits[1, 0], want_b[0, 2], atol=ATOL)


def test_reused_row_ignores_stale_slots(model):
    """A row refilled with a shorter request must not see the old request's later slots."""
    cache = model.init_cache(1, 16)
    _, cache = forward(model, _ids(1, 9, seed=3), _positions(1, 9), cache=cache)
    short = _ids(1, 4, seed=4)
    logits, _ = forward(model, short, _positions(1, 4), cache=cache)
    np.testing.assert_allclose(logits, forward(model, short, _positions(1, 4)), atol=ATOL)


def test_left_padded_prefill_then_decode(model):
    ids = _ids(1, 5, seed=5)
    want = forward(model, ids, _positions(1, 5))
    padded = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), ids], axis=1)
    seg = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1]], jnp.int32)
    pos = jnp.array([[0, 0, 0, 0, 1, 2, 3, 4]], jnp.int32)
    # No cache: padding masked out of attention.
    np.testing.assert_allclose(forward(model, padded, pos, segment_ids=seg)[:, 3:], want, atol=ATOL)
    # With a cache: padding keys are not written, so they cannot clobber slot 0.
    cache = model.init_cache(1, 8)
    logits, cache = forward(model, padded[:, :7], pos[:, :7], segment_ids=seg[:, :7], cache=cache)
    np.testing.assert_allclose(logits[:, 3:], want[:, :4], atol=ATOL)
    logits, _ = forward(model, ids[:, 4:5], pos[:, 7:8], cache=cache)
    np.testing.assert_allclose(logits[:, 0], want[:, 4], atol=ATOL)


def test_right_padding_does_not_change_real_tokens(model):
    ids = _ids(1, 6, seed=6)
    padded = jnp.concatenate([ids, jnp.zeros((1, 2), jnp.int32)], axis=1)
    seg = jnp.array([[1] * 6 + [0] * 2], jnp.int32)
    got = forward(model, padded, _positions(1, 8), segment_ids=seg)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(got[:, :6], forward(model, ids, _positions(1, 6)), atol=ATOL)


def test_packed_equals_separate(model):
    a, b, c = _ids(1, 5, seed=7), _ids(1, 4, seed=8), _ids(1, 3, seed=9)
    packed = jnp.concatenate([a, b, c, jnp.zeros((1, 2), jnp.int32)], axis=1)
    seg = jnp.array([[1] * 5 + [2] * 4 + [3] * 3 + [0] * 2], jnp.int32)
    pos = jnp.array([list(range(5)) + list(range(4)) + list(range(3)) + [0, 0]], jnp.int32)
    got = forward(model, packed, pos, segment_ids=seg)
    np.testing.assert_allclose(got[:, :5], forward(model, a, _positions(1, 5)), atol=ATOL)
    np.testing.assert_allclose(got[:, 5:9], forward(model, b, _positions(1, 4)), atol=ATOL)
    np.testing.assert_allclose(got[:, 9:12], forward(model, c, _positions(1, 3)), atol=ATOL)


def test_bad_inputs_raise(model):
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        forward(model, jnp.zeros((4,), jnp.int32), jnp.zeros((4,), jnp.int32))
    with pytest.raises(ValueError, match="kv_len"):
        forward(model, _ids(1, 2), _positions(1, 2), cache=model.init_cache(1, 4), kv_len=8)
    with pytest.raises(ValueError, match="kv_len"):
        forward(model, _ids(1, 2), _positions(1, 2), kv_len=2)


def test_remat_and_scan_give_same_gradients():
    ids, pos = _ids(2, 6), _positions(2, 6)

    def grads(**runtime):
        m = Qwen3ForCausalLM(Qwen3Config.preset("tiny", **runtime), rngs=nnx.Rngs(0))
        g = nnx.jit(nnx.grad(lambda m: m(ids, pos).mean()))(m)
        return g.model.embed_tokens.embedding[...]

    base = grads()
    for runtime in [dict(remat="full"), dict(remat="dots", scan_layers=True)]:
        np.testing.assert_allclose(grads(**runtime), base, atol=1e-6)


def test_hf_style_initialisation():
    m = Qwen3ForCausalLM(Qwen3Config.preset("tiny"), rngs=nnx.Rngs(0))
    gate = np.asarray(m.model.layers[0].mlp.gate_proj.kernel[...])
    assert abs(gate.std() - 0.02) < 0.003 and abs(gate.mean()) < 0.003
    np.testing.assert_array_equal(m.model.norm.scale[...], 1.0)
    assert jax.tree.leaves(nnx.state(m, nnx.Param))  # every parameter is an nnx.Param


def test_bf16_cache_moves_exact_bits_without_float32_copies():
    """bf16 KV-cache writes and row copies equal the float32 ones rounded, and compile
    without a float32 copy of the cache (moved as uint16 bit patterns)."""
    from orchestra_jax.models.qwen3 import cache as qwen3_cache
    from orchestra_jax.models.qwen3.cache import KVCache

    rng = np.random.default_rng(0)
    b, kv, s, d = 3, 2, 10, 4
    k = jnp.asarray(rng.normal(size=(b, 1, kv, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, 1, kv, d)), jnp.float32)
    slots = jnp.asarray([[2], [9], [s]])  # slot s is out of range: dropped
    results = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        cache = KVCache.zeros(1, b, kv, s, d, dtype)
        ck, cv = qwen3_cache.write_layer(cache.k[0], cache.v[0], k, v, slots)
        cache = KVCache((ck,), (cv,))
        moved = cache.put_rows(jnp.asarray([2, 0]), cache.take_rows(jnp.asarray([0, 1])))
        results[dtype] = moved
        assert moved.k[0].dtype == dtype
    for got, want in zip(
        jax.tree.leaves(results[jnp.bfloat16]), jax.tree.leaves(results[jnp.float32])
    ):
        np.testing.assert_array_equal(
            np.asarray(got.astype(jnp.float32)),
            np.asarray(want.astype(jnp.bfloat16).astype(jnp.float32)),
        )
    ck = jnp.zeros((b, kv, d, s), jnp.bfloat16)
    hlo = (
        jax.jit(lambda c: qwen3_cache.write_layer(c, c.transpose(0, 1, 3, 2), k, v, slots)[0])
        .lower(ck)
        .compile()
        .as_text()
    )
    assert f"f32[{b},{kv},{d},{s}]" not in hlo
