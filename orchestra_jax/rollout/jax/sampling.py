"""Next-token sampling as pure, jit-friendly functions over a batch of rows.

Every per-request setting is an array with one entry per row (never a Python
constant), so one compiled function serves any mix of greedy and sampled rows:

    temperature [B]  0 = greedy (argmax of the raw logits)
    top_p       [B]  1 = off
    top_k       [B]  <= 0 or >= V = off
    min_p       [B]  0 = off (optional argument)

For a sampled row with temperature T the distribution is
    logp = log_softmax(logits / T)
restricted to the top-k tokens, then to the smallest prefix (by probability,
after renormalising the top-k) whose mass reaches top_p, then to the tokens
whose probability is at least min_p times the largest one, and renormalised.
The most likely token always survives. The reported log-probability is always
`logp[token]` (before truncation), the quantity the learner recomputes; for
greedy rows T = 1 is used.

Repetition, frequency and presence penalties (`apply_penalties`) change the
logits before all of this, from the counts of the tokens a row has generated;
the reported log-probability is then that of the penalised logits (as SGLang
reports it), which the learner does not recompute.

Randomness: row b draws one uniform u from `fold_in(key(seed_b), step_b)` and
takes the token where the cumulative probability first reaches u (inverse CDF).
The key depends only on the request's seed and the token's index, so a request
samples the same tokens whatever else shares the batch, and one uniform per row
replaces a vocabulary-sized Gumbel draw. Keys are raw threefry2x32 key data
(uint32 [B, 2]) and the hash is written out here, bit for bit the values of
`jax.random.fold_in` / `jax.random.uniform`: on CPU JAX lowers threefry to a
rolled 5-iteration while loop, two of which cost about 3 % of a demo-model
decode step (and 355 of its 782 runtime thunks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(
    key0: jax.Array, key1: jax.Array, x0: jax.Array, x1: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 hash (20 rounds) of counters (x0, x1) under key (key0, key1), unrolled.

    The same function as JAX's threefry2x32 primitive, whose CPU lowering is a
    while loop (one runtime thunk per op and iteration); unrolled, XLA fuses it
    into a few loop kernels.
    """

    def rotate_left(v, r):
        return (v << jnp.uint32(r)) | (v >> jnp.uint32(32 - r))

    ks = (key0, key1, key0 ^ key1 ^ jnp.uint32(0x1BD11BDA))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _THREEFRY_ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = rotate_left(x1, r) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + jnp.uint32(i + 1)
    return x0, x1


def row_keys(seed_hi: jax.Array, seed_lo: jax.Array, step: jax.Array) -> jax.Array:
    """uint32 [B, 2] threefry key data: fold_in(key_from_64bit_seed, step) per row.

    Equal to `jax.random.key_data(jax.random.fold_in(key, step))` for the key
    `wrap_key_data([seed_hi, seed_lo])` (uint32 inputs).
    """
    zero = jnp.zeros_like(seed_hi, dtype=jnp.uint32)
    k0, k1 = _threefry2x32(
        seed_hi.astype(jnp.uint32), seed_lo.astype(jnp.uint32), zero, step.astype(jnp.uint32)
    )
    return jnp.stack([k0, k1], axis=-1)


def row_uniforms(keys: jax.Array) -> jax.Array:
    """float32 [B] in [tiny, 1): `jax.random.uniform(key, minval=tiny, maxval=1)` per row."""
    zero = jnp.zeros(keys.shape[:-1], jnp.uint32)
    b0, b1 = _threefry2x32(keys[..., 0], keys[..., 1], zero, zero)
    # JAX's uniform: 23 random mantissa bits under exponent 0 give [1, 2), minus 1.
    floats = (
        jax.lax.bitcast_convert_type(
            (b0 ^ b1) >> jnp.uint32(9) | jnp.uint32(0x3F800000), jnp.float32
        )
        - 1.0
    )
    tiny = jnp.finfo(jnp.float32).tiny
    return jnp.maximum(tiny, floats * (1.0 - tiny) + tiny)


def split_seed(seed: int) -> tuple[int, int]:
    """A 64-bit seed as (high, low) uint32 words, for `row_keys`."""
    return (seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF


def _largest_threshold(logp: jax.Array, enough, iterations: int) -> jax.Array:
    """Per row, the largest tau (to ~range / 2^iterations) with enough(logp >= tau) true.

    Bisection keeps enough(lo) true and enough(hi) false; `enough` must be monotone
    (true for low thresholds). Replaces a vocabulary sort, which is slow on CPU.
    """
    # Tokens a constraint forbids are -inf: never kept, and left out of the range.
    lo = jnp.min(jnp.where(jnp.isfinite(logp), logp, jnp.inf), axis=-1)
    hi = jnp.max(logp, axis=-1) + 1.0

    def step(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        ok = enough(logp >= mid[:, None])
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, iterations, step, (lo, hi))
    return lo


def truncation_mask(
    logp: jax.Array, top_p: jax.Array, top_k: jax.Array, iterations: int = 24
) -> jax.Array:
    """bool [B, V]: tokens kept by top-k, then top-p over the renormalised top-k.

    top-k keeps the k most likely tokens; top-p then keeps the smallest set of the
    most likely remaining tokens whose (renormalised) mass reaches top_p. Both are
    found as log-prob thresholds by bisection, so tokens tied with the last kept
    one (within ~range / 2^24 nats) are kept too; at least one token always survives.
    """
    vocab = logp.shape[-1]
    k = jnp.where((top_k <= 0) | (top_k > vocab), vocab, top_k)[:, None]
    tau_k = _largest_threshold(
        logp, lambda kept: jnp.sum(kept, -1, keepdims=True)[:, 0] >= k[:, 0], iterations
    )
    in_top_k = logp >= tau_k[:, None]
    probs = jnp.where(in_top_k, jnp.exp(logp - jnp.max(logp, axis=-1, keepdims=True)), 0.0)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    tau_p = _largest_threshold(
        logp, lambda kept: jnp.sum(jnp.where(kept, probs, 0.0), -1) >= top_p, iterations
    )
    tau_p = jnp.where(top_p >= 1.0, -jnp.inf, tau_p)  # rounding must not drop the tail
    return logp >= jnp.maximum(tau_k, tau_p)[:, None]


_CDF_BLOCK = 64


def inverse_cdf_sample(weights: jax.Array, keep: jax.Array, u: jax.Array) -> jax.Array:
    """int32 [B]: per row, the first token where the running mass of `weights` restricted
    to `keep` reaches u times its total (u in (0, 1], weights >= 0, need not sum to 1).

    For u ~ U(0, 1] that is a draw from weights / total; a dropped token adds no mass,
    so it can never be the first to reach the target. The search runs in two levels,
    so no vocabulary-long cumulative sum is taken (XLA's CPU cumsum over 4096
    entries costs more than the rest of sampling): the cumulative sum over blocks
    of `_CDF_BLOCK` tokens finds the block where the CDF reaches the target, then
    the cumulative sum inside that block finds the token.
    """
    b, vocab = weights.shape
    probs = jnp.where(keep, weights, 0.0)
    blocks = -(-vocab // _CDF_BLOCK)
    probs = jnp.pad(probs, ((0, 0), (0, blocks * _CDF_BLOCK - vocab)))
    probs = probs.reshape(b, blocks, _CDF_BLOCK)
    block_cdf = jnp.cumsum(jnp.sum(probs, axis=-1), axis=-1)  # [B, blocks]
    target = u * block_cdf[:, -1]
    # The block holding the first cdf >= target has mass (cdf rises there).
    block = jnp.minimum(jnp.sum(block_cdf < target[:, None], axis=-1), blocks - 1)
    before = jnp.where(
        block > 0,
        jnp.take_along_axis(block_cdf, jnp.maximum(block - 1, 0)[:, None], axis=-1)[:, 0],
        0.0,
    )
    inner = jnp.take_along_axis(probs, block[:, None, None], axis=1)[:, 0]  # [B, _CDF_BLOCK]
    inside = jnp.sum(before[:, None] + jnp.cumsum(inner, axis=-1) < target[:, None], axis=-1)
    # Rounding may put target above the block's own running sum: stay on a kept token.
    last_kept = _CDF_BLOCK - 1 - jnp.argmax(inner[:, ::-1] > 0, axis=-1)
    token = block * _CDF_BLOCK + jnp.minimum(inside, last_kept)
    return jnp.minimum(token, vocab - 1).astype(jnp.int32)


def min_p_mask(logp: jax.Array, min_p: jax.Array) -> jax.Array:
    """bool [B, V]: tokens with p >= min_p * max p, i.e. logp >= max logp + log(min_p).

    min_p [B] in [0, 1]; 0 (log 0 = -inf) keeps every token, 1 the most likely ones.
    logp may be shifted by any per-row constant.
    """
    floor = jnp.max(logp, axis=-1) + jnp.log(min_p)
    return logp >= floor[:, None]


def apply_penalties(
    logits: jax.Array,
    counts: jax.Array,
    repetition: jax.Array,
    frequency: jax.Array,
    presence: jax.Array,
) -> jax.Array:
    """Logits [B, V] penalised by the counts [B, V] of the tokens each row generated.

    For a token generated c > 0 times (SGLang's penalties, output tokens only):
        l' = l - frequency * c - presence
        l'' = l' * repetition   if l' < 0   else   l' / repetition
    Untouched where c = 0; repetition 1, frequency 0 and presence 0 change nothing.
    """
    counts = counts.astype(jnp.float32)
    seen = counts > 0
    logits = logits.astype(jnp.float32)
    logits = logits - frequency[:, None] * counts - presence[:, None] * seen
    rep = repetition[:, None]
    scaled = jnp.where(logits < 0, logits * rep, logits / rep)
    return jnp.where(seen, scaled, logits)


def count_tokens(counts: jax.Array, tokens: jax.Array, live: jax.Array) -> jax.Array:
    """counts [B, V] with each live row's token [B] counted once more."""
    rows = jnp.arange(tokens.shape[0])
    return counts.at[rows, tokens].add(live.astype(counts.dtype))


def top_logprobs(logits: jax.Array, temperature: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """(logprobs f32 [B, k], ids int32 [B, k]): the k most likely tokens per row, by
    log_softmax(logits / T) (T = 1 for greedy rows), most likely first."""
    scale = jnp.where(temperature <= 0.0, 1.0, temperature)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / scale[:, None], axis=-1)
    values, ids = jax.lax.top_k(logp, k)
    return values, ids.astype(jnp.int32)


def sample_tokens(
    logits: jax.Array,
    keys: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    min_p: jax.Array | None = None,
    allowed: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(tokens int32 [B], logprobs f32 [B]) for float logits [B, V]; see the module docstring.

    keys: `row_keys`. Each pass over [B, V] costs about a tenth of the LM head on
    CPU at V = 4096, so the passes are shared: one max, one exp (the draw's
    weights and log-softmax's normaliser), and greedy rows are drawn by the same
    search as sampled ones (see below) rather than by a separate argmax.

    allowed: None, or bool [B, V], the tokens a constraint lets each row take
    (`rollout/token_constraint.py`; a row must allow at least one). The draw is
    then from the distribution restricted to them and renormalised, before
    top-k/top-p/min-p (which apply to the restricted distribution), and a greedy
    row takes its most likely allowed token; the reported log-probability stays
    that of the unrestricted distribution, the quantity the learner recomputes
    (as it does under truncation).
    """
    logits = logits.astype(jnp.float32)
    greedy = temperature <= 0.0
    scale = jnp.where(greedy, 1.0, temperature)
    if allowed is not None:
        tokens, _ = sample_tokens(
            jnp.where(allowed, logits, -jnp.inf), keys, temperature, top_p, top_k, min_p
        )
        logp = jax.nn.log_softmax(logits / scale[:, None], axis=-1)
        return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    shifted = logits / scale[:, None]
    shifted = shifted - jnp.max(shifted, axis=-1, keepdims=True)
    weights = jnp.exp(shifted)  # unnormalised, at most 1
    log_total = jnp.log(jnp.sum(weights, axis=-1))
    vocab = logits.shape[-1]
    if min_p is None:
        min_p = jnp.zeros_like(top_p)
    truncating = ~greedy & ((top_p < 1.0) | ((top_k > 0) & (top_k < vocab)) | (min_p > 0.0))
    # The search behind top-p/top-k costs more than the rest of sampling: skip it
    # for batches where no row asks for truncation (a runtime branch, not a recompile).
    keep = jax.lax.cond(
        jnp.any(truncating),
        lambda: (
            truncation_mask(
                shifted - log_total[:, None],
                jnp.where(truncating, top_p, 1.0),
                jnp.where(truncating, top_k, -1),
            )
            & min_p_mask(shifted, jnp.where(truncating, min_p, 0.0))
        ),
        lambda: jnp.ones_like(shifted, dtype=bool),
    )
    # The most likely token (shifted == 0) always survives, however small top_p or
    # large min_p: rounding must never leave a row with nothing to draw.
    keep = keep | (shifted == 0.0)
    # Greedy rows (scale 1) hit 0 exactly at their logits' maxima: keeping only those
    # and aiming at the smallest positive mass gives the first maximum, jnp.argmax(logits).
    keep = keep & (~greedy[:, None] | (shifted == 0.0))
    u = jnp.where(greedy, jnp.finfo(jnp.float32).tiny, row_uniforms(keys))
    tokens = inverse_cdf_sample(weights, keep, u)
    token_logp = jnp.take_along_axis(shifted, tokens[:, None], axis=-1)[:, 0] - log_total
    return tokens, token_logp
