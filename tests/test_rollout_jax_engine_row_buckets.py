"""JaxEngine's decode row buckets (`JaxEngineConfig.decode_row_buckets`), on the tiny Qwen3.

While few rows are live, a decode call gathers them into a smaller compiled batch
(4, 2 or 1 rows of 8 here) and scatters their keys/values back. Every request must
get the tokens and logprobs it gets from full-size calls (`decode_row_buckets=()`):
greedy and seeded sampling, stop ids and strings, prefix-cache hits, penalties and
top logprobs, LoRA adapters, and a request cancelled while its rows are compacted.
"""

import asyncio
import dataclasses
import threading

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.lora import LoRAParam, LoRASpec
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from tests.decode_gate import wait_until
from tests.test_rollout_jax_engine_requests import LetterTokenizer

SLOTS, MAX_LEN, BUCKETS = 8, 96, (4, 2, 1)


@pytest.fixture(scope="module")
def model():
    return Qwen3ForCausalLM(Qwen3Config.preset("tiny"), rngs=nnx.Rngs(0))


_SHARED: dict[int, tuple] = {}


class RecordedSteps:
    """A DecodeSteps shared by the engines of one model (one compile per program for
    the whole module), recording the row count of every decode call of its engine."""

    def __init__(self, steps):
        self._steps, self.rows = steps, []

    def __getattr__(self, name):
        return getattr(self._steps, name)

    def decode(self, *args, **kwargs):
        self.rows.append(int(args[2].shape[0]))  # the fed tokens, one per call row
        return self._steps.decode(*args, **kwargs)


def make_engine(model, buckets, *, shared=True, **config):
    """One cache length (MAX_LEN) and one prefill shape, so only the row buckets vary."""
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=SLOTS,
            max_seq_len=MAX_LEN,
            steps_per_call=4,
            min_cache_len=MAX_LEN,
            min_prefill_len=MAX_LEN // 2,
            min_prefill_rows=SLOTS,
            max_top_logprobs=3,
            decode_row_buckets=buckets,
            **config,
        ),
        tokenizer=LetterTokenizer(),
    )
    if shared:
        # The model is kept with its steps, so its id is never reused meanwhile.
        _, steps = _SHARED.setdefault(id(model), (model, engine._steps))
        engine._steps = RecordedSteps(steps)
    return engine


def stream(engine, requests):
    """Each request as its own concurrent `generate` call (as rollouts send turns)."""

    async def run():
        return await asyncio.gather(*(engine.generate([r]) for r in requests))

    return [c for [c] in asyncio.run(run())]


def on_and_off(model, rounds, **config):
    """Completions of each round of requests (rounds run one after another on one
    engine) with row buckets and without, and the row counts of the first one's
    decode calls."""
    out, rows = {}, {}
    for buckets in (BUCKETS, ()):
        engine = make_engine(model, buckets, **config)
        try:
            out[buckets] = [stream(engine, requests) for requests in rounds]
        finally:
            engine.close()
        rows[buckets] = set(engine._steps.rows)
    assert rows[()] == {SLOTS}
    return out[BUCKETS], out[()], rows[BUCKETS]


def assert_same(on, off):
    for a, b in zip(on, off, strict=True):
        assert a.output_ids == b.output_ids
        assert a.finish_reason == b.finish_reason and a.matched_stop == b.matched_stop
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-6)
        assert a.cached_tokens == b.cached_tokens
        if a.top_logprobs is not None or b.top_logprobs is not None:
            assert [[i for i, _ in t] for t in a.top_logprobs] == [
                [i for i, _ in t] for t in b.top_logprobs
            ]
            np.testing.assert_allclose(
                [[v for _, v in t] for t in a.top_logprobs],
                [[v for _, v in t] for t in b.top_logprobs],
                rtol=0,
                atol=1e-6,
            )


def mixed(seed, n=12, **sampling):
    """`n` requests of mixed prompt lengths (2-40) and budgets (1-40)."""
    rng = np.random.default_rng(seed)
    return [
        GenerateRequest(
            rng.integers(3, 250, int(p)).tolist(),
            SamplingParams(max_new_tokens=int(m), seed=100 + i, **sampling),
        )
        for i, (p, m) in enumerate(rng.integers((2, 1), (41, 41), (n, 2)))
    ]


def test_decode_rows_are_the_smallest_bucket_holding_the_live_rows(model):
    engine = make_engine(model, (8, 4, 2, 1, 64))  # 8 and 64 are not below the batch
    assert [engine._decode_rows(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert make_engine(model, ())._decode_rows(1) == SLOTS
    assert make_engine(model, (3,))._decode_rows(2) == 3
    with pytest.raises(ValueError, match="decode_row_buckets"):
        JaxEngineConfig(decode_row_buckets=(0,))


@pytest.mark.parametrize(
    "sampling",
    [
        dict(temperature=0.0),
        dict(temperature=1.0, top_p=0.9, top_k=50, min_p=0.02),
    ],
    ids=["greedy", "seeded"],
)
def test_mixed_lengths_give_the_tokens_of_full_size_calls(model, sampling):
    on, off, rows = on_and_off(model, [mixed(0, **sampling)])
    assert_same(on[0], off[0])
    # Full-size calls while most rows were live, then smaller buckets on the way down.
    assert SLOTS in rows and len(rows) >= 3 and rows <= {SLOTS, *BUCKETS}
    assert {c.finish_reason for c in on[0]} == {"length"}


def test_stop_ids_and_strings_give_the_tokens_of_full_size_calls(model):
    requests = [
        GenerateRequest(
            r.input_ids,
            dataclasses.replace(r.sampling, stop_token_ids=(7, 11, 200), stop=("ed", "q"))
            if i % 2
            else dataclasses.replace(r.sampling, stop=("k",)),
        )
        for i, r in enumerate(mixed(1, temperature=1.0))
    ]
    on, off, rows = on_and_off(model, [requests])
    assert_same(on[0], off[0])
    assert any(isinstance(c.matched_stop, str) for c in on[0])  # a stop string ended one
    assert len(rows - {SLOTS}) >= 2


def test_prefix_cache_hits_give_the_tokens_of_full_size_calls(model):
    """A second round continues the first round's conversations: its prompts start
    with the first round's prompt and output, held by parked (or live) rows."""
    first = mixed(2, n=6, temperature=0.0)
    on, off, rows = on_and_off(model, [first])
    assert_same(on[0], off[0])
    second = [
        GenerateRequest(
            r.input_ids + c.output_ids + [5, 6, 7],
            SamplingParams(temperature=1.0, max_new_tokens=4 + 5 * i, seed=i),
        )
        for i, (r, c) in enumerate(zip(first, on[0]))
    ]
    on, off, rows = on_and_off(model, [first, second])
    assert_same(on[0] + on[1], off[0] + off[1])
    assert sum(c.cached_tokens for c in on[1]) > 0
    assert len(rows - {SLOTS}) >= 2


def test_penalties_and_top_logprobs_give_those_of_full_size_calls(model):
    """The rows' generated-token counts travel with them into the bucket and back."""
    requests = [
        GenerateRequest(
            r.input_ids,
            dataclasses.replace(
                r.sampling,
                repetition_penalty=1.3,
                frequency_penalty=0.5 * (i % 3),
                presence_penalty=0.2,
            )
            if i % 3
            else r.sampling,
            top_logprobs_num=3 if i % 2 else 0,
        )
        for i, r in enumerate(mixed(3, temperature=1.0))
    ]
    # Two rounds on one engine: the second starts from the counts the first left behind.
    on, off, rows = on_and_off(model, [requests, requests[::-1]])
    assert_same(on[0] + on[1], off[0] + off[1])
    assert SLOTS in rows and len(rows) >= 3


def test_lora_adapters_give_the_tokens_of_full_size_calls():
    lora = Qwen3ForCausalLM(
        Qwen3Config.preset("tiny", lora=LoRASpec(rank=4, alpha=8.0)), rngs=nnx.Rngs(0)
    )
    rng = np.random.default_rng(0)
    nnx.update(
        lora,
        nnx.from_flat_state(
            [
                (k, v.replace(jnp.asarray(0.2 * rng.standard_normal(v.shape), jnp.float32)))
                for k, v in nnx.to_flat_state(nnx.state(lora, LoRAParam))
            ]
        ),
    )
    requests = mixed(4, temperature=0.0)
    on, off, rows = on_and_off(lora, [requests])
    assert_same(on[0], off[0])
    assert SLOTS in rows and rows - {SLOTS}
    # The adapters change the tokens (else this test would not test them).
    base = Qwen3ForCausalLM(Qwen3Config.preset("tiny"), rngs=nnx.Rngs(0))
    engine = make_engine(base, BUCKETS)
    try:
        plain = stream(engine, requests)
    finally:
        engine.close()
    assert [c.output_ids for c in plain] != [c.output_ids for c in on[0]]


def test_a_request_cancelled_in_a_compacted_call(model, monkeypatch):
    """Three rows in the 4-row bucket; the middle one is cancelled while a compacted
    call holds it: the other two finish with the tokens they get without it, its slot
    is freed, and the calls after it run the two rows in the 2-row bucket."""
    requests = [
        GenerateRequest([3 + i, 9, 4, 7], SamplingParams(temperature=t, max_new_tokens=40, seed=i))
        for i, t in enumerate((0.0, 1.0, 1.0))
    ]
    reference = make_engine(model, ())
    try:
        expected = stream(reference, [requests[0], requests[2]])
    finally:
        reference.close()

    engine = make_engine(model, BUCKETS)
    real = engine._steps.decode
    calls: list[list[int]] = []
    held, release = threading.Event(), threading.Event()

    def recorded(*args, **kwargs):
        rows = args[16]
        calls.append([] if rows is None else np.asarray(rows).tolist())
        if len(calls) == 2:  # hold the second call (every row still live)
            held.set()
            release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine._steps, "decode", recorded)
    # Admit the three together: the worker may wake between two submissions (a
    # loaded machine), and would then start decoding the first alone.
    take = engine._take_admissions
    monkeypatch.setattr(
        engine, "_take_admissions", lambda: take() if len(engine._queue) >= 3 else []
    )

    async def run():
        tasks = [asyncio.ensure_future(engine.generate([r])) for r in requests]
        await wait_until(held.is_set, what="the second decode call")
        tasks[1].cancel()
        await asyncio.sleep(0.05)
        release.set()
        done = [await tasks[0], await tasks[2]]
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
        await wait_until(lambda: engine.running() == 0, what="every slot free")
        return [c for [c] in done]

    try:
        kept = asyncio.run(run())
    finally:
        release.set()
        engine.close()
    assert_same(kept, expected)
    assert all(c.completion_tokens == 40 for c in kept)
    # Slots 0, 1, 2 in the 4-row bucket (the fourth a padding row past the batch) ...
    assert calls[0] == calls[1] == [0, 1, 2, SLOTS]
    # ... then, once the cancelled row's slot is freed, slots 0 and 2 in two rows.
    assert calls[2:] and all(c == [0, 2] for c in calls[2:])


def test_compiles_are_bounded_by_cache_lengths_times_row_buckets(model):
    """Row buckets multiply the decode programs by at most 1 + len(buckets) per cache
    length and static options, each compiled once however many requests come."""
    engine = make_engine(model, BUCKETS, shared=False)
    try:
        for seed in range(2):
            stream(engine, mixed(10 + seed, temperature=1.0))
    finally:
        engine.close()
    decodes = {k: v for k, v in engine.compile_counts.items() if k.startswith("decode(")}
    allowed = {f"decode(cache={MAX_LEN})"} | {f"decode(cache={MAX_LEN}, rows={r})" for r in BUCKETS}
    assert set(decodes) == allowed and set(decodes.values()) == {1}
