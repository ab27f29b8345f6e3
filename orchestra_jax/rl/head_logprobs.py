"""Target log-probabilities and entropies through the LM head, a chunk of tokens at a time.

    logp, entropy = head_logprobs(hidden, weight, targets, dtype=jnp.bfloat16,
                                  temperature=1.0, chunk_size=1024)

hidden [..., E] final hidden states; weight [E, V] (an untied `lm_head` kernel)
or [V, E] with `tied=True` (the embedding table); targets int [...]. Per token,
with z = (h · W) / T in float32 (matmul in `dtype`, float32 accumulation):

    logp    = z[target] − logsumexp(z)
    entropy = logsumexp(z) − Σ_v softmax(z)_v z_v

The tokens are cut into chunks of `chunk_size` rows run by `lax.scan`, each
under `jax.checkpoint`: the backward pass recomputes a chunk's logits instead
of storing them, so a few [chunk_size, V] float32 blocks are alive at once,
never [tokens, V] (at Qwen3's V = 151,936, 4,096 tokens of float32 logits are
2.5 GB). XLA's memory analysis of the compiled gradient puts the blocks at two
without the entropy and three with it (the logits, their exponentials, the
entropy's product term): 512 and 768 MiB at the default 441-token chunk.
Values and gradients equal the whole-head computation (`grpo.token_logprobs`,
`grpo.entropy_from_logits` of the model's logits). `chunk_size=None` runs all
tokens as one chunk, and so does a call with at most `chunk_size` tokens; one
chunk keeps its logits for the backward pass rather than recomputing them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orchestra_jax.models.matmul import dense

LOGITS_CHUNK_BYTES = 256 * 2**20  # One block of a chunk's float32 logits, when no size is given.


def auto_chunk_size(vocab_size: int) -> int:
    """Tokens whose float32 logits fill `LOGITS_CHUNK_BYTES`: 16,384 at V = 4,096,
    441 at Qwen3's V = 151,936."""
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab_size))


def _chunk_stats(h, w, targets, dtype, temperature, tied, with_entropy):
    """(logp [n], entropy [n] or None) for one chunk of hidden states [n, E]."""
    z = dense(h, w, dtype, out_dtype=jnp.float32, w_t=tied) / temperature
    # One exp pass serves both: lse = m + log Σ e, H = lse − Σ e·z / Σ e, e = exp(z − m).
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    e = jnp.exp(z - m)
    total = jnp.sum(e, axis=-1)
    lse = m[:, 0] + jnp.log(total)
    logp = jnp.take_along_axis(z, targets[:, None], axis=-1)[:, 0] - lse
    if not with_entropy:
        return logp, None
    return logp, lse - jnp.sum(e * z, axis=-1) / total


def head_logprobs(
    hidden: jax.Array,
    weight: jax.Array,
    targets: jax.Array,
    *,
    dtype=jnp.float32,
    temperature: float = 1.0,
    chunk_size: int | None = 1024,
    tied: bool = False,
    with_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
    """(log p(target) [...], entropy [...] or None), float32; see the module docstring."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
    lead = targets.shape
    if hidden.shape[:-1] != lead:
        raise ValueError(f"hidden {hidden.shape} and targets {targets.shape} disagree")
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1).astype(jnp.int32)
    n = h.shape[0]

    def stats(h, t):
        return _chunk_stats(h, weight, t, dtype, temperature, tied, with_entropy)

    if chunk_size is None or n <= chunk_size:
        logp, entropy = stats(h, t)  # one chunk: its logits are kept for the backward pass
    else:
        chunks = -(-n // chunk_size)
        pad = chunks * chunk_size - n
        h = jnp.pad(h, ((0, pad), (0, 0))).reshape(chunks, chunk_size, -1)
        t = jnp.pad(t, (0, pad)).reshape(chunks, chunk_size)
        body = jax.checkpoint(lambda _, xs: (None, stats(*xs)), prevent_cse=False)
        _, (logp, entropy) = jax.lax.scan(body, None, (h, t))
        logp = logp.reshape(-1)[:n]
        entropy = None if entropy is None else entropy.reshape(-1)[:n]
    logp = logp.reshape(lead)
    return logp, None if entropy is None else entropy.reshape(lead)
