"""Pure sampling functions: truncation, inverse-CDF draws, logprob convention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orchestra_jax.rollout.jax import sampling

sample_tokens = jax.jit(sampling.sample_tokens)  # one compile per shape, not per op
truncation_mask = jax.jit(sampling.truncation_mask)


def reference_mask(logp, top_p, top_k):
    """Sort-based top-k then top-p (renormalised), one row at a time."""
    order = np.argsort(-logp)
    k = len(logp) if top_k <= 0 else min(top_k, len(logp))
    probs = np.exp(logp[order[:k]])
    probs /= probs.sum()
    kept = order[: max(1, int(np.sum(np.cumsum(probs) - probs < top_p)))]
    mask = np.zeros(len(logp), bool)
    mask[kept] = True
    return mask


@pytest.mark.parametrize("top_p, top_k", [(1.0, -1), (0.9, -1), (0.5, 10), (1.0, 3), (0.01, -1)])
def test_truncation_mask_matches_sorting(top_p, top_k):
    logits = jax.random.normal(jax.random.key(1), (6, 50)) * 3
    logp = jax.nn.log_softmax(logits, axis=-1)
    mask = truncation_mask(logp, jnp.full(6, top_p), jnp.full(6, top_k, jnp.int32))
    for row in range(6):
        np.testing.assert_array_equal(
            mask[row], reference_mask(np.asarray(logp[row], np.float64), top_p, top_k)
        )


def test_sample_tokens_greedy_logprobs_and_truncation():
    logits = jax.random.normal(jax.random.key(2), (4, 30)) * 2
    keys = sampling.row_keys(
        jnp.zeros(4, jnp.uint32), jnp.arange(4, dtype=jnp.uint32), jnp.zeros(4, jnp.int32)
    )
    temperature = jnp.array([0.0, 0.5, 1.0, 2.0])
    tokens, logp = sample_tokens(
        logits, keys, temperature, jnp.ones(4), jnp.array([-1, 2, 2, -1], jnp.int32)
    )
    assert int(tokens[0]) == int(jnp.argmax(logits[0]))
    scale = jnp.where(temperature == 0, 1.0, temperature)[:, None]
    expected = jax.nn.log_softmax(logits / scale, axis=-1)[jnp.arange(4), tokens]
    np.testing.assert_allclose(logp, expected, rtol=1e-6)
    top2 = jnp.argsort(-logits, axis=-1)[:, :2]
    assert all(int(tokens[r]) in top2[r].tolist() for r in (1, 2))


def test_draws_follow_the_distribution_and_depend_only_on_seed_and_step():
    probs = jnp.array([0.1, 0.2, 0.3, 0.4])
    n = 4000
    logits = jnp.broadcast_to(jnp.log(probs), (n, 4))
    keys = sampling.row_keys(jnp.full(n, 7, jnp.uint32), jnp.full(n, 9, jnp.uint32), jnp.arange(n))
    tokens, _ = sample_tokens(logits, keys, jnp.ones(n), jnp.ones(n), jnp.full(n, -1))
    freq = np.bincount(np.asarray(tokens), minlength=4) / n
    np.testing.assert_allclose(freq, probs, atol=0.03)
    again, _ = sample_tokens(logits[:5], keys[:5], jnp.ones(5), jnp.ones(5), jnp.full(5, -1))
    np.testing.assert_array_equal(again, tokens[:5])
    assert sampling.split_seed(2**40 + 3) == (256, 3)


def test_row_keys_and_uniforms_are_jax_random_bit_for_bit():
    """The unrolled threefry gives exactly jax.random.fold_in / uniform's values."""
    rng = np.random.default_rng(0)
    n = 512
    hi = jnp.asarray(rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32))
    lo = jnp.asarray(rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32))
    step = jnp.asarray(rng.integers(0, 10**6, n).astype(np.int32))

    @jax.jit
    def reference(hi, lo, step):
        keys = jax.random.wrap_key_data(jnp.stack([hi, lo], -1), impl="threefry2x32")
        keys = jax.vmap(jax.random.fold_in)(keys, step.astype(jnp.uint32))
        u = jax.vmap(lambda k: jax.random.uniform(k, minval=jnp.finfo(jnp.float32).tiny))(keys)
        return jax.random.key_data(keys), u

    keys, u = reference(hi, lo, step)
    ours = jax.jit(sampling.row_keys)(hi, lo, step)
    np.testing.assert_array_equal(ours, keys)
    np.testing.assert_array_equal(jax.jit(sampling.row_uniforms)(ours), u)


def test_greedy_rows_take_the_first_maximum_beside_sampled_rows():
    """Greedy rows are drawn by the inverse-CDF search; ties go to the first index."""
    logits = jax.random.normal(jax.random.key(3), (6, 300)) * 2
    logits = logits.at[0, 7].set(9.0).at[0, 200].set(9.0)  # a tie: argmax is 7
    logits = logits.at[1, 299].set(9.0)  # the last token
    logits = logits.at[2, 0].set(9.0)  # the first token
    temperature = jnp.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.7])
    keys = sampling.row_keys(
        jnp.zeros(6, jnp.uint32), jnp.arange(6, dtype=jnp.uint32), jnp.zeros(6, jnp.int32)
    )
    tokens, logp = sample_tokens(logits, keys, temperature, jnp.ones(6), jnp.full(6, -1))
    greedy = np.asarray(temperature) == 0
    np.testing.assert_array_equal(np.asarray(tokens)[greedy], np.argmax(logits, -1)[greedy])
    scale = jnp.where(temperature == 0, 1.0, temperature)[:, None]
    expected = jax.nn.log_softmax(logits / scale, axis=-1)[jnp.arange(6), tokens]
    np.testing.assert_allclose(logp, expected, rtol=1e-6)


def test_min_p_keeps_tokens_within_a_factor_of_the_most_likely():
    probs = np.array([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25], [0.7, 0.2, 0.06, 0.04]])
    logp = jnp.log(jnp.asarray(probs)) + 3.0  # any per-row shift
    mask = jax.jit(sampling.min_p_mask)(logp, jnp.array([0.3, 1.0, 0.0]))
    # 0.3 * 0.5 = 0.15 keeps 0.5, 0.3, 0.15; all equal under 1.0; 0 keeps everything.
    assert np.asarray(mask).tolist() == [[True, True, True, False], [True] * 4, [True] * 4]
    draws = np.asarray(
        [
            sample_tokens(
                jnp.log(jnp.asarray(probs)),
                sampling.row_keys(jnp.full(3, seed, jnp.uint32), jnp.arange(3), jnp.zeros(3)),
                jnp.ones(3),
                jnp.ones(3),
                jnp.full(3, -1),
                jnp.array([0.3, 0.0, 0.5]),
            )[0]
            for seed in range(40)
        ]
    )
    # Row 0 never draws token 3 (0.05 < 0.15); row 2 only its most likely (0.2 < 0.35).
    assert set(draws[:, 0]) <= {0, 1, 2} and set(draws[:, 2]) == {0}


def test_the_most_likely_token_survives_a_vanishing_top_p():
    """top_p of 1e-40 is a float32 zero: the row still draws its most likely token."""
    logits = jax.random.normal(jax.random.key(5), (3, 40))
    keys = sampling.row_keys(
        jnp.zeros(3, jnp.uint32), jnp.arange(3, dtype=jnp.uint32), jnp.zeros(3)
    )
    tokens, _ = sample_tokens(logits, keys, jnp.ones(3), jnp.full(3, 1e-40), jnp.full(3, -1))
    np.testing.assert_array_equal(tokens, np.argmax(logits, -1))


def test_penalties_by_hand():
    logits = jnp.array([[2.0, -1.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]])
    counts = jnp.array([[2, 1, 0, 0], [0, 0, 0, 0]])
    out = sampling.apply_penalties(
        logits, counts, jnp.array([2.0, 2.0]), jnp.array([0.5, 0.5]), jnp.array([0.25, 0.25])
    )
    # Token 0 (seen twice): 2 - 0.5 * 2 - 0.25 = 0.75 >= 0, / 2; token 1: -1 - 0.5 - 0.25, * 2.
    np.testing.assert_allclose(out[0], [0.375, -3.5, 0.5, 3.0])
    np.testing.assert_allclose(out[1], logits[1])  # nothing generated yet: unchanged
    counted = sampling.count_tokens(counts, jnp.array([3, 3]), jnp.array([True, False]))
    assert np.asarray(counted).tolist() == [[2, 1, 0, 1], [0, 0, 0, 0]]


def test_top_logprobs_are_the_most_likely_under_the_temperature():
    logits = jax.random.normal(jax.random.key(6), (2, 30)) * 2
    values, ids = jax.jit(sampling.top_logprobs, static_argnums=2)(logits, jnp.array([0.0, 0.5]), 4)
    for row, t in enumerate([1.0, 0.5]):
        logp = np.asarray(jax.nn.log_softmax(logits[row] / t))
        order = np.argsort(-logp)[:4]
        np.testing.assert_array_equal(ids[row], order)
        np.testing.assert_allclose(values[row], logp[order], rtol=1e-5)
