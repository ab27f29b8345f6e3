"""The chunked LM head + log-softmax equals the whole-head computation, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestra_jax.rl import grpo
from orchestra_jax.rl.head_logprobs import head_logprobs

N, E, V = 37, 16, 96  # 37 tokens: chunks of 8 leave a partial last chunk


def _inputs(tied, seed=0):
    kh, kw, kt, kc = jax.random.split(jax.random.key(seed), 4)
    hidden = jax.random.normal(kh, (N, E))
    weight = jax.random.normal(kw, (V, E) if tied else (E, V)) * 0.5
    targets = jax.random.randint(kt, (N,), 0, V)
    coef = jax.random.normal(kc, (2, N))  # weights of logp and entropy in a test loss
    return hidden, weight, targets, coef


def _whole_head(hidden, weight, targets, *, tied, temperature, dtype=jnp.float32):
    """The reference: all [N, V] logits at once, then grpo's log-softmax and entropy."""
    h, w = hidden.astype(dtype), weight.astype(dtype)
    logits = jnp.dot(h, w.T if tied else w, preferred_element_type=jnp.float32)
    return (
        grpo.token_logprobs(logits, targets, temperature),
        grpo.entropy_from_logits(logits, temperature),
    )


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("chunk", [8, 37, None])
def test_values_and_gradients_equal_whole_head(tied, chunk):
    hidden, weight, targets, coef = _inputs(tied)

    def loss(fn):
        def f(hidden, weight):
            logp, entropy = fn(hidden, weight)
            return (coef[0] * logp + coef[1] * entropy).sum()

        return jax.jit(jax.value_and_grad(f, (0, 1)))

    chunked = lambda h, w: head_logprobs(  # noqa: E731
        h, w, targets, temperature=0.7, chunk_size=chunk, tied=tied
    )
    whole = lambda h, w: _whole_head(h, w, targets, tied=tied, temperature=0.7)  # noqa: E731
    got_logp, got_ent = jax.jit(chunked)(hidden, weight)
    want_logp, want_ent = whole(hidden, weight)
    np.testing.assert_allclose(np.asarray(got_logp), np.asarray(want_logp), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_ent), np.asarray(want_ent), rtol=1e-5, atol=1e-5)
    (v1, g1), (v2, g2) = loss(chunked)(hidden, weight), loss(whole)(hidden, weight)
    np.testing.assert_allclose(float(v1), float(v2), rtol=1e-5)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_bfloat16_matches_whole_head_in_bfloat16():
    hidden, weight, targets, _ = _inputs(False, seed=1)
    got, _ = head_logprobs(hidden, weight, targets, dtype=jnp.bfloat16, chunk_size=8)
    want, _ = _whole_head(hidden, weight, targets, tied=False, temperature=1.0, dtype=jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert got.dtype == jnp.float32


def test_batch_shape_and_no_entropy():
    hidden, weight, targets, _ = _inputs(False)
    logp, entropy = head_logprobs(
        hidden[:36].reshape(4, 9, E), weight, targets[:36].reshape(4, 9), with_entropy=False
    )
    assert logp.shape == (4, 9) and entropy is None
    with pytest.raises(ValueError, match="disagree"):
        head_logprobs(hidden, weight, targets[:5])
    with pytest.raises(ValueError, match="temperature"):
        head_logprobs(hidden, weight, targets, temperature=0.0)


def _shapes(jaxpr):
    """Every intermediate shape of a jaxpr, including inside scans and checkpoints."""
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            yield tuple(getattr(var.aval, "shape", ()))
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None:
                yield from _shapes(getattr(inner, "jaxpr", inner))


def test_gradient_never_builds_all_tokens_logits():
    """With chunks of 8, no [N, V] (or [chunks, 8, V]) array exists, forward or backward."""
    hidden, weight, targets, coef = _inputs(False)

    def f(hidden, weight):
        logp, entropy = head_logprobs(hidden, weight, targets, chunk_size=8)
        return (coef[0] * logp + coef[1] * entropy).sum()

    shapes = set(_shapes(jax.make_jaxpr(jax.grad(f, (0, 1)))(hidden, weight).jaxpr))
    with_vocab = {s for s in shapes if s and s[-1] == V} - {(E, V)}  # (E, V): the weight
    assert with_vocab == {(8, V)}, with_vocab
