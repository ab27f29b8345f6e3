"""The compiled pieces of JaxEngine: prefill, decode loop, and cache copies.

Pure functions of (model state, cache, per-row arrays), jitted once per shape
bucket. Every trace bumps `compile_counts[<name and shapes>]`, which is how
benchmarks and tests check that compiles stay bounded. The cache is the model's
KVCache (one array per layer; see `qwen3_cache`); see `rollout/jax/engine.py` for
how the scheduler sizes it and feeds these functions.

Two static options add outputs only when a request asks for them, so the common
call compiles as before: `top_logprobs=k` also returns the k most likely tokens
and their logprobs at every sampled position, and `penalties` (decode only)
carries each row's generated-token counts [B, V] and applies
`sampling.apply_penalties` before sampling. `prompt_logprobs` scores prompts
(every position's next-token logprob) for requests that ask for them.

`decode` with `constraint` (a table of token automata and each row's state)
samples each row among the tokens its state allows (`sampling.sample_tokens`'s
`allowed`) and moves the state with the token drawn.

`decode` with `rows` (int32 [R]) decodes only those cache rows, in a compiled
batch of R rows: gathered from the cache, decoded, scattered back in the same
call (the engine's row buckets); it compiles once per (cache length, R).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
from flax import nnx

from orchestra_jax.rollout.jax import sampling


class DecodeSteps:
    """Jitted prefill (from scratch or on a cached prefix) / insert / resize / decode
    for one model graph."""

    def __init__(self, graphdef, *, max_seq_len: int, cache_dtype=None):
        self.graphdef = graphdef
        self.max_seq_len = max_seq_len
        self.cache_dtype = cache_dtype
        self.compile_counts: collections.Counter[str] = collections.Counter()
        self.prefill = jax.jit(self._prefill_fn, static_argnames=("top_logprobs",))
        self.prefill_cached = jax.jit(
            self._prefill_cached_fn, static_argnames=("top_logprobs",), donate_argnums=(1,)
        )
        self.insert = jax.jit(self._insert_fn, donate_argnums=(0,))
        self.resize = jax.jit(self._resize_fn, static_argnames=("length",))
        self.decode = jax.jit(
            self._decode_fn,
            static_argnames=("num_steps", "top_logprobs"),
            donate_argnums=(1, 14),
        )
        self.prompt_logprobs = jax.jit(self._prompt_logprobs_fn, static_argnames=("top_logprobs",))

    @staticmethod
    def _suffix(top_logprobs: int, penalties=None) -> str:
        """The compile-count name's tail for the static options in use."""
        tail = f", top_logprobs={top_logprobs}" if top_logprobs else ""
        return tail + (", penalties" if penalties is not None else "")

    @staticmethod
    def _first_tokens(model, hidden, lengths, temperature, top_p, top_k, min_p, keys, top_n):
        """Sample each row's token after its last position; top-n logprobs there if asked."""
        last_index = jnp.maximum(lengths - 1, 0)[:, None, None]
        # Only each prompt's last position needs logits: the LM head runs on R rows, not R*T.
        last = model.logits(jnp.take_along_axis(hidden, last_index, axis=1))[:, 0]
        tokens, logp = sampling.sample_tokens(last, keys, temperature, top_p, top_k, min_p)
        top = sampling.top_logprobs(last, temperature, top_n) if top_n else None
        return tokens, logp, top

    def _prefill_fn(
        self,
        state,
        ids,
        lengths,
        temperature,
        top_p,
        top_k,
        min_p,
        seed_hi,
        seed_lo,
        *,
        top_logprobs=0,
    ):
        """KV cache (R rows, T slots) of prompts ids [R, T]; first tokens (and their
        top logprobs, None unless `top_logprobs`)."""
        self.compile_counts[
            f"prefill(rows={ids.shape[0]}, len={ids.shape[1]}{self._suffix(top_logprobs)})"
        ] += 1  # at trace
        model = nnx.merge(self.graphdef, state)
        r, t = ids.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), ids.shape)
        segments = (positions < lengths[:, None]).astype(jnp.int32)
        cache = model.init_cache(r, t, self.cache_dtype)
        hidden, cache = model.hidden_states(ids, positions, segment_ids=segments, cache=cache)
        keys = sampling.row_keys(seed_hi, seed_lo, jnp.zeros_like(lengths))
        tokens, logp, top = self._first_tokens(
            model, hidden, lengths, temperature, top_p, top_k, min_p, keys, top_logprobs
        )
        return cache, tokens, logp, top

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
        min_p,
        seed_hi,
        seed_lo,
        *,
        top_logprobs=0,
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
            f"prefill_cached(rows={ids.shape[0]}, len={ids.shape[1]}, cache={cache.max_len}"
            f"{self._suffix(top_logprobs)})"
        ] += 1
        model = nnx.merge(self.graphdef, state)
        offsets = jnp.arange(ids.shape[1], dtype=jnp.int32)[None]
        positions = starts[:, None] + offsets
        segments = (offsets < lengths[:, None]).astype(jnp.int32)
        hidden, rows = model.hidden_states(
            ids, positions, segment_ids=segments, cache=cache.take_rows(sources)
        )
        keys = sampling.row_keys(seed_hi, seed_lo, jnp.zeros_like(lengths))
        tokens, logp, top = self._first_tokens(
            model, hidden, lengths, temperature, top_p, top_k, min_p, keys, top_logprobs
        )
        return cache.put_rows(targets, rows), tokens, logp, top

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
        min_p,
        seed_hi,
        seed_lo,
        penalties=None,
        stop_on_finish=False,
        rows=None,
        constraint=None,
        *,
        num_steps,
        top_logprobs=0,
    ):
        """Up to `num_steps` decode steps for every row; rows in `done` are frozen.

        With `rows` (int32 [R], R < the cache's batch) the call decodes only those
        cache rows, a row bucket: the per-row arrays have R entries, row r being
        cache row rows[r]; the call gathers those rows' keys/values (and token
        counts) into an R-row cache, runs the loop on it and scatters them back.
        An entry >= the batch is a padding row: give it `done`; it reads some
        row's values and writes nothing back. Each row computes what it would in
        the full batch (sampling keys are per request), so only the cost changes.

        With `stop_on_finish` (a traced bool: no recompile) the call also ends after
        the step in which a row not in `done` finishes, so a waiting request can
        take its slot before the chunk's other steps (the engine asks for this when
        requests wait).

        Row b feeds tokens[b] at positions[b] (its counts[b]-th generated token) and
        samples the next one; it is done after a stop id, max_new[b] tokens, or when
        the next position would leave the cache. Returns the cache, the new tokens and
        logprobs [B, num_steps] (-1 / 0 where a row was already done), their top
        logprobs ([B, num_steps, k] values and ids, or None) and the penalties with
        updated token counts (or None). `penalties`: None or (token_counts [B, V],
        repetition [B], frequency [B], presence [B]), see `sampling.apply_penalties`.
        `constraint`: None or (next_state int32 [S, V], state int32 [B]): row b may
        sample only tokens v with next_state[state_b, v] >= 0 and moves to that
        state (`rollout/token_constraint.py`; the engine's table of every live
        request's automaton, state 0 allowing everything).
        """
        name_rows = "" if rows is None else f", rows={rows.shape[0]}"
        name_constraint = "" if constraint is None else f", constraint={constraint[0].shape[0]}"
        self.compile_counts[
            f"decode(cache={cache.max_len}{name_rows}{self._suffix(top_logprobs, penalties)}"
            f"{name_constraint})"
        ] += 1
        model = nnx.merge(self.graphdef, state)
        full_cache = full_counts = None
        if rows is not None:
            # Padding entries (>= batch) read the last row and are dropped on the way back.
            read = jnp.minimum(rows, cache.batch_size - 1)
            full_cache, cache = cache, cache.take_rows(read)
            if penalties is not None:
                full_counts = penalties[0]
                penalties = (full_counts[read], *penalties[1:])
        b = tokens.shape[0]
        # Rotary cos/sin of every position, once per call rather than per element per step.
        rope = model.rope_table(self.max_seq_len)
        out_tokens = jnp.full((b, num_steps), -1, jnp.int32)
        out_logp = jnp.zeros((b, num_steps), jnp.float32)
        k = max(top_logprobs, 1)  # a [B, S, 1] dummy when no top logprobs are asked for
        out_top = (
            jnp.zeros((b, num_steps, k), jnp.float32),
            jnp.zeros((b, num_steps, k), jnp.int32),
        )
        token_counts = None if penalties is None else penalties[0]
        table, states = (None, None) if constraint is None else constraint

        entry_done = done

        def cond(carry):
            i, done = carry[0], carry[5]
            finished = stop_on_finish & jnp.any(done & ~entry_done)
            return (i < num_steps) & ~jnp.all(done) & ~finished

        def body(carry):
            i, cache, tok, pos, count, done, out_t, out_l, out_top, token_counts, states = carry
            live = ~done
            # Done rows are fed as padding (segment 0): their cache rows are left alone.
            logits, cache = model(
                tok[:, None],
                pos[:, None],
                cache=cache,
                segment_ids=live[:, None].astype(jnp.int32),
                rope_table=rope,
            )
            logits = logits[:, 0]
            if penalties is not None:
                logits = sampling.apply_penalties(logits, token_counts, *penalties[1:])
            keys = sampling.row_keys(seed_hi, seed_lo, count)
            allowed = None if table is None else table[states] >= 0
            new, logp = sampling.sample_tokens(
                logits, keys, temperature, top_p, top_k, min_p, allowed=allowed
            )
            if table is not None:
                moved = table[states, new]
                states = jnp.where(live & (moved >= 0), moved, states)
            out_t = out_t.at[:, i].set(jnp.where(live, new, -1))
            out_l = out_l.at[:, i].set(jnp.where(live, logp, 0.0))
            if top_logprobs:
                values, ids = sampling.top_logprobs(logits, temperature, top_logprobs)
                out_top = (out_top[0].at[:, i].set(values), out_top[1].at[:, i].set(ids))
            if penalties is not None:
                token_counts = sampling.count_tokens(token_counts, new, live)
            count = count + live
            pos = pos + live
            stopped = jnp.any(new[:, None] == stop_ids, axis=-1)
            done = done | (live & (stopped | (count >= max_new) | (pos >= self.max_seq_len - 1)))
            tok = jnp.where(live, new, tok)
            return i + 1, cache, tok, pos, count, done, out_t, out_l, out_top, token_counts, states

        carry = (0, cache, tokens, positions, counts, done, out_tokens, out_logp, out_top)
        carry = jax.lax.while_loop(cond, body, carry + (token_counts, states))
        cache, out_tokens, out_logp, out_top, token_counts, _ = (carry[1], *carry[6:])
        if rows is not None:
            assert full_cache is not None
            cache = full_cache.put_rows(rows, cache)
            if full_counts is not None:
                token_counts = full_counts.at[rows].set(token_counts, mode="drop")
        if penalties is not None:
            penalties = (token_counts, *penalties[1:])
        return cache, out_tokens, out_logp, out_top if top_logprobs else None, penalties

    def _prompt_logprobs_fn(self, state, ids, lengths, temperature, *, top_logprobs=0):
        """Next-token logprobs of prompts ids [R, T] (lengths [R]) under the model.

        Returns logp [R, T] where logp[r, t] = log_softmax(logits_{t-1} / T_r)[ids[r, t]]
        for 1 <= t < lengths[r] (0 elsewhere; position 0 has no logits before it),
        and the top logprobs at each position t >= 1 ([R, T, k] values and ids, from
        the logits of position t - 1), or None. The LM head runs one position at a
        time over the rows, so no [R, T, V] array is ever held.
        """
        self.compile_counts[
            f"prompt_logprobs(rows={ids.shape[0]}, len={ids.shape[1]}{self._suffix(top_logprobs)})"
        ] += 1
        model = nnx.merge(self.graphdef, state)
        r, t = ids.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), ids.shape)
        segments = (positions < lengths[:, None]).astype(jnp.int32)
        hidden = model.hidden_states(ids, positions, segment_ids=segments)
        scale = jnp.where(temperature <= 0.0, 1.0, temperature)[:, None]
        k = max(top_logprobs, 1)

        def score(carry, step):
            h, target = step  # [R, H] at position p, the token at p + 1 [R]
            logp = jax.nn.log_softmax(model.logits(h).astype(jnp.float32) / scale, axis=-1)
            chosen = jnp.take_along_axis(logp, target[:, None], axis=-1)[:, 0]
            values, top_ids = jax.lax.top_k(logp, k)
            return carry, (chosen, values, top_ids.astype(jnp.int32))

        targets = jnp.concatenate([ids[:, 1:], jnp.zeros((r, 1), ids.dtype)], axis=1)
        _, (chosen, values, top_ids) = jax.lax.scan(
            score, None, (jnp.swapaxes(hidden, 0, 1), jnp.swapaxes(targets, 0, 1))
        )
        # Scores of position p belong to token p + 1: shift right by one.
        shift = lambda x: jnp.concatenate([jnp.zeros_like(x[:1]), x[:-1]], axis=0)  # noqa: E731
        valid = (jnp.arange(t)[:, None] >= 1) & (jnp.arange(t)[:, None] < lengths[None, :])
        logp = jnp.swapaxes(jnp.where(valid, shift(chosen), 0.0), 0, 1)
        if not top_logprobs:
            return logp, None
        values = jnp.swapaxes(shift(values), 0, 1)
        top_ids = jnp.swapaxes(shift(top_ids), 0, 1)
        return logp, (values, top_ids)
