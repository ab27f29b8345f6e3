"""In-process JAX sampler: batched prefill + a jit-compiled decode loop over a KV cache.

The engine owns `max_batch_size` slots, each one row of a KV cache (per layer
[max_batch_size, kv_heads, length, head_dim]). A background thread runs the
schedule:

  1. admit waiting requests into free slots: prefill calls over those rows
     (prompts right-padded to a length bucket, 2^k or 1.5 * 2^k; padding keys are
     not written), which also sample each request's first token;
  2. run `steps_per_call` decode steps for all slots in one jitted
     `lax.while_loop` (it exits early once every row is done, or, while
     requests wait for a slot, once any row finishes: `admit_mid_chunk`);
     while the live rows fit a smaller row bucket (`decode_row_buckets`), the
     call decodes only them, at that bucket's size (below);
  3. hand finished rows their Completion and free their slots; repeat.

So requests of different lengths, arriving at different times, share the batch
as slots free (continuous batching). Waiting requests are admitted round robin
over the `generate` calls that submitted them (`request_queue.FairQueue`), so a
caller with a huge batch does not hold back the others.

Prefix caching (`prefix_cache=True`): a finished row is not discarded but
*parked*: its slot keeps the keys/values of its tokens (prompt + generated, all
but the last sampled token, which was never fed) until the slot is needed. A new
request reuses the longest common prefix with a live or parked row, or with an
earlier request of the same admission, and prefills only the rest at its true
positions; `prefix_cache.PrefixCachePlanner` makes that plan (and its rules:
minimum prefix, target slots, eviction). Keys/values depend only on the tokens up
to their position, so reuse gives the same tokens and logprobs as a full prefill,
up to float rounding; sampling keys stay a function of seed and token index.
Copying is part of the suffix prefill (`DecodeSteps.prefill_cached`: gather the
source rows, prefill, scatter into the targets), which reads every source before
writing any target. An admission runs (a) one call for requests continuing rows
already in the cache, (b) the from-scratch prefill, (c) one call per level of
requests continuing requests of this admission. `prefix_cache_stats` counts
prompt tokens computed and reused; each Completion reports its `cached_tokens`.

The cache's length is a bucket (2^k or 1.5 * 2^k, see `cache_bucket`) just above
the longest live row (at most `max_seq_len`), grown and shrunk between calls with
one copy each time, and decode attends to all of it: attending to a prefix of a
longer cache would cost a strided copy of every layer's keys and values on every
step, a cache that fits its rows needs none.

Row buckets: a decode step's cost grows with its rows (at Qwen3-0.6B's
dimensions on a 2-core CPU, float32: about 200 ms at 16 rows, 140 at 8, 130 at 4,
95 at 2, 70 at 1; `docs/notes/2026-11-28-decode-row-buckets.md`), and once the
queue is empty the last requests decode with few rows live. So a decode call whose live rows fit one of
`decode_row_buckets` (row counts below `max_batch_size`; 8, 4, 2, 1 by default)
runs in the smallest such bucket: the call gathers those rows' keys/values
(and penalty counts) into a cache of that many rows, decodes, and scatters them
back (`DecodeSteps.decode`'s `rows`); positions, sampling settings, seeds and
stop ids are packed per call as always. Nothing persists between calls, so
parked rows, prefix-cache hits, admissions and cancellations see the same slots
as before; each row computes what it would in a full-size call, and its
sampling key depends only on its request's seed and token index, so the tokens
are the same (tested against `decode_row_buckets=()` token for token). Live
rows shrink into a bucket only when fewer are live than slots, which, since
admission fills every free slot first, is once the queue is empty.

Shapes are static per bucket (compiled functions in `rollout/jax/decode_steps.py`): prefill
compiles once per (rows, prompt length) bucket, decode once per (cache length, row
bucket) (at most 1 + len(decode_row_buckets) programs per cache length and static
options), the small copy functions once per bucket pair; `compile_counts` counts
traces.
Prefill rows are padded to at least `min_prefill_rows` and prompts (or suffixes)
to at least `min_prefill_len` tokens: agent turns admit a few rows with a short
tool segment each, in ever new combinations, and every new shape is a compile
while the padding costs little. The row floor holds only while the padded call
stays within `prefill_pad_tokens` tokens (rows × length; by default what the
model computes in PREFILL_PAD_FLOPS): for a large model a padded row is not
cheap, and a refill of one to four rows is prefilled as a power of two >= its
rows (`prefill_rows`). Sampling settings are arrays, not compile-time
constants (see `sampling.py`), and each row's randomness depends only on its
request's seed and token index, so a seeded request gives the same tokens
whatever shares the batch. Top logprobs and repetition/frequency/presence
penalties are static options of the compiled calls, used only by batches that
have a request asking for them.

Token constraints (`GenerateRequest.constraint`, `rollout/token_constraint.py`):
a constrained request samples each token among those its automaton allows in
its current state (`sampling.sample_tokens(allowed=)`), its logprobs those of the
unrestricted distribution. The engine keeps one table of the live requests'
automata (state 0: unconstrained; the table's rows padded to a power of two, so
a new automaton seldom recompiles), packs each row's state per decode call as it
packs sampling settings, and folds a request's tokens through its automaton on
the host between calls, so prefix hits, row buckets, retries and swaps need
nothing more. A decode call with no constrained request compiles and runs as
before. The first token, sampled at prefill, is never restricted: an
automaton's start state allows every token.

Isolation: `generate` checks every request against the model (vocabulary,
context, stop ids, top logprobs) before it queues anything, and the values it
packs into int32 arrays are clamped to what they can mean (a budget beyond the
context, a top-k beyond the vocabulary, stop ids no token can have). If a
compiled call still fails, only the requests in that call are affected: alone
in it, a request gets the error; with others, each is retried alone (a
*suspect* runs with no other row) so the one that fails is the one that gets the
error. Rows not in the failed call continue: the cache is rebuilt from their
tokens (prompt + generated so far), and their sampling continues at the same
token index. A cancelled `generate` (a client that went away) frees its rows at
the next step.

Weights: the model is split once into (graphdef, state); `update_weights` swaps
the state (same tree, shapes and shardings, so nothing recompiles). A model
with LoRA adapters (`models/lora.py`) samples with base + adapters, the
adapters applied in every projection (s · x · A · B beside x · W, no merged
copy of the base); `update_adapter` swaps in a PEFT adapter folder. The swap is
a barrier: admission pauses, requests in flight finish on the old weights (or,
with `abort_in_flight`, end at once with finish reason "abort" and the tokens
they have), then the state changes, parked rows are dropped and admission
resumes. Every Completion carries the `weight_version` that produced all of its
tokens. With `partial=True` the swap is not a barrier: it lands between decode
chunks, requests in flight continue on the new weights (their keys/values so far
stay those of the old ones) and their Completion records both versions
(`first_weight_version`, `weight_version`), as AReaL's and verl's partial
rollouts do. Sharded parameters work as they are: the jitted functions follow the
state's shardings.

Latency: a Completion's `latency_s` is the wall time from submission to
completion less the seconds the scheduler spent compiling meanwhile
(`rollout/jax/compile_clock.py`), so a shape's first call, which compiles, does not count as
serving time: the same policy played first or second measures the same latency.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchestra_jax.rollout.engine import Completion, GenerateRequest
from orchestra_jax.rollout.jax import compile_clock, sampling
from orchestra_jax.rollout.jax.decode_steps import DecodeSteps
from orchestra_jax.rollout.jax.prefix_cache import Admission, PrefixCachePlanner, common_prefix
from orchestra_jax.rollout.jax.request_queue import FairQueue
from orchestra_jax.rollout.jax.stop_strings import first_stop

if TYPE_CHECKING:
    from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM

log = logging.getLogger(__name__)

__all__ = [
    "JaxEngine",
    "JaxEngineConfig",
    "bucket",
    "cache_bucket",
    "common_prefix",
    "prefill_pad_tokens",
    "prefill_rows",
]


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


# The compute one padded prefill call may spend on rows it does not need (see
# `prefill_pad_tokens`): a tenth of a second or so of a 2-core CPU's matmuls.
PREFILL_PAD_FLOPS = 16e9


def prefill_pad_tokens(config) -> int:
    """Padded prefill tokens (rows × length) under which the row floor applies, for
    a model of `config`'s shape: PREFILL_PAD_FLOPS over the layers' matmul FLOPs per
    token (2 × their weights; attention's and the head's left out)."""
    e, f = config.hidden_size, config.intermediate_size
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    per_layer = e * (q + 2 * kv) + q * e + 3 * e * f
    return int(PREFILL_PAD_FLOPS // (2 * per_layer * config.num_hidden_layers))


def prefill_rows(n: int, length: int, min_rows: int, max_rows: int, pad_tokens: int) -> int:
    """Rows of one prefill call of `n` prompts padded to `length` tokens.

    `bucket(n, min_rows, max_rows)` (few shapes, few compiles) while those rows ×
    `length` stay within `pad_tokens`; past it, the power of two >= n, doubled
    toward that bucket only while rows × length stays within `pad_tokens`. So a
    model for which a padded row is cheap keeps the row floor, and a large one
    prefills a refill of one to four rows as one to four rows, not eight; rows are
    still powers of two (or the floor's bucket), a small fixed set of shapes.
    """
    floor = bucket(n, min_rows, max_rows)
    if floor * length <= pad_tokens:
        return floor
    rows = bucket(n, 1, max_rows)
    while rows * 2 <= floor and rows * 2 * length <= pad_tokens:
        rows *= 2
    return rows


@dataclasses.dataclass(frozen=True)
class JaxEngineConfig:
    """How a JaxEngine batches, caches and bounds requests."""

    max_batch_size: int = 16  # slots: rows decoded together
    max_seq_len: int = 2048  # KV-cache slots per row: prompt + generated tokens
    steps_per_call: int = 16  # decode steps per jitted call (host round trips per token)
    # End a decode call at the step in which a row finishes while requests wait, so
    # the next admission refills that slot (else at the end of the call).
    admit_mid_chunk: bool = True
    # Row counts below max_batch_size that a decode call may have: while the live rows
    # fit one, the call decodes them alone in the smallest such bucket (`DecodeSteps.
    # decode`'s `rows`), at that many rows' cost; () decodes every call at full size.
    decode_row_buckets: tuple[int, ...] = (8, 4, 2, 1)
    min_prefill_len: int = 128  # prefill calls pad prompts to at least this many tokens
    min_prefill_rows: int = 8  # ... and to at least this many rows (fewer shapes, compiles)
    # ... but rows past those needed only while rows × padded length stays within this
    # many tokens; None: `prefill_pad_tokens` of the model (see `prefill_rows`).
    prefill_pad_tokens: int | None = None
    min_cache_len: int = 64  # the cache never shrinks below this many slots
    max_top_logprobs: int = 20  # most top logprobs a request may ask for per position
    max_stop_token_ids: int = 1024  # most distinct in-vocabulary stop ids per request
    prefix_cache: bool = True  # reuse finished rows' keys/values for shared prompt prefixes
    min_cached_prefix: int = 16  # a shorter shared prefix is prefilled from scratch
    min_cached_fraction: float = 0.25  # ... as is one covering less of the prompt than this
    seed: int = 0  # draws the seeds of requests that bring none
    # KV-cache dtype name; None: the model's compute dtype, but float32 on CPU, where
    # XLA's bf16 scatters and small batched matmuls are slower than float32 ones.
    cache_dtype: str | None = None

    def __post_init__(self):
        if self.max_batch_size < 1 or self.max_seq_len < 2 or self.steps_per_call < 1:
            raise ValueError(
                "max_batch_size >= 1, max_seq_len >= 2 and steps_per_call >= 1 required, got "
                f"{self.max_batch_size}, {self.max_seq_len}, {self.steps_per_call}"
            )
        if any(r < 1 for r in self.decode_row_buckets):
            raise ValueError(f"decode_row_buckets must be >= 1, got {self.decode_row_buckets}")
        if self.max_top_logprobs < 1 or self.max_stop_token_ids < 1:
            raise ValueError("max_top_logprobs and max_stop_token_ids must be >= 1")
        if not 0.0 <= self.min_cached_fraction <= 1.0:
            raise ValueError(
                f"min_cached_fraction must be in [0, 1], got {self.min_cached_fraction}"
            )


def default_cache_dtype(compute_dtype, name: str | None = None):
    """The KV cache's dtype: `name` if given, else the compute dtype, but float32 on CPU.

    On CPU a bf16 cache made the demo model's decode step slower than a float32 one
    (bf16 batched matmuls of one query row and bf16 scatters are slow there); on
    accelerators the cache keeps the compute dtype, which halves its memory.
    """
    if name is not None:
        return jnp.dtype(name)
    if jax.default_backend() == "cpu":
        return jnp.dtype(jnp.float32)
    return jnp.dtype(compute_dtype)


@dataclasses.dataclass(eq=False)  # compared by identity
class _Job:
    """One request from submission to its Completion, and its progress so far."""

    request: GenerateRequest
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    submitted: float
    seed: int
    stop_ids: tuple[int, ...]  # in-vocabulary stop ids, distinct
    on_progress: Callable[[Completion], None] | None = None
    cancelled: bool = False
    finished: bool = False
    suspect: bool = False  # was in a failed call with others: runs alone until cleared
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None
    prompt_scores: tuple[list, list | None] | None = None
    weight_version: int | None = None  # fixed when first admitted; moved by partial swaps
    first_weight_version: int | None = None  # set when a partial swap lands mid-request
    cached_tokens: int = 0
    checked: int = 0  # tokens already checked for stop strings
    # The request's constraint's state after its first `constraint_seen` tokens.
    constraint_state: int = 0
    constraint_seen: int = 0
    compile_s_at_submit: float = 0.0  # the engine's compile seconds when submitted

    @property
    def prompt(self) -> list[int]:
        return self.request.input_ids

    def written_ids(self) -> np.ndarray:
        """The tokens whose keys/values its row holds: all but the last sampled one."""
        return np.asarray(self.prompt + self.tokens[:-1], np.int32)


@dataclasses.dataclass(eq=False)
class _Swap:
    """A pending weight update (the worker applies it once no row is live)."""

    state: Any
    version: int
    abort: bool
    partial: bool
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class _CallFailed(Exception):
    """A compiled call failed; `jobs` were in it."""

    def __init__(self, error: BaseException, jobs: list[_Job]):
        super().__init__(str(error))
        self.error, self.jobs = error, jobs


def make_jax_engine(
    model: Qwen3ForCausalLM,
    *,
    max_batch_size: int = JaxEngineConfig.max_batch_size,
    max_seq_len: int = JaxEngineConfig.max_seq_len,
    prefix_cache: bool = JaxEngineConfig.prefix_cache,
    tokenizer=None,
    **config,
) -> JaxEngine:
    """A JaxEngine from keyword settings (the `make_engine("jax", ...)` entry); the
    settings an experiment config gives are named, so `build_engine` passes them."""
    return JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            prefix_cache=prefix_cache,
            **config,
        ),
        tokenizer=tokenizer,
    )


class JaxEngine:
    """RolloutEngine running a Qwen3 NNX model in this process (see module docstring).

    `tokenizer` (anything with `decode(ids) -> str`) is needed only for requests
    with stop strings.
    """

    def __init__(
        self, model: Qwen3ForCausalLM, config: JaxEngineConfig | None = None, *, tokenizer=None
    ):
        self.config = config = config or JaxEngineConfig()
        self.model_config = model.config
        self.vocab_size = model.config.vocab_size
        self.max_batch_size = config.max_batch_size
        self.max_seq_len = config.max_seq_len
        self.tokenizer = tokenizer
        self._min_prefill_len = min(config.min_prefill_len, config.max_seq_len)
        self._min_prefill_rows = max(1, min(config.min_prefill_rows, config.max_batch_size))
        self._prefill_pad_tokens = (
            prefill_pad_tokens(model.config)
            if config.prefill_pad_tokens is None
            else config.prefill_pad_tokens
        )
        self._min_cache_len = min(config.min_cache_len, config.max_seq_len)
        self._row_buckets = sorted(
            {r for r in config.decode_row_buckets if r < self.max_batch_size}
        )
        self.weight_version = 0
        self.planner = PrefixCachePlanner(
            config.max_batch_size,
            enabled=config.prefix_cache,
            min_cached_prefix=config.min_cached_prefix,
            min_cached_fraction=config.min_cached_fraction,
        )
        self.prefix_cache_stats = self.planner.stats
        cache_dtype = default_cache_dtype(model.config.dtype, config.cache_dtype)
        self._graphdef, state = nnx.split(model)
        # Committed to its shardings, as update_weights places new weights: jit keys its
        # compiled code on that too, so the first update would otherwise recompile all.
        self._state = jax.tree.map(lambda x: jax.device_put(x, x.sharding), state)
        self._new_cache = lambda length: model.init_cache(
            config.max_batch_size, length, cache_dtype
        )
        self._cache = self._new_cache(self._min_cache_len)
        self._token_counts = None  # [B, V] generated-token counts, made when penalties are used
        # Live requests' token constraints as one table (state 0: no constraint), made
        # when a decode call holds a constrained request; offset of each constraint.
        self._constraint_table = None
        self._constraint_offsets: dict[int, int] = {}
        self._seed_rng = np.random.default_rng(config.seed)
        self._slots: list[_Job | None] = [None] * config.max_batch_size
        self._queue: FairQueue[_Job] = FairQueue()
        self._admitting: list[_Job] = []  # the admission in progress
        self._swaps: collections.deque[_Swap] = collections.deque()
        self._groups = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._steps = DecodeSteps(
            self._graphdef, max_seq_len=config.max_seq_len, cache_dtype=cache_dtype
        )
        self._set_rows = jax.jit(lambda c, row, value: c.at[row].set(value), donate_argnums=(0,))
        self.compile_counts = self._steps.compile_counts
        # Seconds the scheduler thread has spent compiling (rollout/jax/compile_clock.py).
        self.compile_s = 0.0

    # -- RolloutEngine ------------------------------------------------------------------------

    def check(self, request: GenerateRequest) -> None:
        """ValueError unless this engine can serve `request` (nothing is queued)."""
        n = len(request.input_ids)
        if n >= self.max_seq_len:
            raise ValueError(
                f"prompt of {n} tokens does not fit max_seq_len={self.max_seq_len} "
                "(at least one slot must stay free for a new token)"
            )
        bad = [t for t in request.input_ids if t >= self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary ({self.vocab_size})")
        stops = self._stop_ids(request)
        if len(stops) > self.config.max_stop_token_ids:
            raise ValueError(
                f"at most {self.config.max_stop_token_ids} distinct stop_token_ids per request "
                f"(got {len(stops)})"
            )
        if request.top_logprobs_num > self.config.max_top_logprobs:
            raise ValueError(
                f"top_logprobs_num must be at most {self.config.max_top_logprobs}, "
                f"got {request.top_logprobs_num}"
            )
        if request.sampling.stop and self.tokenizer is None:
            raise ValueError("stop strings need an engine built with a tokenizer")
        constraint = request.constraint
        if constraint is not None and constraint.vocab_size > self.vocab_size:
            raise ValueError(
                f"the request's token constraint covers {constraint.vocab_size} token ids, "
                f"more than the model's {self.vocab_size}"
            )

    def _stop_ids(self, request: GenerateRequest) -> tuple[int, ...]:
        # An id outside the vocabulary is never sampled, so it can never stop anything.
        return tuple(sorted({t for t in request.sampling.stop_token_ids if t < self.vocab_size}))

    def _submit(self, requests, loop, on_progress=None) -> list[_Job]:
        for r in requests:
            self.check(r)
        now = time.perf_counter()
        with self._cond:
            if self._closed:
                raise RuntimeError("JaxEngine is closed")
            jobs = []
            for r in requests:
                seed = r.sampling.seed
                if seed is None:
                    seed = int(self._seed_rng.integers(0, 2**63))
                job = _Job(r, loop.create_future(), loop, now, seed, self._stop_ids(r), on_progress)
                job.compile_s_at_submit = self.compile_s
                jobs.append(job)
            self._queue.push(next(self._groups), jobs)
            self._ensure_worker()
            self._cond.notify()
        return jobs

    def _cancel(self, jobs: Sequence[_Job]) -> None:
        with self._cond:
            for job in jobs:
                job.cancelled = True
            self._cond.notify()

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Completions in request order; cancelling this cancels the requests' work."""
        jobs = self._submit(requests, asyncio.get_running_loop())
        try:
            return list(await asyncio.gather(*(j.future for j in jobs)))
        except BaseException:
            self._cancel(jobs)
            raise

    async def stream(self, request: GenerateRequest) -> AsyncIterator[Completion]:
        """Partial completions (finish_reason None) as tokens arrive, then the final one."""
        updates: asyncio.Queue[Completion] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        [job] = self._submit([request], loop, on_progress=updates.put_nowait)
        try:
            while True:
                getter = asyncio.ensure_future(updates.get())
                done, _ = await asyncio.wait({getter, job.future}, return_when="FIRST_COMPLETED")
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                while not updates.empty():
                    yield updates.get_nowait()
                yield job.future.result()
                return
        finally:
            if not job.future.done():
                self._cancel([job])

    async def update_weights(
        self,
        model_state: Any,
        *,
        version: int,
        abort_in_flight: bool = False,
        partial: bool = False,
    ) -> None:
        """Swap in new weights (a model or its nnx.State) without recompiling, once the
        requests in flight have finished (or been aborted), or with `partial` at the
        next decode chunk, requests in flight continuing; see the module docstring."""
        if abort_in_flight and partial:
            raise ValueError("update_weights: abort_in_flight and partial exclude each other")
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
        loop = asyncio.get_running_loop()
        swap = _Swap(
            jax.tree.unflatten(old_tree, placed),
            int(version),
            abort_in_flight,
            partial,
            loop.create_future(),
            loop,
        )
        with self._cond:
            if self._closed:
                raise RuntimeError("JaxEngine is closed")
            self._swaps.append(swap)
            self._ensure_worker()
            self._cond.notify()
        await swap.future

    async def update_adapter(
        self, folder, *, version: int, abort_in_flight: bool = False, partial: bool = False
    ) -> None:
        """Swap in the LoRA adapter of a PEFT folder (`models/peft_adapter.py`) on the
        engine's base, as `update_weights` swaps weights: the model must carry adapters
        of the folder's rank, alpha and targets; the base stays as it is.

        The in-process form of weight sync by adapter: a serving engine would load the
        folder under a versioned adapter name and requests would name it."""
        from orchestra_jax.models.peft_adapter import adapter_state

        current = nnx.merge(self._graphdef, self._state)
        adapters = dict(nnx.to_flat_state(adapter_state(current, folder)))
        state = nnx.from_flat_state(
            [(k, adapters.get(k, v)) for k, v in nnx.to_flat_state(self._state)]
        )
        await self.update_weights(
            state, version=version, abort_in_flight=abort_in_flight, partial=partial
        )

    async def flush_cache(self) -> bool:
        """Drop the parked rows (live rows keep theirs); always possible here."""
        with self._cond:
            self.planner.flush()
        return True

    async def health(self) -> bool:
        return not self._closed and (self._thread is None or self._thread.is_alive())

    def running(self) -> int:
        """Requests admitted or waiting (not yet finished)."""
        with self._cond:
            return sum(s is not None for s in self._slots) + len(self._queue)

    def close(self) -> None:
        """Stop the worker thread; requests waiting or in flight fail with RuntimeError."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    # -- scheduler (worker thread) ------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, daemon=True, name="jax-engine")
            self._thread.start()

    def _live(self) -> list[_Job]:
        return [s for s in self._slots if s is not None]

    def _charge_compile(self, seconds: float) -> None:
        self.compile_s += seconds

    def _run(self) -> None:
        with compile_clock.charging(self._charge_compile):
            self._schedule()

    def _schedule(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._work_ready():
                    self._cond.wait()
                if self._closed:
                    self._fail_everything(RuntimeError("JaxEngine closed"))
                    return
                self._drop_cancelled()
                if self._swaps and self._apply_swap():
                    continue
                admitted = self._take_admissions()
                state, version = self._state, self.weight_version
            try:
                if admitted:
                    self._admit(state, version, admitted)
                if self._live():
                    self._decode_round(state)
            except _CallFailed as failure:
                self._recover(failure)

    def _work_ready(self) -> bool:
        return bool(self._queue or self._live() or self._swaps)

    def _drop_cancelled(self) -> None:
        """Forget cancelled requests: waiting ones go, live rows free their slots."""
        self._queue.remove_if(lambda j: j.cancelled)
        for i, job in enumerate(self._slots):
            if job is not None and job.cancelled:
                self._slots[i] = None
                if job.first_weight_version is None:  # else older weights' keys/values
                    self.planner.park(i, job.written_ids())

    def _apply_swap(self) -> bool:
        """Apply the first pending weight update if nothing from the old weights remains
        (aborting what is in flight if it asks to); True if it was applied."""
        swap = self._swaps[0]
        if swap.abort:
            for i, job in enumerate(self._slots):
                if job is not None:
                    self._slots[i] = None
                    self._complete(job, "abort")
            for job in self._queue.remove_if(lambda j: j.weight_version is not None):
                self._complete(job, "abort")
        if swap.partial:  # requests in flight continue on the new weights
            for job in [*self._live(), *self._queue]:
                if job.weight_version is not None and job.weight_version != swap.version:
                    if job.first_weight_version is None:
                        job.first_weight_version = job.weight_version
                    job.weight_version = swap.version
        elif self._live() or self._queue.front_count:
            return False  # the old weights' requests finish first
        self._swaps.popleft()
        self._state = swap.state
        self.weight_version = swap.version
        self.planner.flush()  # parked rows hold keys/values of the old weights
        _settle(swap.future, swap.loop, None)
        return True

    def _take_admissions(self) -> list[_Job]:
        """The waiting requests to admit now (called with the lock held)."""
        live = self._live()
        if any(j.suspect for j in live):
            return []  # a suspect runs alone
        front = self._queue.peek_front()
        if front is not None and front.suspect:
            return self._queue.pop(1, front_only=True) if not live else []
        free = self.max_batch_size - len(live)
        # During a weight update only resumed rows (old weights) are admitted.
        return self._queue.pop(free, front_only=bool(self._swaps))

    def _sampling_arrays(self, jobs: Sequence[_Job | None]):
        """Per-row sampling settings as arrays (rows without a job get greedy defaults)."""

        def col(fn, default, dtype):
            return np.array([default if j is None else fn(j.request.sampling) for j in jobs], dtype)

        seeds = [sampling.split_seed(0 if j is None else j.seed) for j in jobs]
        return (
            col(lambda s: s.temperature, 0.0, np.float32),
            col(lambda s: s.top_p, 1.0, np.float32),
            # top_k past the vocabulary means all of it (and must fit int32).
            col(lambda s: min(s.top_k, self.vocab_size), -1, np.int32),
            col(lambda s: s.min_p, 0.0, np.float32),
            np.array([s[0] for s in seeds], np.uint32),
            np.array([s[1] for s in seeds], np.uint32),
        )

    def _top_n(self, jobs: Sequence[_Job | None]) -> int:
        """The compiled calls' top-logprobs width: 0, or the most any request may ask."""
        wanted = any(j is not None and j.request.top_logprobs_num for j in jobs)
        return self.config.max_top_logprobs if wanted else 0

    # -- admission ------------------------------------------------------------------------

    def _admit(self, state, version: int, jobs: list[_Job]) -> None:
        """Score prompts that ask for it, complete zero-token requests, and prefill the
        rest into slots (reusing cached prefixes), recording their first tokens."""
        self._admitting = jobs
        for job in jobs:
            if job.weight_version is None:
                job.weight_version = version
        scored = [j for j in jobs if j.request.logprob_start_len >= 0 and j.prompt_scores is None]
        self._call(scored, lambda: self._score_prompts(state, scored))
        rows = []
        for job in jobs:
            if job.request.sampling.max_new_tokens == 0:
                self._complete(job, "length")
            else:
                rows.append(job)
        if not rows:
            return
        # A resumed row re-prefills what its cache row held: prompt + generated[:-1].
        prompts = [j.written_ids() if j.tokens else np.asarray(j.prompt, np.int32) for j in rows]
        lengths = [len(p) for p in prompts]
        # The from-scratch prefill writes a whole length bucket into its rows.
        self._fit_cache(
            max(
                self._longest_live_row(),
                *lengths,
                cache_bucket(max(lengths), self._min_prefill_len, self.max_seq_len),
            )
        )
        with self._cond:
            # Rows that straddle a partial swap hold older weights' keys/values: not
            # shared, but busy all the same (a new request must not take their slot).
            occupied = {i: j for i, j in enumerate(self._slots) if j is not None}
            live = {
                i: j.written_ids() for i, j in occupied.items() if j.first_weight_version is None
            }
            plans = self.planner.plan(prompts, live, busy=occupied.keys())
        job_of = dict(zip(map(id, plans), rows))
        self._prefill_cached(state, [p for p in plans if p.source is not None], job_of)
        self._prefill(state, [p for p in plans if p.source is None and p.leader is None], job_of)
        for level in range(1, max(p.level for p in plans) + 1):
            followers = [p for p in plans if p.level == level]
            for p in followers:  # the leader's row now holds its whole prompt
                assert p.leader is not None
                p.source = p.leader.slot
            self._prefill_cached(state, followers, job_of)
        self._admitting = []

    def _call(self, jobs: list[_Job], fn):
        """Run one compiled call for `jobs`; a failure becomes _CallFailed naming them."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - isolated in _recover
            raise _CallFailed(e, jobs) from e

    def _score_prompts(self, state, jobs: list[_Job]) -> None:
        """Prompt logprobs (and top logprobs) from each job's logprob_start_len on."""
        if not jobs:
            return
        t = cache_bucket(max(len(j.prompt) for j in jobs), self._min_prefill_len, self.max_seq_len)
        rows = self._prefill_rows(len(jobs), t, max(self.max_batch_size, len(jobs)))
        ids = np.zeros((rows, t), np.int32)
        lengths = np.zeros(rows, np.int32)
        temperature = np.ones(rows, np.float32)
        for r, job in enumerate(jobs):
            ids[r, : len(job.prompt)] = job.prompt
            lengths[r] = len(job.prompt)
            temperature[r] = job.request.sampling.temperature
        logp, top = jax.device_get(
            self._steps.prompt_logprobs(
                state, ids, lengths, temperature, top_logprobs=self._top_n(jobs)
            )
        )
        for r, job in enumerate(jobs):
            start, n = job.request.logprob_start_len, len(job.prompt)
            scores = [None if p == 0 else float(logp[r, p]) for p in range(start, n)]
            tops = None
            if job.request.top_logprobs_num:
                k = job.request.top_logprobs_num
                tops = [
                    None
                    if p == 0
                    else [(int(i), float(v)) for v, i in zip(top[0][r, p, :k], top[1][r, p, :k])]
                    for p in range(start, n)
                ]
            job.prompt_scores = (scores, tops)

    def _prefill_rows(self, n: int, length: int, max_rows: int | None = None) -> int:
        """Rows of a prefill call of `n` prompts padded to `length` (`prefill_rows`)."""
        return prefill_rows(
            n,
            length,
            self._min_prefill_rows,
            self.max_batch_size if max_rows is None else max_rows,
            self._prefill_pad_tokens,
        )

    def _prefill(self, state, plans: list[Admission], job_of: dict[int, _Job]) -> None:
        """Prefill whole prompts into their slots (one call, rows and length bucketed)."""
        if not plans:
            return
        jobs = [job_of[id(p)] for p in plans]
        n = len(plans)
        t = cache_bucket(max(len(p.ids) for p in plans), self._min_prefill_len, self.max_seq_len)
        rows_bucket = self._prefill_rows(n, t)
        # Padding rows point past the batch, so inserting them writes nothing.
        rows = np.full(rows_bucket, self.max_batch_size, np.int32)
        rows[:n] = [p.slot for p in plans]
        ids = np.zeros((rows_bucket, t), np.int32)
        lengths = np.zeros(rows_bucket, np.int32)  # 0: a padding row, nothing written
        for r, p in enumerate(plans):
            ids[r, : len(p.ids)] = p.ids
            lengths[r] = len(p.ids)
        padded = jobs + [None] * (rows_bucket - n)

        def call():
            prefilled, tokens, logp, top = self._steps.prefill(
                state, ids, lengths, *self._sampling_arrays(padded), top_logprobs=self._top_n(jobs)
            )
            self._cache = self._steps.insert(self._cache, rows, prefilled)
            return jax.device_get((tokens, logp, top))

        self._start(plans, jobs, *self._call(jobs, call))

    def _prefill_cached(self, state, plans: list[Admission], job_of: dict[int, _Job]) -> None:
        """Prefill prompt suffixes after their cached prefixes (one call, bucketed)."""
        if not plans:
            return
        jobs = [job_of[id(p)] for p in plans]
        n = len(plans)
        t = cache_bucket(
            max(len(p.ids) - p.reused for p in plans), self._min_prefill_len, self.max_seq_len
        )
        rows_bucket = self._prefill_rows(n, t)
        sources = np.zeros(rows_bucket, np.int32)
        targets = np.full(rows_bucket, self.max_batch_size, np.int32)  # padding: dropped
        starts = np.zeros(rows_bucket, np.int32)
        ids = np.zeros((rows_bucket, t), np.int32)
        lengths = np.zeros(rows_bucket, np.int32)
        for r, p in enumerate(plans):
            assert p.source is not None  # only plans that reuse a cached prefix come here
            sources[r], targets[r], starts[r] = p.source, p.slot, p.reused
            ids[r, : len(p.ids) - p.reused] = p.ids[p.reused :]
            lengths[r] = len(p.ids) - p.reused
        padded = jobs + [None] * (rows_bucket - n)

        def call():
            self._cache, tokens, logp, top = self._steps.prefill_cached(
                state,
                self._cache,
                sources,
                targets,
                starts,
                ids,
                lengths,
                *self._sampling_arrays(padded),
                top_logprobs=self._top_n(jobs),
            )
            return jax.device_get((tokens, logp, top))

        self._start(plans, jobs, *self._call(jobs, call))

    def _start(self, plans: list[Admission], jobs: list[_Job], tokens, logp, top) -> None:
        """Give the prefilled requests their slots and first tokens (a resumed row keeps
        its own: its prefill only rebuilt the cache row)."""
        for r, (p, job) in enumerate(zip(plans, jobs)):
            with self._cond:
                self._slots[p.slot] = job
            if job.tokens:
                self._reset_counts(p.slot, job, job.tokens)
                continue
            job.cached_tokens = p.reused
            self._reset_counts(p.slot, job, [int(tokens[r])])
            self._extend(p.slot, job, [int(tokens[r])], [float(logp[r])], top, r, first=True)

    def _reset_counts(self, slot: int, job: _Job, tokens: list[int]) -> None:
        """Penalised rows: the slot's generated-token counts start from `tokens`."""
        if not job.request.sampling.penalized:
            return
        if self._token_counts is None:
            self._token_counts = jnp.zeros((self.max_batch_size, self.vocab_size), jnp.int32)
        row = np.bincount(np.asarray(tokens, np.int64), minlength=self.vocab_size).astype(np.int32)
        self._token_counts = self._set_rows(self._token_counts, slot, row)

    # -- decoding -------------------------------------------------------------------------

    def _decode_rows(self, live: int) -> int:
        """Rows of a decode call with `live` rows live: the smallest row bucket that
        holds them, else the whole batch."""
        return min((r for r in self._row_buckets if r >= live), default=self.max_batch_size)

    def _decode_round(self, state) -> None:
        # Positions fed this call reach longest + steps_per_call - 1.
        self._fit_cache(self._longest_live_row() + self.config.steps_per_call - 1)
        # Call row r decodes cache row slots[r]; a row bucket takes the live rows only
        # (in slot order), padded with rows past the batch that write nothing.
        live_slots = [i for i, j in enumerate(self._slots) if j is not None]
        b = self._decode_rows(len(live_slots))
        if b < self.max_batch_size:
            slots = live_slots + [self.max_batch_size] * (b - len(live_slots))
            rows = np.asarray(slots, np.int32)
        else:
            slots, rows = list(range(b)), None
        jobs = [self._slots[i] if i < self.max_batch_size else None for i in slots]
        width = bucket(
            max((len(j.stop_ids) for j in jobs if j is not None), default=1),
            8,
            max(8, self.config.max_stop_token_ids),
        )
        tokens = np.zeros(b, np.int32)
        positions = np.zeros(b, np.int32)
        counts = np.zeros(b, np.int32)
        done = np.ones(b, bool)
        max_new = np.ones(b, np.int32)
        stop_ids = np.full((b, width), -1, np.int32)
        penalties = None
        for i, job in enumerate(jobs):
            if job is None:
                continue
            tokens[i] = job.tokens[-1]
            positions[i] = len(job.prompt) + len(job.tokens) - 1
            counts[i] = len(job.tokens)
            done[i] = False
            # The context ends first for any budget past it (and it must fit int32).
            max_new[i] = min(job.request.sampling.max_new_tokens, self.max_seq_len)
            stop_ids[i, : len(job.stop_ids)] = job.stop_ids
        if any(j is not None and j.request.sampling.penalized for j in jobs):

            def col(name, default):
                return np.array(
                    [default if j is None else getattr(j.request.sampling, name) for j in jobs],
                    np.float32,
                )

            penalties = (
                self._token_counts,
                # A vanishing penalty would divide by a float32 zero.
                np.maximum(col("repetition_penalty", 1.0), 1e-6),
                col("frequency_penalty", 0.0),
                col("presence_penalty", 0.0),
            )
        constraint = self._constraint_arrays(jobs)
        live_jobs = [j for j in jobs if j is not None]
        top_n = self._top_n(jobs)
        with self._cond:
            # Requests wait only while every slot is busy: end the chunk at the step
            # in which a row finishes, so the next admission refills its slot.
            stop_on_finish = np.bool_(self.config.admit_mid_chunk and len(self._queue) > 0)

        def call():
            self._cache, out_tokens, out_logp, out_top, new_penalties = self._steps.decode(
                state,
                self._cache,
                tokens,
                positions,
                counts,
                done,
                max_new,
                stop_ids,
                *self._sampling_arrays(jobs),
                penalties,
                stop_on_finish,
                rows,
                constraint,
                num_steps=self.config.steps_per_call,
                top_logprobs=top_n,
            )
            if new_penalties is not None:
                self._token_counts = new_penalties[0]
            return jax.device_get((out_tokens, out_logp, out_top))

        out_tokens, out_logp, out_top = self._call(live_jobs, call)
        for job in live_jobs:
            job.suspect = False  # it came through a call of its own
        for i, job in enumerate(jobs):
            if job is None:
                continue
            valid = out_tokens[i] >= 0
            self._extend(
                slots[i],
                job,
                [int(t) for t in out_tokens[i][valid]],
                [float(x) for x in out_logp[i][valid]],
                None if out_top is None else (out_top[0][i][valid], out_top[1][i][valid]),
                None,
            )

    def _constraint_arrays(self, jobs: Sequence[_Job | None]):
        """None, or (table, states [len(jobs)]) for a decode call holding constrained
        requests: each one's state after its tokens so far, in the engine's table of the
        live requests' constraints (rebuilt when one is missing from it)."""
        wanted = [j.request.constraint for j in jobs if j is not None]
        wanted = [c for c in wanted if c is not None]
        if not wanted:
            return None
        if any(id(c) not in self._constraint_offsets for c in wanted):
            held = [j.request.constraint for j in self._live()] + wanted
            live = {id(c): c for c in held if c is not None}
            parts, offset = [np.zeros((1, self.vocab_size), np.int32)], 1
            self._constraint_offsets = {}
            for key, c in live.items():
                self._constraint_offsets[key] = offset
                table = c.widened(self.vocab_size)
                parts.append(np.where(table >= 0, table + offset, -1))
                offset += c.num_states
            # Padded to a bucket of states, so that a new constraint seldom recompiles.
            rows = bucket(offset, 8, 1 << 30)
            parts.append(np.zeros((rows - offset, self.vocab_size), np.int32))
            self._constraint_table = jnp.asarray(np.concatenate(parts).astype(np.int32))
        states = np.zeros(len(jobs), np.int32)
        for i, job in enumerate(jobs):
            if job is None or job.request.constraint is None:
                continue
            c = job.request.constraint
            if job.constraint_seen == 0:
                job.constraint_state = c.start
            job.constraint_state = c.advance(
                job.constraint_state, job.tokens[job.constraint_seen :]
            )
            job.constraint_seen = len(job.tokens)
            states[i] = self._constraint_offsets[id(c)] + job.constraint_state
        return self._constraint_table, states

    def _extend(self, slot: int, job: _Job, tokens, logprobs, top, row, *, first=False) -> None:
        """Append new tokens to a live row; finish it if it stopped or ran out of room."""
        job.tokens.extend(tokens)
        job.logprobs.extend(logprobs)
        k = job.request.top_logprobs_num
        if k:
            values, ids = (top[0][row], top[1][row]) if first else top
            values, ids = (values[None], ids[None]) if first else (values, ids)
            job.top = (job.top or []) + [
                [(int(i), float(v)) for v, i in zip(vs[:k], is_[:k])]
                for vs, is_ in zip(values, ids)
            ]
        self._finish_if_done(slot, job)

    def _finish_if_done(self, slot: int, job: _Job) -> None:
        """Complete the row's request if it hit a stop id or string, its budget, or the
        cache end; otherwise report progress to a streaming caller."""
        sp = job.request.sampling
        reason, matched = None, None
        stop_at = [
            i for i, t in enumerate(job.tokens[job.checked :], job.checked) if t in job.stop_ids
        ]
        if stop_at:
            del job.tokens[stop_at[0] + 1 :], job.logprobs[stop_at[0] + 1 :]
        if sp.stop:
            assert self.tokenizer is not None  # requests with stop strings are refused without one
            hit = first_stop(self.tokenizer.decode, job.tokens, sp.stop, job.checked)
            if hit is not None:
                del job.tokens[hit[0] + 1 :], job.logprobs[hit[0] + 1 :]
                reason, matched = "stop", hit[1]
        if reason is None and job.tokens and job.tokens[-1] in job.stop_ids:
            reason, matched = "stop", job.tokens[-1]
        if job.top is not None:
            del job.top[len(job.tokens) :]
        job.checked = len(job.tokens)
        if reason is None and (
            len(job.tokens) >= sp.max_new_tokens
            or len(job.prompt) + len(job.tokens) >= self.max_seq_len
        ):
            reason = "length"
        if reason is None:
            if job.on_progress is not None:
                progress = self._completion(job, None)
                _call_soon(job.loop, job.on_progress, progress)
            return
        with self._cond:
            self._slots[slot] = None
            if job.first_weight_version is None:  # else older weights' keys/values
                self.planner.park(slot, job.written_ids())
        self._complete(job, reason, matched)

    def _completion(self, job: _Job, reason, matched=None) -> Completion:
        scores, tops = job.prompt_scores or (None, None)
        return Completion(
            list(job.tokens),
            list(job.logprobs),
            reason,
            len(job.prompt),
            len(job.tokens),
            self._latency(job),
            job.cached_tokens,
            weight_version=job.weight_version,
            first_weight_version=job.first_weight_version,
            matched_stop=matched,
            top_logprobs=None
            if job.top is None and not job.request.top_logprobs_num
            else list(job.top or []),
            prompt_logprobs=scores,
            prompt_top_logprobs=tops,
        )

    def _latency(self, job: _Job) -> float:
        """Seconds since `job` was submitted, less the engine's compiles meanwhile."""
        compiling = self.compile_s - job.compile_s_at_submit
        return max(0.0, time.perf_counter() - job.submitted - compiling)

    def _complete(self, job: _Job, reason: str, matched=None) -> None:
        job.finished = True
        _settle(job.future, job.loop, self._completion(job, reason, matched))

    def _longest_live_row(self) -> int:
        """Tokens (prompt + generated) in the longest live row; 0 when none."""
        return max((len(j.prompt) + len(j.tokens) for j in self._live()), default=0)

    def _fit_cache(self, needed: int) -> None:
        """Grow the cache to the bucket holding `needed` slots; shrink it once that is
        at most half the current length (hysteresis, so rows coming and going do not
        resize it back and forth)."""
        target = cache_bucket(needed, self._min_cache_len, self.max_seq_len)
        current = self._cache.max_len
        if target > current or 2 * target <= current:
            self._cache = self._steps.resize(self._cache, length=target)
            self.planner.truncate(target)  # a shrink cuts parked rows too

    # -- failures -------------------------------------------------------------------------

    def _recover(self, failure: _CallFailed) -> None:
        """Isolate a failed call: a request alone in it gets the error; several are each
        retried alone; every other live row resumes from its tokens on a new cache."""
        log.error("JaxEngine call failed for %d request(s): %r", len(failure.jobs), failure.error)
        failed = set(map(id, failure.jobs))
        with self._cond:
            # Live rows, and rows of the failed admission that had not started.
            candidates = self._live() + [j for j in self._admitting if j not in self._live()]
            survivors = [j for j in candidates if id(j) not in failed and not j.finished]
            self._admitting = []
            self._slots = [None] * self.max_batch_size
            # The failed call may have consumed (donated) the cache: rebuild it.
            self._cache = self._new_cache(self._min_cache_len)
            self.planner.flush()
            retry = []
            for job in failure.jobs:
                if job.cancelled:
                    continue
                if len(failure.jobs) == 1:
                    _settle(job.future, job.loop, failure.error)
                else:
                    job.suspect = True
                    retry.append(job)
            # Suspects first (each alone), then the rows that were merely beside them.
            self._queue.push_front(retry + [j for j in survivors if not j.cancelled])

    def _fail_everything(self, error: BaseException) -> None:
        jobs = self._live() + self._queue.clear()
        self._slots = [None] * self.max_batch_size
        for job in jobs:
            _settle(job.future, job.loop, error)
        for swap in self._swaps:
            _settle(swap.future, swap.loop, error)
        self._swaps.clear()


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
        pass


def _settle(future: asyncio.Future, loop: asyncio.AbstractEventLoop, outcome) -> None:
    """Resolve `future` (on its own loop) with a result, or an exception instance."""

    def settle():
        if future.done():  # the caller gave up (cancelled)
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    _call_soon(loop, settle)
