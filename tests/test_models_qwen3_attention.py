"""Every attention implementation equals the direct computation, in value and gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models import attention_kernels
from orchestra_jax.models.attention_kernels import grouped_attention
from orchestra_jax.models.attention_mask import AttentionMask
from orchestra_jax.models.flash_attention import _Blocks, flash_attention
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM


def _qkv(b, t, s, h, kv_heads, d, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (b, t, h, d)).astype(dtype)
    k = jax.random.normal(kk, (b, kv_heads, s, d)).astype(dtype)
    v = jax.random.normal(kv, (b, kv_heads, s, d)).astype(dtype)
    return q, k, v


def _packed_segments(b, t):
    """Row 0: two packed sequences then padding; row 1: one sequence, no padding."""
    seg = np.zeros((b, t), np.int32)
    seg[0, : t // 3], seg[0, t // 3 : t - 7] = 1, 2
    seg[1:] = 1
    return jnp.asarray(seg)


def _value_and_grads(fn, q, k, v, weights):
    """fn's output and the gradients of sum(output * weights) with respect to q, k, v."""

    @jax.jit
    def run(q, k, v, weights):
        loss = lambda q, k, v: (fn(q, k, v).astype(jnp.float32) * weights).sum()  # noqa: E731
        return fn(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)

    return run(q, k, v, weights)


def _assert_same(got, want, rows, tol):
    """Equal on query rows that see at least one key (`rows` bool [B, T])."""
    (out, grads), (ref, ref_grads) = got, want
    np.testing.assert_allclose(
        np.asarray(out, np.float32)[rows], np.asarray(ref, np.float32)[rows], atol=tol, rtol=tol
    )
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=tol)


@pytest.mark.parametrize(
    "t,heads,kv_heads,block_q,block_k",
    [(96, 4, 2, 32, 32), (100, 4, 2, 32, 16), (64, 4, 4, 64, 64), (70, 8, 1, 16, 48)],
)
def test_flash_equals_direct_causal_packed(t, heads, kv_heads, block_q, block_k):
    b, d = 2, 8
    q, k, v = _qkv(b, t, t, heads, kv_heads, d)
    mask = AttentionMask.causal(_packed_segments(b, t))
    rows = np.asarray(mask.q_segment) != 0
    # Padding rows' outputs are unused: the loss never reaches them.
    weights = jax.random.normal(jax.random.key(9), q.shape) * rows[:, :, None, None]
    want = _value_and_grads(
        lambda q, k, v: grouped_attention(q, k, v, mask.dense()), q, k, v, weights
    )
    got = _value_and_grads(
        lambda q, k, v: flash_attention(q, k, v, mask, block_q=block_q, block_k=block_k),
        q,
        k,
        v,
        weights,
    )
    _assert_same(got, want, rows, 2e-5)
    # Padding rows see nothing: output 0.
    assert not np.any(np.asarray(got[0])[~rows])


def test_flash_cache_mask_queries_after_a_prefix():
    """Queries at positions 5.. reading a 40-slot cache (the prefill / shared-prompt case)."""
    b, t, s, heads, kv_heads, d = 2, 12, 40, 4, 2, 8
    q, k, v = _qkv(b, t, s, heads, kv_heads, d, seed=3)
    positions = 5 + jnp.broadcast_to(jnp.arange(t), (b, t))
    seg = jnp.ones((b, t), jnp.int32).at[1, 9:].set(0)  # row 1 ends with padding
    mask = AttentionMask.cache(positions, s, seg)
    rows = np.asarray(seg) != 0
    weights = jax.random.normal(jax.random.key(4), q.shape) * rows[:, :, None, None]
    want = _value_and_grads(
        lambda q, k, v: grouped_attention(q, k, v, mask.dense()), q, k, v, weights
    )
    got = _value_and_grads(
        lambda q, k, v: flash_attention(q, k, v, mask, block_q=8, block_k=16), q, k, v, weights
    )
    _assert_same(got, want, rows, 2e-5)


def test_flash_bfloat16_is_as_close_as_direct_bfloat16():
    """In bfloat16 both keep float32 scores; flash is no further from float32 than direct."""
    b, t, heads, kv_heads, d = 2, 64, 4, 2, 16
    q, k, v = _qkv(b, t, t, heads, kv_heads, d)
    mask = AttentionMask.causal(jnp.ones((b, t), jnp.int32))
    exact = grouped_attention(q, k, v, mask.dense())
    bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    direct = grouped_attention(*bf, mask.dense())
    flash = flash_attention(*bf, mask, block_q=16, block_k=16)
    assert flash.dtype == jnp.bfloat16
    err_direct = float(jnp.abs(direct.astype(jnp.float32) - exact).max())
    err_flash = float(jnp.abs(flash.astype(jnp.float32) - exact).max())
    assert err_flash <= 1.5 * err_direct + 1e-3


def test_flash_skips_key_blocks_after_the_queries():
    """Causal: query block i never reads key blocks > i (NaN keys there change nothing)."""
    b, t, d = 1, 64, 8
    q, k, v = _qkv(b, t, t, 2, 2, d)
    mask = AttentionMask.causal(jnp.ones((b, t), jnp.int32))
    poisoned = v.at[:, :, 48:].set(jnp.nan)
    out = flash_attention(q, k, poisoned, mask, block_q=16, block_k=16)
    assert np.all(np.isfinite(np.asarray(out[:, :48])))


def _uneven_packed_segments():
    """Three rows of very uneven packed sequences (lengths 5 to 150) and padding."""
    seg = np.zeros((3, 256), np.int32)
    for row, lengths in enumerate([(150, 60, 30), (5, 7, 200, 40), (90, 90, 60)]):
        start = 0
        for i, n in enumerate(lengths, start=1):
            seg[row, start : start + n] = i
            start += n
    return jnp.asarray(seg)


def test_flash_packed_rows_read_only_their_own_key_blocks():
    """Query blocks skip the key blocks of earlier packed sequences in every row: NaN
    values there change nothing, and the output and gradients equal the direct
    computation's on very uneven packed rows."""
    seg = jnp.asarray(np.tile(np.repeat(np.arange(1, 5), 64), (2, 1)).astype(np.int32))
    mask = AttentionMask.causal(seg)  # both rows: sequences at 0, 64, 128, 192
    q, k, v = _qkv(2, 256, 256, 2, 2, 8)
    blocks = _Blocks(q, k, mask, 32, 32)
    np.testing.assert_array_equal(blocks.first_kv, [0, 0, 2, 2, 4, 4, 6, 6])
    np.testing.assert_array_equal(blocks.num_kv, np.arange(1, 9))
    poisoned = v.at[:, :, :192].set(jnp.nan)  # the first three sequences' values
    out = flash_attention(q, k, poisoned, mask, block_q=32, block_k=32)
    assert np.all(np.isfinite(np.asarray(out[:, 192:])))

    seg = _uneven_packed_segments()
    mask = AttentionMask.causal(seg)
    rows = np.asarray(seg) != 0
    q, k, v = _qkv(3, 256, 256, 4, 2, 8, seed=5)
    weights = jax.random.normal(jax.random.key(6), q.shape) * rows[:, :, None, None]
    want = _value_and_grads(
        lambda q, k, v: grouped_attention(q, k, v, mask.dense()), q, k, v, weights
    )
    for block_q, block_k in ((32, 32), (16, 64), (64, 16)):
        got = _value_and_grads(
            lambda q, k, v, bq=block_q, bk=block_k: flash_attention(
                q, k, v, mask, block_q=bq, block_k=bk
            ),
            q,
            k,
            v,
            weights,
        )
        _assert_same(got, want, rows, 2e-5)


def test_cudnn_path_with_xla_equals_direct():
    """The fused path's call (`jax.nn.dot_product_attention`, causal, per-row lengths) run
    with XLA's implementation, so it is checked on CPU; packed rows take the flash branch."""
    b, t, heads, kv_heads, d = 2, 32, 4, 2, 8
    q, k, v = _qkv(b, t, t, heads, kv_heads, d)
    seg = jnp.ones((b, t), jnp.int32).at[0, 20:].set(0)
    for segments in (seg, _packed_segments(b, t)):
        mask = AttentionMask.causal(segments)
        rows = np.asarray(segments) != 0
        weights = jax.random.normal(jax.random.key(2), q.shape) * rows[:, :, None, None]
        fused = lambda q, k, v, mask=mask: attention_kernels.cudnn_causal(  # noqa: E731
            q, k, v, mask, implementation="xla", block_size=16
        )
        want = _value_and_grads(
            lambda q, k, v, mask=mask: grouped_attention(q, k, v, mask.dense()), q, k, v, weights
        )
        _assert_same(_value_and_grads(fused, q, k, v, weights), want, rows, 2e-5)


def test_splash_kernel_interpreted_equals_direct():
    """The TPU splash kernel, run by the Pallas interpreter on CPU (T a multiple of 128)."""
    b, t, heads, kv_heads, d = 1, 128, 2, 1, 128
    q, k, v = _qkv(b, t, t, heads, kv_heads, d)
    seg = jnp.ones((b, t), jnp.int32).at[0, 70:].set(2)
    mask = AttentionMask.causal(seg)
    rows = np.ones((b, t), bool)
    weights = jax.random.normal(jax.random.key(5), q.shape)
    want = _value_and_grads(
        lambda q, k, v: grouped_attention(q, k, v, mask.dense()), q, k, v, weights
    )
    got = _value_and_grads(
        lambda q, k, v: attention_kernels.splash_causal(q, k, v, mask, interpret=True),
        q,
        k,
        v,
        weights,
    )
    _assert_same(got, want, rows, 1e-4)


def test_registry_names_and_module_paths():
    assert {"auto", "flash", "xla", "cudnn", "splash"} <= set(attention_kernels.ATTENTION)
    assert attention_kernels.auto_name(jnp.float32) == "flash"  # this CPU backend
    fn = attention_kernels.get_attention("orchestra_jax.models.attention_kernels:xla_attention")
    assert fn is attention_kernels.xla_attention
    with pytest.raises(ValueError, match="unknown attention implementation"):
        Qwen3Config.preset("tiny", attention="fused")


@pytest.mark.parametrize("scan", [False, True])
def test_model_flash_equals_direct(scan):
    """The whole model: logits and parameter gradients with flash vs direct attention."""
    config = Qwen3Config.preset("tiny", scan_layers=scan, attention_block_size=16)
    ids = jax.random.randint(jax.random.key(1), (2, 40), 0, config.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(40), ids.shape)
    seg = _packed_segments(2, 40)
    results = []
    for attention in ("xla", "flash"):
        model = Qwen3ForCausalLM(config.replace(attention=attention), rngs=nnx.Rngs(0))

        def loss(model):
            logits = model(ids, positions, segment_ids=seg)
            return (jax.nn.log_softmax(logits) * (seg != 0)[..., None]).sum() / 100.0

        value, grads = nnx.jit(nnx.value_and_grad(loss))(model)
        results.append((value, nnx.state(grads)))
    (v0, g0), (v1, g1) = results
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-4)
