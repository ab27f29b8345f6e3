"""In-process JAX sampler: batched prefill + a jit-compiled decode loop over a KV cache.

The engine owns `max_batch_size` slots, each one row of a KV cache (per layer
[max_batch_size, kv_heads, length, head_dim]). A background thread runs
the schedule:

  1. admit waiting requests into free slots: one prefill call over those rows
     (prompts right-padded to a length bucket, 2^k or 1.5 * 2^k; padding keys are
     not written), which also samples each request's first token, then a copy of
     the new keys/values into the slots;
  2. run `steps_per_call` decode steps for all slots in one jitted
     `lax.while_loop` (it exits early once every row is done);
  3. hand finished rows their Completion and free their slots; repeat.

So requests of different lengths, arriving at different times, share the batch
as slots free (continuous batching).

Prefix caching (`prefix_cache=True`): a finished row is not discarded but
*parked*: its slot keeps the keys/values of its tokens (prompt + generated, all
but the last sampled token, which was never fed) until the slot is needed. A new
request looks for the row, live or parked, or an earlier request of the same
admission, whose written tokens share the longest common prefix L with its
prompt; from L >= `min_cached_prefix` on it reuses min(L, n - 1) tokens (one
token is always computed, so the first sampled token has logits) and prefills
only the rest, at its true positions, attending to the copied prefix. That is
the shape of agent rollouts: turn k+1's prompt is turn k's tokens plus a tool
segment, and the G episodes of a GRPO group (and every task's system prompt)
share their start. Keys/values depend only on the tokens up to their position,
so reuse gives the same tokens and logprobs as a full prefill, up to float
rounding (about 1e-6 here); sampling keys stay a function of seed and token
index.

Where the row goes: the parked row it continues when the new prompt extends
all of that row (nothing is lost), else a free slot, else the least recently
used parked row, preferring rows no request of this admission copies from.
Copying is part of the suffix prefill (`DecodeSteps.prefill_cached`: gather the
source rows, prefill, scatter into the targets), which reads every source
before writing any target. So an admission runs (a) one call for requests
continuing rows already in the cache, (b) the from-scratch prefill, (c) one
call per level of requests continuing requests of this admission (a GRPO
group's first turn: the first copy prefills the prompt, the others one token).
A cached prefix is used only when it covers at least `min_cached_prefix`
tokens and a quarter of the prompt (`min_cached_fraction`): prompts that share
just a head (tasks whose system prompts differ after the first lines) are
prefilled side by side in (b), rather than one level after another or in (a)
beside short continuations, each call padded to its longest suffix, to save a
few tokens each.
Each call is bucketed like prefill (rows, suffix length; the cache's length),
so compiles stay bounded. This is a flat per-slot table, not SGLang's radix
tree: with one row per slot, the longest-prefix search is a numpy comparison
against at most `max_batch_size` rows, and parked rows cost no extra memory.

Parked rows are only valid for the weights that computed them: each row records
the weights generation it was prefilled with, `update_weights` starts a new
generation, and rows of an older one are dropped at the next admission (live
rows finish as they are, as before). `prefix_cache_stats` counts prompt tokens
computed and reused; each Completion reports its `cached_tokens`.

The cache's length is a bucket (2^k or 1.5 * 2^k, see `cache_bucket`) just
above the longest live row (at most `max_seq_len`), grown and shrunk between
calls with one copy each time, and decode attends to all of it. Attending to a
prefix of a longer cache would cost a strided copy of every layer's keys and
values on every step (2.4x slower at 256 of 1024 slots for the demo model on
CPU); a cache that fits its rows needs none.

Shapes are static per bucket (compiled functions in `decode_steps.py`):
prefill compiles once per (rows, prompt length) bucket, decode once per cache
length, and the small copy functions once per bucket pair; `compile_counts`
counts traces so benchmarks can prove it. Prefill rows are padded to at least
`min_prefill_rows` and prompts (or suffixes) to at least `min_prefill_len`
tokens: agent turns admit a few rows with a short tool segment each, in ever
new combinations, and every new shape is a compile (about a second for the demo
model on CPU, far more for large models), while the padding costs little. Over
the demo's first eight GRPO rollout steps (8 tasks x G = 4) these floors (8
rows, 128 tokens, with the quarter rule above; against 1 row, 16 tokens and any
prefix) cut compiles from 36 to 22 and rollout time by 30 %
(`experiments/benchmarks/demo_rollouts.py`).
Sampling settings are arrays, not compile-time constants (see `sampling.py`),
and each row's randomness depends only on its request's seed and token index,
so a seeded request gives the same tokens whatever shares the batch.

Weights: the model is split once into (graphdef, state); `update_weights` swaps
the state (same tree, shapes and shardings, so nothing recompiles) and takes
effect at the next decode call. Sharded parameters work as they are: the jitted
functions follow the state's shardings.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from orchestra_jax.rollout import sampling
from orchestra_jax.rollout.decode_steps import DecodeSteps
from orchestra_jax.rollout.engine import Completion, GenerateRequest

log = logging.getLogger(__name__)


def bucket(n: int, minimum: int, maximum: int) -> int:
    """The smallest power of two >= n (at least `minimum`), capped at `maximum`."""
    size = minimum
    while size < n:
        size *= 2
    return min(size, maximum)


def cache_bucket(n: int, minimum: int, maximum: int) -> int:
    """The smallest 2^k or 3 * 2^(k-1) >= n (at least `minimum`), capped at `maximum`.

    Finer than powers of two (at most a third of the slots idle, not half) for the
    cache, whose length every decode step pays for, and for prompts, whose padded
    length every prefill pays for; still O(log) buckets.
    """
    size = bucket(n, minimum, 1 << 62)
    three_quarters = size // 4 * 3
    return min(three_quarters if minimum <= n <= three_quarters else size, maximum)


@dataclasses.dataclass(eq=False)  # compared by identity
class _Pending:
    request: GenerateRequest
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    submitted: float
    seed: int


@dataclasses.dataclass
class _Slot:
    job: _Pending
    tokens: list[int]
    logprobs: list[float]
    weights: int  # the weights generation that computed this row's cache
    cached_tokens: int = 0

    def written_ids(self) -> np.ndarray:
        """The tokens whose keys/values the row holds: all but the last sampled one."""
        return np.asarray(self.job.request.input_ids + self.tokens[:-1], np.int32)


@dataclasses.dataclass
class _Parked:
    """A finished row kept for its keys/values (slots 0 .. len(ids) - 1)."""

    ids: np.ndarray
    weights: int
    last_used: int


@dataclasses.dataclass(eq=False)
class _Admission:
    """One admitted request's plan: where it goes and which cached prefix it continues."""

    job: _Pending
    ids: np.ndarray
    slot: int = -1
    source: int | None = None  # the cache row whose first `reused` slots it continues
    leader: "_Admission | None" = None  # or: the request of this admission it continues
    match: int = 0  # common prefix with the source's tokens
    reused: int = 0
    level: int = 0  # 0: no leader; else the leader's level + 1


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class JaxEngine:
    """RolloutEngine running a Qwen3 NNX model in this process (see module docstring)."""

    def __init__(
        self,
        model: nnx.Module,
        *,
        max_batch_size: int = 16,
        max_seq_len: int = 2048,
        steps_per_call: int = 16,
        max_stop_tokens: int = 8,
        min_prefill_len: int = 128,
        min_prefill_rows: int = 8,
        min_cache_len: int = 64,
        seed: int = 0,
        cache_dtype=None,
        prefix_cache: bool = True,
        min_cached_prefix: int = 16,
        min_cached_fraction: float = 0.25,
    ):
        if max_batch_size < 1 or max_seq_len < 2 or steps_per_call < 1:
            raise ValueError(
                "max_batch_size >= 1, max_seq_len >= 2 and steps_per_call >= 1 required"
            )
        self.config = model.config
        self.vocab_size = model.config.vocab_size
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.steps_per_call = steps_per_call
        self.max_stop_tokens = max_stop_tokens
        self.min_prefill_len = min(min_prefill_len, max_seq_len)
        self.min_prefill_rows = max(1, min(min_prefill_rows, max_batch_size))
        self.min_cache_len = min(min_cache_len, max_seq_len)
        self.weight_version = 0
        self.prefix_cache = prefix_cache
        # Shorter shared prefixes are prefilled from scratch: too little to save.
        self.min_cached_prefix = max(1, min_cached_prefix)
        self.min_cached_fraction = min_cached_fraction
        self._weights_gen = 0  # bumped by update_weights: parked rows of older ones are stale
        self._parked: dict[int, _Parked] = {}
        self._clock = 0  # for least-recently-used eviction of parked rows
        self.prefix_cache_stats: collections.Counter[str] = collections.Counter()
        self._graphdef, state = nnx.split(model)
        # Committed to its shardings, as update_weights places new weights: jit keys its
        # compiled code on that too, so the first update would otherwise recompile all.
        self._state = jax.tree.map(lambda x: jax.device_put(x, x.sharding), state)
        self._new_cache = lambda length: model.init_cache(max_batch_size, length, cache_dtype)
        self._cache = self._new_cache(self.min_cache_len)
        self._seed_rng = np.random.default_rng(seed)
        self._slots: list[_Slot | None] = [None] * max_batch_size
        self._pending: collections.deque[_Pending] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._steps = DecodeSteps(self._graphdef, max_seq_len=max_seq_len, cache_dtype=cache_dtype)
        self.compile_counts = self._steps.compile_counts

    # -- RolloutEngine ------------------------------------------------------------------------

    def _validate(self, request: GenerateRequest) -> None:
        n = len(request.input_ids)
        if n >= self.max_seq_len:
            raise ValueError(
                f"prompt of {n} tokens does not fit max_seq_len={self.max_seq_len} "
                "(at least one slot must stay free for a new token)"
            )
        bad = [t for t in request.input_ids if t >= self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary ({self.vocab_size})")
        if len(request.sampling.stop_token_ids) > self.max_stop_tokens:
            raise ValueError(
                f"at most {self.max_stop_tokens} stop_token_ids per request "
                f"(got {len(request.sampling.stop_token_ids)}); raise max_stop_tokens"
            )

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        for r in requests:
            self._validate(r)
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        jobs = []
        with self._cond:
            if self._closed:
                raise RuntimeError("JaxEngine is closed")
            for r in requests:
                seed = r.sampling.seed
                if seed is None:
                    seed = int(self._seed_rng.integers(0, 2**63))
                jobs.append(_Pending(r, loop.create_future(), loop, now, seed))
            self._pending.extend(jobs)
            self._ensure_worker()
            self._cond.notify()
        return list(await asyncio.gather(*(j.future for j in jobs)))

    async def update_weights(self, model_state: Any, *, version: int) -> None:
        """Swap in new weights (a model or its nnx.State) without recompiling."""
        state = nnx.state(model_state) if isinstance(model_state, nnx.Module) else model_state
        old_leaves, old_tree = jax.tree.flatten(self._state)
        new_leaves, new_tree = jax.tree.flatten(state)
        if old_tree != new_tree:
            raise ValueError("update_weights: the new state's tree differs from the engine's model")
        for old, new in zip(old_leaves, new_leaves):
            if old.shape != new.shape or old.dtype != new.dtype:
                raise ValueError(
                    f"update_weights: parameter {old.shape}/{old.dtype} got {new.shape}/{new.dtype}"
                )
        # Same shardings as before, so the compiled functions are reused as they are.
        placed = [jax.device_put(new, old.sharding) for old, new in zip(old_leaves, new_leaves)]
        state = jax.tree.unflatten(old_tree, placed)
        with self._cond:
            self._state = state
            self.weight_version = int(version)
            self._weights_gen += 1  # parked rows hold keys/values of the old weights

    async def health(self) -> bool:
        return not self._closed and (self._thread is None or self._thread.is_alive())

    def close(self) -> None:
        """Stop the worker thread; waiting requests are aborted."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=60)

    # -- scheduler (worker thread) ------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, daemon=True, name="jax-engine")
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._pending and not any(self._slots):
                    self._cond.wait()
                if self._closed:
                    self._fail_all(RuntimeError("JaxEngine closed"))
                    return
                # Parked rows count as free: admission evicts them as needed.
                free = sum(s is None for s in self._slots)
                admitted = [self._pending.popleft() for _ in range(min(free, len(self._pending)))]
                state, weights = self._state, self._weights_gen
            try:
                if admitted:
                    self._admit(state, weights, admitted)
                if any(self._slots):
                    self._decode_round(state)
            except Exception as e:  # noqa: BLE001 - fail the requests, keep serving
                log.exception("JaxEngine step failed")
                # Admitted jobs may not have reached a slot yet; settling twice is a no-op.
                self._fail_all(e, waiting_too=False, also=admitted)

    def _sampling_arrays(self, jobs: Sequence[_Pending | None]):
        """Per-row sampling settings as arrays (rows without a job get greedy defaults)."""

        def col(fn, default, dtype):
            return np.array([default if j is None else fn(j) for j in jobs], dtype)

        seeds = [sampling.split_seed(0 if j is None else j.seed) for j in jobs]
        return (
            col(lambda j: j.request.sampling.temperature, 0.0, np.float32),
            col(lambda j: j.request.sampling.top_p, 1.0, np.float32),
            col(lambda j: j.request.sampling.top_k, -1, np.int32),
            np.array([s[0] for s in seeds], np.uint32),
            np.array([s[1] for s in seeds], np.uint32),
        )

    def _admit(self, state, weights: int, jobs: list[_Pending]) -> None:
        """Prefill the admitted requests into slots (reusing cached prefixes, see the
        module docstring) and record their first token."""
        lengths = [len(job.request.input_ids) for job in jobs]
        # The from-scratch prefill writes a whole length bucket into its rows.
        self._fit_cache(
            max(
                [
                    self._longest_live_row(),
                    *lengths,
                    cache_bucket(max(lengths), self.min_prefill_len, self.max_seq_len),
                ]
            )
        )
        plans = self._plan(weights, jobs)
        self._prefill_cached(state, weights, [p for p in plans if p.source is not None])
        self._prefill(state, weights, [p for p in plans if p.source is None and p.leader is None])
        for level in range(1, max(p.level for p in plans) + 1):
            followers = [p for p in plans if p.level == level]
            for p in followers:  # the leader's row now holds its whole prompt
                p.source = p.leader.slot
            self._prefill_cached(state, weights, followers)

    def _plan(self, weights: int, jobs: list[_Pending]) -> list[_Admission]:
        """Each job's cached prefix (source row or leader, tokens reused) and target slot."""
        for slot in [i for i, p in self._parked.items() if p.weights != weights]:
            del self._parked[slot]  # computed with older weights
            self.prefix_cache_stats["parked_invalidated"] += 1
        held: dict[int, np.ndarray] = {}  # cache row -> the tokens it holds
        if self.prefix_cache:
            held = {
                i: s.written_ids()
                for i, s in enumerate(self._slots)
                if s is not None and s.weights == weights
            }
            held.update((i, p.ids) for i, p in self._parked.items())
        plans: list[_Admission] = []
        for job in jobs:
            plan = _Admission(job, np.asarray(job.request.input_ids, np.int32))
            for row, ids in held.items():
                match = common_prefix(ids, plan.ids)
                if match > plan.match:
                    plan.source, plan.match = row, match
            for earlier in plans if self.prefix_cache else ():
                match = common_prefix(earlier.ids, plan.ids)
                if match > plan.match:  # its prefill writes its whole prompt
                    plan.source, plan.leader, plan.match = None, earlier, match
                    plan.level = earlier.level + 1
            plan.reused = min(plan.match, len(plan.ids) - 1)
            if plan.reused < max(self.min_cached_prefix, self.min_cached_fraction * len(plan.ids)):
                plan.source, plan.leader, plan.reused, plan.level = None, None, 0, 0
            plans.append(plan)

        sources = {p.source for p in plans if p.source is not None}
        for row in sources & self._parked.keys():
            self._parked[row].last_used = self._tick()
        taken: set[int] = set()
        for p in plans:  # continue a parked row in place when the prompt extends all of it
            if (
                p.source in self._parked
                and p.source not in taken
                and p.match == len(self._parked[p.source].ids)
            ):
                p.slot = p.source
                taken.add(p.slot)
        free = [
            i
            for i, s in enumerate(self._slots)
            if s is None and i not in self._parked and i not in taken
        ]
        for p in plans:
            if p.slot >= 0:
                continue
            if free:
                p.slot = free.pop(0)
            else:  # evict: least recently used, rows nobody here copies from first
                p.slot = min(
                    (i for i in self._parked if i not in taken),
                    key=lambda i: (i in sources, self._parked[i].last_used),
                )
            taken.add(p.slot)
        # The targets' old rows are overwritten (sources are read before that).
        for row in taken & self._parked.keys():
            del self._parked[row]
        for p in plans:
            self.prefix_cache_stats["requests"] += 1
            self.prefix_cache_stats["prompt_tokens_reused"] += p.reused
            self.prefix_cache_stats["prompt_tokens_computed"] += len(p.ids) - p.reused
            self.prefix_cache_stats["requests_reusing"] += p.reused > 0
        return plans

    def _prefill(self, state, weights: int, plans: list[_Admission]) -> None:
        """Prefill whole prompts into their slots (one call, rows and length bucketed)."""
        if not plans:
            return
        n = len(plans)
        rows_bucket = bucket(n, self.min_prefill_rows, self.max_batch_size)
        t = cache_bucket(max(len(p.ids) for p in plans), self.min_prefill_len, self.max_seq_len)
        # Padding rows point past the batch, so inserting them writes nothing.
        rows = np.full(rows_bucket, self.max_batch_size, np.int32)
        rows[:n] = [p.slot for p in plans]
        ids = np.zeros((rows_bucket, t), np.int32)
        lengths = np.zeros(rows_bucket, np.int32)  # 0: a padding row, nothing written
        for r, p in enumerate(plans):
            ids[r, : len(p.ids)] = p.ids
            lengths[r] = len(p.ids)
        prefilled, tokens, logp = self._steps.prefill(
            state, ids, lengths, *self._sampling_arrays(self._jobs(plans, rows_bucket))
        )
        self._cache = self._steps.insert(self._cache, rows, prefilled)
        self._start(weights, plans, tokens, logp)

    def _prefill_cached(self, state, weights: int, plans: list[_Admission]) -> None:
        """Prefill prompt suffixes after their cached prefixes (one call, bucketed)."""
        if not plans:
            return
        n = len(plans)
        rows_bucket = bucket(n, self.min_prefill_rows, self.max_batch_size)
        t = cache_bucket(
            max(len(p.ids) - p.reused for p in plans), self.min_prefill_len, self.max_seq_len
        )
        sources = np.zeros(rows_bucket, np.int32)
        targets = np.full(rows_bucket, self.max_batch_size, np.int32)  # padding: dropped
        starts = np.zeros(rows_bucket, np.int32)
        ids = np.zeros((rows_bucket, t), np.int32)
        lengths = np.zeros(rows_bucket, np.int32)
        for r, p in enumerate(plans):
            sources[r], targets[r], starts[r] = p.source, p.slot, p.reused
            ids[r, : len(p.ids) - p.reused] = p.ids[p.reused :]
            lengths[r] = len(p.ids) - p.reused
        self._cache, tokens, logp = self._steps.prefill_cached(
            state,
            self._cache,
            sources,
            targets,
            starts,
            ids,
            lengths,
            *self._sampling_arrays(self._jobs(plans, rows_bucket)),
        )
        self._start(weights, plans, tokens, logp)

    @staticmethod
    def _jobs(plans: list[_Admission], rows: int) -> list[_Pending | None]:
        return [p.job for p in plans] + [None] * (rows - len(plans))

    def _start(self, weights: int, plans: list[_Admission], tokens, logp) -> None:
        """Give the prefilled requests their slots and first tokens."""
        tokens, logp = jax.device_get((tokens, logp))
        for r, p in enumerate(plans):
            self._slots[p.slot] = _Slot(
                p.job, [int(tokens[r])], [float(logp[r])], weights, p.reused
            )
            self._finish_if_done(p.slot)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _decode_round(self, state) -> None:
        b = self.max_batch_size
        # Positions fed this call reach longest + steps_per_call - 1.
        self._fit_cache(self._longest_live_row() + self.steps_per_call - 1)
        tokens = np.zeros(b, np.int32)
        positions = np.zeros(b, np.int32)
        counts = np.zeros(b, np.int32)
        done = np.ones(b, bool)
        max_new = np.ones(b, np.int32)
        stop_ids = np.full((b, self.max_stop_tokens), -1, np.int32)
        for i, s in enumerate(self._slots):
            if s is None:
                continue
            sp = s.job.request.sampling
            tokens[i] = s.tokens[-1]
            positions[i] = len(s.job.request.input_ids) + len(s.tokens) - 1
            counts[i] = len(s.tokens)
            done[i] = False
            max_new[i] = sp.max_new_tokens
            stop_ids[i, : len(sp.stop_token_ids)] = sp.stop_token_ids
        jobs = [None if s is None else s.job for s in self._slots]
        self._cache, out_tokens, out_logp = self._steps.decode(
            state,
            self._cache,
            tokens,
            positions,
            counts,
            done,
            max_new,
            stop_ids,
            *self._sampling_arrays(jobs),
            num_steps=self.steps_per_call,
        )
        out_tokens, out_logp = jax.device_get((out_tokens, out_logp))
        for i, s in enumerate(self._slots):
            if s is None:
                continue
            valid = out_tokens[i] >= 0
            s.tokens.extend(int(t) for t in out_tokens[i][valid])
            s.logprobs.extend(float(x) for x in out_logp[i][valid])
            self._finish_if_done(i)

    def _longest_live_row(self) -> int:
        """Tokens (prompt + generated) in the longest live row; 0 when none."""
        return max(
            (len(s.job.request.input_ids) + len(s.tokens) for s in self._slots if s is not None),
            default=0,
        )

    def _fit_cache(self, needed: int) -> None:
        """Grow the cache to the bucket holding `needed` slots; shrink it once that is
        at most half the current length (hysteresis, so rows coming and going do not
        resize it back and forth)."""
        target = cache_bucket(needed, self.min_cache_len, self.max_seq_len)
        current = self._cache.max_len
        if target > current or 2 * target <= current:
            self._cache = self._steps.resize(self._cache, length=target)
            for p in self._parked.values():  # a shrink cuts parked rows too
                p.ids = p.ids[:target]

    def _finish_if_done(self, slot: int) -> None:
        """Complete the slot's request if it hit a stop id, its budget, or the cache end."""
        s = self._slots[slot]
        sp = s.job.request.sampling
        prompt = len(s.job.request.input_ids)
        if s.tokens[-1] in sp.stop_token_ids:
            reason = "stop"
        elif len(s.tokens) >= sp.max_new_tokens or prompt + len(s.tokens) >= self.max_seq_len:
            reason = "length"
        else:
            return
        self._slots[slot] = None
        if self.prefix_cache:
            self._parked[slot] = _Parked(s.written_ids(), s.weights, self._tick())
        completion = Completion(
            s.tokens,
            s.logprobs,
            reason,
            prompt,
            len(s.tokens),
            time.perf_counter() - s.job.submitted,
            s.cached_tokens,
        )
        _resolve(s.job, completion)

    def _fail_all(
        self, error: BaseException, *, waiting_too: bool = True, also: Sequence[_Pending] = ()
    ) -> None:
        """Fail the admitted requests (and the waiting ones) with `error`.

        After an engine error the cache may have been donated to the failed call,
        so it is rebuilt empty (parked rows go with it); the waiting requests then
        start afresh.
        """
        with self._cond:  # re-entrant: also called with the lock held
            jobs = [s.job for s in self._slots if s is not None]
            jobs += [job for job in also if job not in jobs]
            if waiting_too:
                jobs += list(self._pending)
                self._pending.clear()
            self._slots = [None] * self.max_batch_size
            self._parked = {}
            self._cache = self._new_cache(self.min_cache_len)
        for job in jobs:
            _resolve(job, error)


def _resolve(job: _Pending, outcome: Completion | BaseException) -> None:
    def settle():
        if job.future.done():  # the caller gave up (cancelled)
            return
        if isinstance(outcome, BaseException):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's event loop is closed: nobody is waiting any more
        pass
