"""JaxEngine's prefix cache: reused keys/values give the tokens of a full prefill."""

import asyncio
import contextlib

import numpy as np
import pytest
from flax import nnx

from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig, common_prefix
from tests.decode_gate import DecodeGate, wait_until
from tests.test_rollout_jax_engine import (
    MAX_LEN,
    assert_greedy_matches_full_forward,
    generate,
)
from tests.test_rollout_jax_engine import model as model_fixture

model = model_fixture  # the module-scoped fixture, shared with the engine's tests

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def engine(model):
    # One cache and prompt bucket (64 slots), so the engine compiles few functions.
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=4,
            max_seq_len=MAX_LEN,
            steps_per_call=4,
            min_cache_len=MAX_LEN,
            min_prefill_len=MAX_LEN,
            min_cached_prefix=8,
        ),
    )
    yield engine
    engine.close()


@contextlib.contextmanager
def cache_off(engine):
    """The same engine (its compiled functions) with prefix caching off, the reference."""
    engine.planner.enabled = False
    try:
        yield engine
    finally:
        engine.planner.enabled = True


def uncached(engine, *requests):
    with cache_off(engine):
        return generate(engine, *requests)


def prompt(seed, n=20):
    """Random ids; distinct seeds give prompts sharing (almost surely) no prefix."""
    return np.random.default_rng(seed).integers(3, 250, n).tolist()


def assert_same(a, b):
    assert [c.output_ids for c in a] == [c.output_ids for c in b]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)


def test_common_prefix():
    a = np.array([1, 2, 3, 4])
    others = ([1, 2, 3, 4, 5], [1, 2, 9], [7], [])
    assert [common_prefix(a, np.array(b)) for b in others] == [4, 2, 0, 0]


def test_multi_turn_reuses_the_previous_turn(model, engine):
    """Turn k+1 = turn k's prompt + its tokens + a tool segment: reused, same tokens."""
    ids, on, off = prompt(1), [], []
    for extra in ([5, 6, 7, 8, 9], [10, 11, 12, 13], None):
        request = GenerateRequest(ids, GREEDY)
        on += generate(engine, request)
        off += uncached(engine, request)
        ids = ids + on[-1].output_ids + (extra or [])
    assert_same(on, off)
    first, second, third = on
    assert first.cached_tokens == 0
    # Everything but the last sampled token, which was never fed, is in the cache.
    assert second.cached_tokens == first.prompt_tokens + first.completion_tokens - 1
    assert third.cached_tokens == second.prompt_tokens + second.completion_tokens - 1
    assert all(c.cached_tokens == 0 for c in off)
    assert_greedy_matches_full_forward(model, ids[: third.prompt_tokens], third)


def test_sampled_group_shares_its_prompt(engine):
    """A GRPO group in one admission: the first prefills the prompt, the others copy it."""
    shared = prompt(2, 24)
    group = [
        GenerateRequest(shared, SamplingParams(temperature=1.0, max_new_tokens=10, seed=s))
        for s in range(4)
    ]
    computed = engine.prefix_cache_stats["prompt_tokens_computed"]
    on = generate(engine, *group)
    assert engine.prefix_cache_stats["prompt_tokens_computed"] - computed == 24 + 3
    assert sorted(c.cached_tokens for c in on) == [0, 23, 23, 23]
    # The next turn of two members with a new group sharing another prompt: rows
    # continued from the cache, a scratch prefill and a copy in one admission.
    mixed = [
        GenerateRequest(shared + on[i].output_ids + [7, 7, 7], group[i].sampling) for i in (0, 2)
    ]
    mixed += [
        GenerateRequest(prompt(3, 18), SamplingParams(temperature=1.0, max_new_tokens=6, seed=s))
        for s in (8, 9)
    ]
    on_mixed = generate(engine, *mixed)
    assert [c.cached_tokens for c in on_mixed[:2]] == [33, 33]
    assert sorted(c.cached_tokens for c in on_mixed[2:]) == [0, 17]
    # Last: the reference runs take the slots, and with caching off park nothing.
    assert_same(on, uncached(engine, *group))
    assert_same(on_mixed, uncached(engine, *mixed))


def test_a_shared_head_alone_is_not_reused(engine):
    """Two tasks whose prompts share only a head (under a quarter of them) are both
    prefilled from scratch, side by side; each one's copy still reuses it."""
    head = prompt(5, 10)  # above min_cached_prefix (8), under a quarter of 50
    first, second = head + prompt(6, 40), head + prompt(7, 40)
    group = [GenerateRequest(ids, GREEDY) for ids in (first, first, second, second)]
    on = generate(engine, *group)
    assert [c.cached_tokens for c in on] == [0, 49, 0, 49]
    # A quarter or more: reused (from a row parked by the call above).
    other = GenerateRequest(first[:14] + prompt(8, 24), GREEDY)
    [longer] = generate(engine, other)
    assert longer.cached_tokens == 14
    # Last: the reference runs take the slots, and with caching off park nothing.
    assert_same(on + [longer], uncached(engine, *group, other))


def test_a_repeated_request_reuses_all_but_one_token(engine):
    request = GenerateRequest(prompt(4), GREEDY)
    [first] = generate(engine, request)
    [again] = generate(engine, request)
    assert first.cached_tokens == 0 and again.cached_tokens == 19
    assert_same([first, again], uncached(engine, request, request))


def test_least_recently_used_rows_are_evicted(engine):
    """Six prompts one after another through four slots: the first two are evicted."""
    requests = [GenerateRequest(prompt(10 + i), GREEDY) for i in range(6)]
    first = [generate(engine, r)[0] for r in requests]
    [last] = generate(engine, requests[5])
    [oldest] = generate(engine, requests[0])
    assert last.cached_tokens == 19 and oldest.cached_tokens == 0
    assert_same([last, oldest], [first[5], first[0]])


def test_update_weights_invalidates_parked_rows(model, engine):
    request = GenerateRequest(prompt(5), GREEDY)
    [before] = generate(engine, request)
    invalidated = engine.prefix_cache_stats["parked_invalidated"]
    asyncio.run(engine.update_weights(nnx.state(model), version=3))
    [after] = generate(engine, request)
    assert after.cached_tokens == 0
    assert engine.prefix_cache_stats["parked_invalidated"] > invalidated
    assert after.output_ids == before.output_ids


def test_live_rows_are_reused_and_compiles_stay_bounded(engine, monkeypatch):
    """A request arriving while a row with its prefix still decodes copies that row."""
    long = GenerateRequest(prompt(6), SamplingParams(temperature=0.0, max_new_tokens=30))
    follow = GenerateRequest(prompt(6) + [3, 4, 5], GREEDY)

    async def staggered():
        # The long row's first decode call is held until the follower is queued.
        gate = DecodeGate(engine, monkeypatch)
        first = asyncio.ensure_future(engine.generate([long]))
        await wait_until(lambda: gate.calls > 0, what="the long row decoding")
        second = asyncio.ensure_future(engine.generate([follow]))
        await wait_until(lambda: engine.running() >= 2, what="the follower queued")
        gate.open()
        return [(await second)[0], (await first)[0]]

    on = asyncio.run(staggered())
    with cache_off(engine):
        off = asyncio.run(staggered())
    assert_same(on, off)
    assert on[0].cached_tokens == 20
    allowed = {
        f"{name}(rows=4, len=64{tail})"
        for name, tail in (
            ("prefill", ""),
            ("insert", ", cache=64"),
            ("prefill_cached", ", cache=64"),
        )
    }
    decodes = {"decode(cache=64)"} | {f"decode(cache=64, rows={r})" for r in (1, 2)}
    assert set(engine.compile_counts) <= allowed | decodes
    assert all(v == 1 for v in engine.compile_counts.values())
