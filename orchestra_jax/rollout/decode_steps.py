"""The compiled pieces of JaxEngine: prefill, decode loop, and cache copies.

Pure functions of (model state, cache, per-row arrays), jitted once per shape
bucket. Every trace bumps `compile_counts[<name and shapes>]`, which is how
benchmarks and tests check that compiles stay bounded. The cache is the model's
KVCache (one array per layer; see `qwen3_cache`); see `jax_engine.py` for
how the scheduler sizes it and feeds these functions.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
from flax import nnx

from orchestra_jax.rollout import sampling


class DecodeSteps:
    """Jitted prefill (from scratch or on a cached prefix) / insert / resize / decode
    for one model graph."""

    def __init__(self, graphdef, *, max_seq_len: int, cache_dtype=None):
        self.graphdef = graphdef
        self.max_seq_len = max_seq_len
        self.cache_dtype = cache_dtype
        self.compile_counts: collections.Counter[str] = collections.Counter()
        self.prefill = jax.jit(self._prefill_fn)
        self.prefill_cached = jax.jit(self._prefill_cached_fn, donate_argnums=(1,))
        self.insert = jax.jit(self._insert_fn, donate_argnums=(0,))
        self.resize = jax.jit(self._resize_fn, static_argnames=("length",))
        self.decode = jax.jit(self._decode_fn, static_argnames=("num_steps",), donate_argnums=(1,))

    def _prefill_fn(self, state, ids, lengths, temperature, top_p, top_k, seed_hi, seed_lo):
        """KV cache (R rows, T slots) of prompts ids [R, T]; first tokens."""
        self.compile_counts[f"prefill(rows={ids.shape[0]}, len={ids.shape[1]})"] += 1  # at trace
        model = nnx.merge(self.graphdef, state)
        r, t = ids.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), ids.shape)
        segments = (positions < lengths[:, None]).astype(jnp.int32)
        cache = model.init_cache(r, t, self.cache_dtype)
        hidden, cache = model.hidden_states(ids, positions, segment_ids=segments, cache=cache)
        last_index = jnp.maximum(lengths - 1, 0)[:, None, None]
        # Only each prompt's last position needs logits: the LM head runs on R rows, not R*T.
        last = model.logits(jnp.take_along_axis(hidden, last_index, axis=1))[:, 0]
        keys = sampling.row_keys(seed_hi, seed_lo, jnp.zeros_like(lengths))
        tokens, logp = sampling.sample_tokens(last, keys, temperature, top_p, top_k)
        return cache, tokens, logp

    def _prefill_cached_fn(
        self,
        state,
        cache,
        sources,
        targets,
        starts,
        ids,
        lengths,
        temperature,
        top_p,
        top_k,
        seed_hi,
        seed_lo,
    ):
        """Prefill prompt suffixes on top of prefixes already in the cache; first tokens.

        Row r continues the first starts[r] slots of cache row sources[r] with its
        lengths[r] tokens ids[r] at positions starts[r], starts[r] + 1, ..., and the
        row lands in cache row targets[r] (index >= batch: dropped). The source row
        is read before any target is written, so a target may be a source. Slots
        from starts[r] on keep the source's stale values until overwritten: the
        suffix writes its own slots before attending, and later slots are masked.
        The first token is sampled as in `_prefill_fn` (same key, token index 0).
        """
        self.compile_counts[
            f"prefill_cached(rows={ids.shape[0]}, len={ids.shape[1]}, cache={cache.max_len})"
        ] += 1
        model = nnx.merge(self.graphdef, state)
        offsets = jnp.arange(ids.shape[1], dtype=jnp.int32)[None]
        positions = starts[:, None] + offsets
        segments = (offsets < lengths[:, None]).astype(jnp.int32)
        hidden, rows = model.hidden_states(
            ids, positions, segment_ids=segments, cache=cache.take_rows(sources)
        )
        last_index = jnp.maximum(lengths - 1, 0)[:, None, None]
        last = model.logits(jnp.take_along_axis(hidden, last_index, axis=1))[:, 0]
        keys = sampling.row_keys(seed_hi, seed_lo, jnp.zeros_like(lengths))
        tokens, logp = sampling.sample_tokens(last, keys, temperature, top_p, top_k)
        return cache.put_rows(targets, rows), tokens, logp

    def _insert_fn(self, cache, rows, prefilled):
        """Copy a prefilled cache's rows into slots `rows` [R] (index >= batch: dropped).

        Only the first T slots of each row change; later slots keep stale values,
        which no query reads before decode overwrites them (slot p is written
        before the query at p attends to it).
        """
        self.compile_counts[
            f"insert(rows={rows.shape[0]}, len={prefilled.max_len}, cache={cache.max_len})"
        ] += 1
        return cache.put_prefix(rows, prefilled)

    def _resize_fn(self, cache, *, length):
        """The cache with `length` slots per row: cut, or zero-padded at the end."""
        self.compile_counts[f"resize({cache.max_len}->{length})"] += 1
        return cache.resized(length)

    def _decode_fn(
        self,
        state,
        cache,
        tokens,
        positions,
        counts,
        done,
        max_new,
        stop_ids,
        temperature,
        top_p,
        top_k,
        seed_hi,
        seed_lo,
        *,
        num_steps,
    ):
        """Up to `num_steps` decode steps for every row; rows in `done` are frozen.

        Row b feeds tokens[b] at positions[b] (its counts[b]-th generated token) and
        samples the next one; it is done after a stop id, max_new[b] tokens, or when
        the next position would leave the cache. Returns the cache, the new tokens and
        logprobs [B, num_steps] (-1 / 0 where a row was already done) and the carry.
        """
        self.compile_counts[f"decode(cache={cache.max_len})"] += 1
        model = nnx.merge(self.graphdef, state)
        b = tokens.shape[0]
        # Rotary cos/sin of every position, once per call rather than per element per step.
        rope = model.rope_table(self.max_seq_len)
        out_tokens = jnp.full((b, num_steps), -1, jnp.int32)
        out_logp = jnp.zeros((b, num_steps), jnp.float32)

        def cond(carry):
            i, done = carry[0], carry[5]
            return (i < num_steps) & ~jnp.all(done)

        def body(carry):
            i, cache, tok, pos, count, done, out_t, out_l = carry
            live = ~done
            # Done rows are fed as padding (segment 0): their cache rows are left alone.
            logits, cache = model(
                tok[:, None],
                pos[:, None],
                cache=cache,
                segment_ids=live[:, None].astype(jnp.int32),
                rope_table=rope,
            )
            keys = sampling.row_keys(seed_hi, seed_lo, count)
            new, logp = sampling.sample_tokens(logits[:, 0], keys, temperature, top_p, top_k)
            out_t = out_t.at[:, i].set(jnp.where(live, new, -1))
            out_l = out_l.at[:, i].set(jnp.where(live, logp, 0.0))
            count = count + live
            pos = pos + live
            stopped = jnp.any(new[:, None] == stop_ids, axis=-1)
            done = done | (live & (stopped | (count >= max_new) | (pos >= self.max_seq_len - 1)))
            tok = jnp.where(live, new, tok)
            return i + 1, cache, tok, pos, count, done, out_t, out_l

        carry = (0, cache, tokens, positions, counts, done, out_tokens, out_logp)
        _, cache, tokens, positions, counts, done, out_tokens, out_logp = jax.lax.while_loop(
            cond, body, carry
        )
        return cache, out_tokens, out_logp
