"""Mixed-precision matmuls: bf16 operands, float32 accumulation, forward and backward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.matmul import dense
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM

BF16 = jnp.bfloat16


def _round(x):
    return x.astype(BF16).astype(jnp.float32)


@pytest.mark.parametrize("w_t", [False, True])
def test_dense_bf16_value_and_gradient_by_hand(w_t):
    """y = bf16(x)·bf16(w) summed in float32; dx = bf16(g)·bf16(w)ᵀ, dw = bf16(x)ᵀ·bf16(g)."""
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (2, 3, 40))
    w = jax.random.normal(kw, (24, 40) if w_t else (40, 24))
    g = jax.random.normal(kg, (2, 3, 24))
    w_in_out = w.T if w_t else w
    y, vjp = jax.vjp(lambda x, w: dense(x, w, BF16, out_dtype=jnp.float32, w_t=w_t), x, w)
    dx, dw = vjp(g)
    hi = jax.lax.Precision.HIGHEST
    want_y = jnp.einsum("bti,io->bto", _round(x), _round(w_in_out), precision=hi)
    want_dx = jnp.einsum("bto,io->bti", _round(g), _round(w_in_out), precision=hi)
    want_dw = jnp.einsum("bti,bto->io", _round(x), _round(g), precision=hi)
    np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(want_dx), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(dw), np.asarray(want_dw.T if w_t else want_dw), rtol=1e-5, atol=1e-5
    )
    # Gradients come back in the inputs' dtypes: float32 master weights keep float32 grads.
    assert dx.dtype == jnp.float32 and dw.dtype == jnp.float32


def test_dense_bf16_backward_multiplies_bf16_operands():
    """The backward matmuls take bf16 operands with a float32 result (the fast case)."""
    x, w = jnp.ones((4, 8)), jnp.ones((8, 16))
    jaxpr = jax.make_jaxpr(jax.grad(lambda x, w: dense(x, w, BF16).sum(), (0, 1)))(x, w)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 3  # forward, dx, dw
    for eqn in dots:
        assert [v.aval.dtype for v in eqn.invars] == [BF16, BF16]
        assert eqn.outvars[0].aval.dtype == jnp.float32


def test_dense_float32_is_a_plain_dot():
    x, w = jnp.arange(6.0).reshape(2, 3), jnp.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(dense(x, w, jnp.float32)), np.asarray(x @ w))


@pytest.mark.parametrize("w_t", [False, True])
def test_dense_float32_gradient_equals_autodiff(w_t):
    """float32 takes the written-out VJP too: its gradients are autodiff's of one dot."""
    kx, kw, kg = jax.random.split(jax.random.key(4), 3)
    x = jax.random.normal(kx, (2, 5, 8))
    w = jax.random.normal(kw, (6, 8) if w_t else (8, 6))
    g = jax.random.normal(kg, (2, 5, 6))
    got = jax.vjp(lambda x, w: dense(x, w, jnp.float32, w_t=w_t), x, w)[1](g)
    want = jax.vjp(lambda x, w: x @ (w.T if w_t else w), x, w)[1](g)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_bf16_compute_with_float32_master_weights_gradients():
    """param_dtype float32, dtype bfloat16: float32 gradients close to the float32 model's."""
    config = Qwen3Config.preset("tiny")
    ids = jax.random.randint(jax.random.key(1), (2, 24), 0, config.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(24), ids.shape)

    def grads(dtype):
        model = Qwen3ForCausalLM(config.replace(dtype=dtype), rngs=nnx.Rngs(0))

        def loss(model):
            logits = model(ids, positions)
            assert logits.dtype == jnp.float32
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ids[..., None], -1))

        return nnx.jit(nnx.value_and_grad(loss))(model)

    (l32, g32), (l16, g16) = grads(jnp.float32), grads(BF16)
    assert abs(float(l16) - float(l32)) < 2e-3
    for a, b in zip(jax.tree.leaves(nnx.state(g32)), jax.tree.leaves(nnx.state(g16))):
        assert b.dtype == jnp.float32
        scale = float(jnp.abs(a).max()) + 1e-12
        assert float(jnp.abs(a - b).max()) / scale < 0.05


def test_scale_features_gradient_equals_autodiff():
    """RMSNorm's scale multiply: its hand-written VJP (dscale as a matmul) equals autodiff."""
    from orchestra_jax.models.qwen3.layers import scale_features

    kx, ks, kg = jax.random.split(jax.random.key(3), 3)
    x, scale, g = (
        jax.random.normal(kx, (3, 5, 8)),
        jax.random.normal(ks, (8,)),
        jax.random.normal(kg, (3, 5, 8)),
    )
    got = jax.vjp(lambda x, s: scale_features(x, s, jnp.float32), x, scale)[1](g)
    want = jax.vjp(lambda x, s: x * s, x, scale)[1](g)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
