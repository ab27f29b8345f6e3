"""JaxEngine per-request features and isolation, on the tiny Qwen3.

Stop strings, top and prompt logprobs, penalties, min_p, zero-token requests,
cancellation, failing calls, fair admission, streaming and versioned weight swaps.
"""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from tests.decode_gate import DecodeGate, wait_until
from tests.test_rollout_jax_engine import MAX_LEN, full_logits, generate

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


class LetterTokenizer:
    """Token i spells one letter (i mod 26): enough to test stop strings."""

    @staticmethod
    def decode(ids):
        return "".join(chr(ord("a") + i % 26) for i in ids)


@pytest.fixture(scope="module")
def model():
    return Qwen3ForCausalLM(Qwen3Config.preset("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def engine(model):
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=4,
            max_seq_len=MAX_LEN,
            steps_per_call=4,
            min_cache_len=MAX_LEN,
            min_prefill_len=MAX_LEN,
            max_top_logprobs=3,
        ),
        tokenizer=LetterTokenizer(),
    )
    yield engine
    engine.close()


def reference_greedy(model, prompt, steps, penalize=None):
    """Greedy tokens and logprobs from full forwards, optionally penalising the logits."""
    ids, out, logps = list(prompt), [], []
    for _ in range(steps):
        logits = np.asarray(full_logits(model, ids)[-1], np.float64)
        if penalize is not None:
            logits = penalize(logits, out)
        token = int(np.argmax(logits))
        logps.append(float(jax.nn.log_softmax(jnp.asarray(logits))[token]))
        out.append(token)
        ids.append(token)
    return out, logps


def test_zero_new_tokens_and_prompt_logprobs(model, engine):
    prompt = [5, 9, 2, 7, 7]
    request = GenerateRequest(
        prompt,
        SamplingParams(temperature=0.0, max_new_tokens=0),
        top_logprobs_num=2,
        logprob_start_len=1,
    )
    [c] = generate(engine, request)
    assert c.output_ids == [] and c.finish_reason == "length" and c.weight_version == 0
    logp = jax.nn.log_softmax(full_logits(model, prompt), axis=-1)
    expected = [float(logp[p - 1, prompt[p]]) for p in range(1, len(prompt))]
    np.testing.assert_allclose(c.prompt_logprobs, expected, atol=1e-4)
    top = np.argsort(-np.asarray(logp), axis=-1)[:, :2]
    assert [[i for i, _ in row] for row in c.prompt_top_logprobs] == top[:-1].tolist()
    # From position 0: that token has no logprob.
    [c0] = generate(engine, GenerateRequest(prompt, GREEDY, logprob_start_len=0))
    assert c0.prompt_logprobs[0] is None and c0.prompt_logprobs[1:] == pytest.approx(
        expected, abs=1e-4
    )


def test_top_logprobs_of_generated_tokens(model, engine):
    prompt = [3, 1, 4]
    [c] = generate(engine, GenerateRequest(prompt, GREEDY, top_logprobs_num=3))
    assert len(c.top_logprobs) == len(c.output_ids) == 8
    ids = list(prompt)
    for token, top in zip(c.output_ids, c.top_logprobs):
        logp = np.asarray(jax.nn.log_softmax(full_logits(model, ids)[-1]))
        order = np.argsort(-logp)[:3]
        assert [i for i, _ in top] == order.tolist() and top[0][0] == token
        np.testing.assert_allclose([v for _, v in top], logp[order], atol=1e-4)
        ids.append(token)
    with pytest.raises(ValueError, match="top_logprobs_num must be at most 3"):
        generate(engine, GenerateRequest(prompt, GREEDY, top_logprobs_num=4))


def test_stop_strings_cut_at_the_completing_token(engine):
    prompt = [11, 12, 13]
    [free] = generate(
        engine, GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=12))
    )
    text = LetterTokenizer.decode(free.output_ids)
    stop = text[5:7]
    cut = text.index(stop) + len(stop)  # one letter per token
    sp = SamplingParams(temperature=0.0, max_new_tokens=12, stop=(stop, "never!"))
    [c] = generate(engine, GenerateRequest(prompt, sp))
    assert c.output_ids == free.output_ids[:cut] and c.finish_reason == "stop"
    assert c.matched_stop == stop and len(c.logprobs) == cut
    no_tokenizer = JaxEngine.__new__(JaxEngine)
    no_tokenizer.__dict__.update(engine.__dict__, tokenizer=None)
    with pytest.raises(ValueError, match="tokenizer"):
        no_tokenizer.check(GenerateRequest(prompt, sp))


def test_out_of_range_values_are_bounded_not_packed(engine):
    """A budget past the context, a top-k past the vocabulary and stop ids no token has."""
    sp = SamplingParams(
        temperature=0.0,
        top_k=2**40,
        max_new_tokens=2**31,
        stop_token_ids=(2**31, 2**40, 10**6),
        seed=2**63 - 1,
    )
    [c] = generate(engine, GenerateRequest([1, 2, 3], sp))
    assert c.finish_reason == "length" and c.prompt_tokens + c.completion_tokens == MAX_LEN


def test_penalties_match_penalised_full_forwards(model, engine):
    rep, freq, pres = 1.8, 0.4, 0.3

    def penalize(logits, out):
        counts = np.bincount(out, minlength=len(logits)).astype(np.float64)
        seen = counts > 0
        logits = logits - freq * counts - pres * seen
        return np.where(seen, np.where(logits < 0, logits * rep, logits / rep), logits)

    prompt = [7, 7, 8]
    sp = SamplingParams(
        temperature=0.0,
        max_new_tokens=10,
        repetition_penalty=rep,
        frequency_penalty=freq,
        presence_penalty=pres,
    )
    [c, plain] = generate(engine, GenerateRequest(prompt, sp), GenerateRequest(prompt, GREEDY))
    tokens, logps = reference_greedy(model, prompt, 10, penalize)
    assert c.output_ids == tokens
    np.testing.assert_allclose(c.logprobs, logps, atol=1e-4)
    assert plain.output_ids == reference_greedy(model, prompt, 8)[0]  # its neighbour unaffected


def test_min_p_keeps_only_likely_tokens(model, engine):
    prompt = [2, 4, 6]
    sp = SamplingParams(temperature=1.0, min_p=0.5, max_new_tokens=6, seed=3)
    [c] = generate(engine, GenerateRequest(prompt, sp))
    ids = list(prompt)
    for token in c.output_ids:
        probs = np.asarray(jax.nn.softmax(full_logits(model, ids)[-1]))
        assert probs[token] >= 0.5 * probs.max() - 1e-6
        ids.append(token)


def test_cancelled_requests_free_their_slots(engine, monkeypatch):
    long = GenerateRequest([1, 2], SamplingParams(temperature=1.0, max_new_tokens=60, seed=1))

    gate = DecodeGate(engine, monkeypatch)

    async def go():
        task = asyncio.ensure_future(engine.generate([long] * 3))
        await wait_until(lambda: engine.running() >= 3, what="three requests in flight")
        task.cancel()
        gate.open()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(2000):
            if engine.running() == 0:
                return True
            await asyncio.sleep(0.005)
        return False

    assert asyncio.run(go())


@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_a_failing_request_fails_alone(engine, monkeypatch, where):
    """Four requests in flight, one of which makes its compiled call fail: three succeed."""
    poison = 250
    real = getattr(engine._steps, where)

    def broken(*args, **kwargs):
        ids = args[1] if where == "prefill" else args[2]  # prompts, or the fed tokens
        if where == "decode":
            ids = args[6]  # max_new per row: the poisoned request asks for 13
            if np.any(ids == 13):
                raise RuntimeError("poisoned decode")
        elif np.any(np.asarray(ids) == poison):
            raise RuntimeError("poisoned prefill")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine._steps, where, broken)
    good = [
        GenerateRequest([5, i + 3], SamplingParams(temperature=0.0, max_new_tokens=9))
        for i in range(3)
    ]
    bad = GenerateRequest([5, poison], SamplingParams(temperature=0.0, max_new_tokens=13))

    async def go():
        return await asyncio.gather(
            *(engine.generate([r]) for r in (good[0], bad, good[1], good[2])),
            return_exceptions=True,
        )

    results = asyncio.run(go())
    assert isinstance(results[1], RuntimeError) and "poisoned" in str(results[1])
    monkeypatch.setattr(engine._steps, where, real)
    alone = [generate(engine, r)[0] for r in good]
    for got, ref in zip([results[0], results[2], results[3]], alone):
        [completion] = got
        assert completion.output_ids == ref.output_ids and completion.completion_tokens == 9


def test_a_small_request_is_not_starved_by_a_big_batch(model):
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=2, max_seq_len=MAX_LEN, steps_per_call=4, min_prefill_len=MAX_LEN
        ),
    )
    finished = []
    big = [GenerateRequest([1, 2, i], SamplingParams(max_new_tokens=12, seed=i)) for i in range(10)]
    small = GenerateRequest([9, 9], SamplingParams(max_new_tokens=12, seed=0))

    async def go():
        async def run(name, requests):
            await engine.generate(requests)
            finished.append(name)

        first = asyncio.ensure_future(run("big", big))
        await asyncio.sleep(0)
        await run("small", [small])
        await first

    try:
        asyncio.run(go())
    finally:
        engine.close()
    assert finished == ["small", "big"]  # FIFO would finish the whole batch first


def test_streaming_gives_growing_prefixes_then_the_completion(engine):
    request = GenerateRequest([4, 5, 6], SamplingParams(temperature=0.0, max_new_tokens=10))

    async def go():
        return [c async for c in engine.stream(request)]

    updates = asyncio.run(go())
    *partial, final = updates
    assert partial and all(u.finish_reason is None for u in partial)
    assert (
        final.finish_reason == "length"
        and final.output_ids == generate(engine, request)[0].output_ids
    )
    for u in partial:
        assert final.output_ids[: len(u.output_ids)] == u.output_ids


def swapped(model, scale):
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: scale * x, state))


PROMPT = [8, 3, 8]
LONG = GenerateRequest(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=40))


def update_during_a_long_request(model, other, monkeypatch, **update):
    """A 40-token greedy request held in flight after 5 tokens while
    `update_weights(other, version=5, **update)` is queued; then the same request
    again on the new weights. Returns both completions."""
    engine = JaxEngine(
        model, JaxEngineConfig(max_batch_size=2, max_seq_len=MAX_LEN, steps_per_call=2)
    )
    gate = DecodeGate(engine, monkeypatch, allow=2)  # 1 + 2 * 2 tokens, then held

    async def go():
        task = asyncio.ensure_future(engine.generate([LONG]))
        await wait_until(lambda: gate.calls > 2, what="5 tokens generated")
        swap = asyncio.ensure_future(engine.update_weights(other, version=5, **update))
        await wait_until(lambda: bool(engine._swaps), what="the update queued")
        gate.open()
        await swap
        [in_flight] = await task
        [after] = await engine.generate([LONG])
        return in_flight, after

    try:
        return asyncio.run(go())
    finally:
        engine.close()


@pytest.mark.parametrize("abort", [False, True])
def test_a_weight_update_never_mixes_versions(model, monkeypatch, abort):
    """A long greedy request in flight when new weights arrive: every one of its tokens
    is from the old weights (waited for, or aborted), and it says which version."""
    other = swapped(model, -1.3)
    old, new = update_during_a_long_request(model, other, monkeypatch, abort_in_flight=abort)
    expected_old = reference_greedy(model, PROMPT, 40)[0]
    assert old.weight_version == 0 and new.weight_version == 5
    if abort:
        assert old.finish_reason == "abort" and 5 <= len(old.output_ids) < 40
        assert old.output_ids == expected_old[: len(old.output_ids)]
    else:
        assert old.finish_reason == "length" and old.output_ids == expected_old
    assert new.output_ids == reference_greedy(other, PROMPT, 40)[0]


def test_a_partial_weight_update_lands_mid_request_and_is_recorded(model, monkeypatch):
    """`partial=True`: the update lands between decode chunks, the request in flight
    keeps going on the new weights and its completion names both versions."""
    other = swapped(model, -1.3)
    straddled, after = update_during_a_long_request(model, other, monkeypatch, partial=True)
    expected_old = reference_greedy(model, PROMPT, 40)[0]
    assert straddled.finish_reason == "length" and len(straddled.output_ids) == 40
    assert (straddled.first_weight_version, straddled.weight_version) == (0, 5)
    assert straddled.output_ids[:5] == expected_old[:5]  # before the update
    assert straddled.output_ids != expected_old  # the new weights took over
    # A request admitted after the update is all new weights, and says one version.
    assert (after.first_weight_version, after.weight_version) == (None, 5)
    assert after.output_ids == reference_greedy(other, PROMPT, 40)[0]


def test_a_request_admitted_beside_a_straddling_row_leaves_it_its_slot(model, monkeypatch):
    """After a partial update lands, a new request is admitted while the straddling
    row decodes on: it takes another slot, and both complete (a request that lost its
    slot would never complete: asynchronous GRPO waited on it forever)."""
    engine = JaxEngine(
        model, JaxEngineConfig(max_batch_size=2, max_seq_len=MAX_LEN, steps_per_call=2)
    )
    gate = DecodeGate(engine, monkeypatch, allow=2)
    other = swapped(model, -1.3)
    late = GenerateRequest([5, 6], SamplingParams(temperature=0.0, max_new_tokens=4))

    async def go():
        first = asyncio.ensure_future(engine.generate([LONG]))
        await wait_until(lambda: gate.calls > 2, what="5 tokens generated")
        swap = asyncio.ensure_future(engine.update_weights(other, version=5, partial=True))
        await wait_until(lambda: bool(engine._swaps), what="the update queued")
        second = asyncio.ensure_future(engine.generate([late]))  # admitted after the swap
        await wait_until(lambda: len(engine._queue) == 1, what="the late request queued")
        gate.open()
        await swap
        return await asyncio.wait_for(asyncio.gather(first, second), timeout=60)

    try:
        [straddled], [after] = asyncio.run(go())
    finally:
        engine.close()
    assert (straddled.first_weight_version, straddled.weight_version) == (0, 5)
    assert straddled.finish_reason == "length" and len(straddled.output_ids) == 40
    assert (after.first_weight_version, after.weight_version) == (None, 5)
    assert after.output_ids == reference_greedy(other, [5, 6], 4)[0]


def test_partial_and_abort_in_flight_exclude_each_other(model):
    engine = JaxEngine(model, JaxEngineConfig(max_batch_size=2, max_seq_len=MAX_LEN))
    try:
        with pytest.raises(ValueError, match="exclude"):
            asyncio.run(engine.update_weights(model, version=1, partial=True, abort_in_flight=True))
    finally:
        engine.close()
