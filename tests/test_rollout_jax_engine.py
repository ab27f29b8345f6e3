"""JaxEngine against the model's own full forward pass, on the tiny Qwen3."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax.engine import (
    JaxEngine,
    JaxEngineConfig,
    bucket,
    cache_bucket,
    prefill_pad_tokens,
    prefill_rows,
)

MAX_LEN = 64


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
            min_cache_len=32,
            min_prefill_len=MAX_LEN,
        ),
    )  # few buckets, few compiles
    yield engine
    engine.close()


def generate(engine, *requests):
    return asyncio.run(engine.generate(list(requests)))


@nnx.jit
def _padded_forward(model, ids, segments):
    return model(ids, jnp.arange(ids.shape[1])[None], segment_ids=segments)[0]


def full_logits(model, ids):
    """Logits [len(ids), V] of one uncached forward over `ids` (padded: one compile)."""
    padded = np.zeros((1, MAX_LEN), np.int32)
    padded[0, : len(ids)] = ids
    return _padded_forward(
        model, padded, (padded * 0 + (np.arange(MAX_LEN) < len(ids))).astype(np.int32)
    )[: len(ids)]


def assert_greedy_matches_full_forward(model, prompt, completion):
    """Each greedy token is the full forward's argmax; its logprob, log_softmax there."""
    ids = list(prompt)
    for token, logprob in zip(completion.output_ids, completion.logprobs):
        logits = full_logits(model, ids)[-1]
        assert token == int(jnp.argmax(logits))
        assert logprob == pytest.approx(float(jax.nn.log_softmax(logits)[token]), abs=1e-4)
        ids.append(token)


def test_greedy_equals_stepwise_argmax(model, engine):
    prompt = [3, 14, 15, 92, 6]
    [c] = generate(
        engine, GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=9))
    )
    assert c.finish_reason == "length" and c.completion_tokens == 9 and c.prompt_tokens == 5
    assert_greedy_matches_full_forward(model, prompt, c)


@pytest.mark.parametrize("temperature, top_p, top_k", [(0.7, 1.0, -1), (1.3, 0.9, 20)])
def test_logprobs_are_temperature_scaled_log_softmax(model, engine, temperature, top_p, top_k):
    prompt = [5, 6, 7]
    sp = SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=7, seed=11
    )
    [c] = generate(engine, GenerateRequest(prompt, sp))
    logits = full_logits(model, prompt + c.output_ids)[len(prompt) - 1 : -1]
    expected = jax.nn.log_softmax(logits / temperature, axis=-1)
    expected = expected[jnp.arange(len(c.output_ids)), jnp.array(c.output_ids)]
    np.testing.assert_allclose(c.logprobs, expected, atol=1e-4)
    if top_k > 0:  # every sampled token lies in the top-k of its step
        ranks = jnp.sum(
            logits > logits[jnp.arange(len(c.output_ids)), jnp.array(c.output_ids)][:, None], -1
        )
        assert int(ranks.max()) < top_k


def test_stop_token_ends_generation_and_is_included(engine):
    prompt = [9, 8, 7, 6]
    [free] = generate(
        engine, GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=8))
    )
    stop = free.output_ids[3]
    cut = free.output_ids.index(stop) + 1
    [c] = generate(
        engine,
        GenerateRequest(
            prompt, SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(stop, 255))
        ),
    )
    assert c.output_ids == free.output_ids[:cut] and c.finish_reason == "stop"
    assert len(c.logprobs) == cut == c.completion_tokens


def test_same_seed_same_tokens_alone_or_in_a_changing_batch(engine):
    """Requests arrive at different times, share slots as they free, and match their solo runs."""
    rng = np.random.default_rng(0)
    requests = [
        GenerateRequest(
            rng.integers(3, 250, size=n).tolist(),
            SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=m, seed=s),
        )
        for s, (n, m) in enumerate([(3, 13), (11, 5), (20, 9), (6, 3), (2, 11), (17, 7)])
    ]
    alone = [generate(engine, r)[0] for r in requests]

    async def staggered():
        async def submit(i, r):
            await asyncio.sleep(0.05 * i)
            return (await engine.generate([r]))[0]

        return await asyncio.gather(*(submit(i, r) for i, r in enumerate(requests)))

    together = asyncio.run(staggered())  # 6 requests, 4 slots: later ones wait for a free slot
    for a, t in zip(alone, together):
        assert t.output_ids == a.output_ids
        np.testing.assert_allclose(t.logprobs, a.logprobs, atol=1e-5)
    batched = generate(engine, *requests)
    assert [c.output_ids for c in batched] == [a.output_ids for a in alone]


def test_context_end_is_length_and_bad_requests_raise(engine):
    [c] = generate(
        engine, GenerateRequest([1] * (MAX_LEN - 3), SamplingParams(max_new_tokens=50, seed=1))
    )
    assert c.finish_reason == "length" and c.prompt_tokens + c.completion_tokens == MAX_LEN
    with pytest.raises(ValueError, match="vocabulary"):
        generate(engine, GenerateRequest([1, 256]))
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(engine, GenerateRequest([1] * MAX_LEN))


def test_compiles_are_bounded(engine):
    """One trace per shape bucket, never again (the cache holds 32, 48 or 64 slots;
    decode calls with one or two rows live run in the 1- or 2-row bucket)."""
    counts = dict(engine.compile_counts)
    allowed = {f"decode(cache={n})" for n in (32, 48, 64)}
    allowed |= {f"decode(cache={n}, rows={r})" for n in (32, 48, 64) for r in (1, 2)}
    allowed |= {f"resize({a}->{b})" for a in (32, 48, 64) for b in (32, 48, 64)}
    # Admissions of one to four rows all pad to four (min_prefill_rows=8, capped).
    allowed |= {
        "prefill(rows=4, len=64)",
        "insert(rows=4, len=64, cache=64)",
        "prefill_cached(rows=4, len=64, cache=64)",
    }  # shared prompts reuse
    assert set(counts) <= allowed
    decoded = {int(k.split("cache=")[1].split(",")[0].rstrip(")")) for k in counts if "decode" in k}
    assert {32, 64} <= decoded  # cache lengths decoded at, at any row count
    assert all(v == 1 for v in counts.values())


def test_update_weights_swaps_without_recompiling(model, engine):
    prompt = [4, 4, 4]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    [before] = generate(engine, GenerateRequest(prompt, greedy))
    compiles = dict(engine.compile_counts)
    graphdef, state = nnx.split(model)
    other = nnx.merge(graphdef, jax.tree.map(lambda x: -1.5 * x, state))
    asyncio.run(engine.update_weights(other, version=7))
    [after] = generate(engine, GenerateRequest(prompt, greedy))
    assert engine.weight_version == 7 and dict(engine.compile_counts) == compiles
    assert after.output_ids != before.output_ids
    assert after.output_ids[0] == int(jnp.argmax(full_logits(other, prompt)[-1]))
    asyncio.run(engine.update_weights(state, version=8))
    assert generate(engine, GenerateRequest(prompt, greedy))[0].output_ids == before.output_ids
    wrong = jax.tree.map(lambda x: x[..., :1], state)
    with pytest.raises(ValueError, match="update_weights"):
        asyncio.run(engine.update_weights(wrong, version=9))


def test_buckets():
    assert [bucket(n, 16, 100) for n in (1, 16, 17, 64, 65, 1000)] == [16, 16, 32, 64, 100, 100]
    sizes = [cache_bucket(n, 16, 1000) for n in (1, 16, 17, 24, 25, 33, 49, 100, 700, 900)]
    assert sizes == [16, 16, 24, 24, 32, 48, 64, 128, 768, 1000]


def test_prefill_rows_keep_the_row_floor_only_within_the_token_budget():
    # Within the budget: the old floor (min_rows=8, capped at the batch).
    assert [prefill_rows(n, 128, 8, 16, 1024) for n in (1, 4, 8, 9, 16)] == [8, 8, 8, 16, 16]
    assert prefill_rows(2, 64, 8, 4, 1024) == 4
    # Past it: the power of two >= n, doubled toward the floor while within the budget.
    assert [prefill_rows(n, 128, 8, 16, 127) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]
    assert [prefill_rows(n, 384, 8, 16, 2048) for n in (1, 2, 3, 6)] == [4, 4, 4, 8]
    # Never more rows than the cap, never fewer than needed (a long scoring batch).
    assert prefill_rows(20, 128, 8, 20, 127) == 20
    # A small fixed set of shapes: powers of two up to the batch.
    shapes = {
        prefill_rows(n, t, 8, 16, budget)
        for n in range(1, 17)
        for t in (128, 192, 256, 384, 512, 768, 1024)
        for budget in (0, 127, 1024, 2543, 10**6)
    }
    assert shapes == {1, 2, 4, 8, 16}


def test_prefill_pad_tokens_keep_the_floor_for_small_models_only():
    # The demo model pads 8 rows of 128 tokens (a padded row is cheap there) ...
    assert prefill_pad_tokens(Qwen3Config.preset("demo")) >= 8 * 128
    assert prefill_pad_tokens(Qwen3Config.preset("tiny")) >= 16 * 1024
    # ... Qwen3-0.6B's dimensions with 4 layers not even one padded row of 128.
    big = Qwen3Config.preset("qwen3_0p6b", num_hidden_layers=4)
    assert prefill_pad_tokens(big) < 128


def test_refill_past_the_token_budget_prefills_only_its_rows(model):
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=4,
            max_seq_len=32,
            steps_per_call=4,
            min_prefill_len=32,
            prefill_pad_tokens=0,
        ),
    )
    try:
        [c] = generate(engine, GenerateRequest([3, 1, 4], SamplingParams(max_new_tokens=2)))
    finally:
        engine.close()
    assert len(c.output_ids) == 2
    assert [k for k in engine.compile_counts if k.startswith("prefill")] == [
        "prefill(rows=1, len=32)"
    ]


def test_waiting_request_ends_the_decode_chunk_when_a_row_finishes(model):
    """Two slots, three requests: the third waits, and with `admit_mid_chunk` the
    first decode call ends at the step where the short request finishes (not when
    the long one does); the tokens are the same either way."""
    requests = [
        GenerateRequest([3, 1, 4], SamplingParams(max_new_tokens=2, seed=1)),
        GenerateRequest([1, 5, 9], SamplingParams(max_new_tokens=12, seed=2)),
        GenerateRequest([2, 6, 5], SamplingParams(max_new_tokens=3, seed=3)),
    ]
    outputs, steps = {}, {}
    for mid_chunk in (True, False):
        engine = JaxEngine(
            model,
            JaxEngineConfig(
                max_batch_size=2,
                max_seq_len=32,
                steps_per_call=16,
                min_prefill_len=32,
                admit_mid_chunk=mid_chunk,
            ),
        )
        real, ran = engine._steps.decode, []

        def counted(*args, real=real, ran=ran, **kwargs):
            result = real(*args, **kwargs)
            ran.append(int((np.asarray(result[1]) >= 0).any(axis=0).sum()))
            return result

        engine._steps.decode = counted
        try:
            completions = generate(engine, *requests)
        finally:
            engine.close()
        outputs[mid_chunk] = [c.output_ids for c in completions]
        steps[mid_chunk] = ran
    assert [len(o) for o in outputs[True]] == [2, 12, 3]
    assert outputs[True] == outputs[False]
    assert steps[True][0] == 1 and steps[False][0] == 11


def test_sharded_parameters_give_the_same_tokens(model):
    from orchestra_jax.parallel.mesh import make_mesh, shard_model

    sharded = shard_model(nnx.merge(*nnx.split(model)), make_mesh(fsdp=4, tensor=2))
    assert len(jax.tree.leaves(nnx.state(sharded))[0].sharding.device_set) == 8
    engine = JaxEngine(sharded, JaxEngineConfig(max_batch_size=2, max_seq_len=32, steps_per_call=4))
    try:
        prompt = [3, 1, 4, 1, 5]
        [c] = generate(
            engine, GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=4))
        )
    finally:
        engine.close()
    ids = list(prompt)
    for token in c.output_ids:
        assert token == int(jnp.argmax(full_logits(model, ids)[-1]))
        ids.append(token)


def test_engine_error_fails_the_batch_and_the_engine_recovers(engine, monkeypatch):
    decode = engine._steps.decode

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine._steps, "decode", broken)
    with pytest.raises(RuntimeError, match="device lost"):
        generate(engine, GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=5, seed=0)))
    monkeypatch.setattr(engine._steps, "decode", decode)
    [c] = generate(engine, GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=5, seed=0)))
    assert c.completion_tokens == 5 and asyncio.run(engine.health())


def test_tied_head_and_scanned_layers_decode_greedily():
    """The demo model's tied LM head, and stacked (scan_layers) weights, in the engine."""
    tied = Qwen3ForCausalLM(
        Qwen3Config.preset("tiny", tie_word_embeddings=True, scan_layers=True), rngs=nnx.Rngs(1)
    )
    engine = JaxEngine(tied, JaxEngineConfig(max_batch_size=2, max_seq_len=32, steps_per_call=4))
    try:
        prompt = [2, 7, 1, 8]
        [c] = generate(
            engine, GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=5))
        )
    finally:
        engine.close()
    assert_greedy_matches_full_forward(tied, prompt, c)
