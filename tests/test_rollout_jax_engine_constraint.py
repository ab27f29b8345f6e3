"""JaxEngine following a token constraint (`GenerateRequest.constraint`), on the tiny Qwen3.

The automaton here alternates: the first token (sampled at prefill) and every
other one after it are free; the tokens between must be one of a few ids, the
set depending on the free token before them. The tests check that every
request keeps to it (sampled, greedy, truncated, with row buckets, beside
unconstrained requests), that the reported logprobs are the unrestricted
distribution's (what the learner recomputes), that a greedy row takes its most
likely allowed token, and that unconstrained requests are unchanged by a
constrained neighbour.
"""

import asyncio

import jax
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.rollout.token_constraint import TokenConstraint

VOCAB = 256
# After an even free token: {3, 4, 5}; after an odd one: {200}.
EVEN, ODD = (3, 4, 5), (200,)


def alternating() -> TokenConstraint:
    """States 0 (free, start), 1 (after an even token), 2 (after an odd one)."""
    table = np.full((3, VOCAB), -1, np.int32)
    table[0, 0::2], table[0, 1::2] = 1, 2
    table[1, list(EVEN)] = 0
    table[2, list(ODD)] = 0
    return TokenConstraint(table, start=0, name="alternating")


def obeys(ids) -> bool:
    for i in range(1, len(ids), 2):
        allowed = EVEN if ids[i - 1] % 2 == 0 else ODD
        if ids[i] not in allowed:
            return False
    return True


@pytest.fixture(scope="module")
def model():
    return Qwen3ForCausalLM(Qwen3Config.preset("tiny"), rngs=nnx.Rngs(0))


def engine_for(model, **config):
    return JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=8, max_seq_len=96, steps_per_call=4, min_cache_len=96, **config
        ),
    )


def run(engine, requests):
    async def go():
        return await asyncio.gather(*(engine.generate([r]) for r in requests))

    try:
        return [c for [c] in asyncio.run(go())]
    finally:
        engine.close()


def requests(constraint, n=10, **sampling):
    rng = np.random.default_rng(0)
    return [
        GenerateRequest(
            input_ids=rng.integers(0, VOCAB, size=int(rng.integers(2, 30))).tolist(),
            sampling=SamplingParams(
                max_new_tokens=int(rng.integers(8, 30)), seed=100 + i, **sampling
            ),
            constraint=constraint,
        )
        for i in range(n)
    ]


def unrestricted_logprobs(model, prompt, output, temperature):
    """log_softmax(logits / T) of each generated token, from one forward pass."""
    ids = np.asarray([prompt + output], np.int32)
    positions = np.arange(ids.shape[1])[None]
    logits = np.asarray(model(ids, positions)[0], np.float32)
    scale = temperature if temperature > 0 else 1.0
    logp = jax.nn.log_softmax(logits / scale, axis=-1)
    n = len(prompt)
    return np.asarray([logp[n - 1 + k, t] for k, t in enumerate(output)])


@pytest.mark.parametrize(
    "sampling, buckets",
    [
        (dict(temperature=1.0), (4, 2, 1)),
        (dict(temperature=1.0), ()),
        (dict(temperature=0.7, top_p=0.9, top_k=50), (4, 2, 1)),
        (dict(temperature=1.0, min_p=0.05), ()),
        (dict(temperature=0.0), (4, 2, 1)),
    ],
    ids=["sampled-row-buckets", "sampled-full-rows", "top-p-k", "min-p", "greedy"],
)
def test_every_request_keeps_to_its_constraint(model, sampling, buckets):
    outs = run(engine_for(model, decode_row_buckets=buckets), requests(alternating(), **sampling))
    for c in outs:
        assert obeys(c.output_ids), c.output_ids
        assert len(c.output_ids) >= 3


def test_a_constraint_over_fewer_ids_than_the_model(model):
    """Ids past the table keep a free state and are refused in a constrained one."""
    short = alternating()
    short = TokenConstraint(short.next_state[:, :250].copy(), start=0, name="short")
    outs = run(engine_for(model), requests(short, temperature=1.0))
    assert all(short.allows(c.output_ids) for c in outs)
    assert any(t >= 250 for c in outs for t in c.output_ids)  # the rule was exercised


def test_logprobs_are_the_unrestricted_distributions(model):
    reqs = requests(alternating(), n=4, temperature=0.8)
    outs = run(engine_for(model), reqs)
    for r, c in zip(reqs, outs):
        expected = unrestricted_logprobs(model, r.input_ids, c.output_ids, 0.8)
        np.testing.assert_allclose(c.logprobs, expected, atol=2e-4)
        # The constrained tokens are unlikely under the unrestricted model.
        assert min(c.logprobs[1::2]) < np.log(0.1)


def test_greedy_takes_the_most_likely_allowed_token(model):
    reqs = requests(alternating(), n=4, temperature=0.0)
    outs = run(engine_for(model), reqs)
    for r, c in zip(reqs, outs):
        ids = np.asarray([r.input_ids + c.output_ids], np.int32)
        logits = np.asarray(model(ids, np.arange(ids.shape[1])[None])[0], np.float32)
        n = len(r.input_ids)
        for k, t in enumerate(c.output_ids[1:], start=1):
            row = logits[n - 1 + k]
            if k % 2 == 0:
                assert t == int(np.argmax(row))
            else:
                allowed = list(EVEN if c.output_ids[k - 1] % 2 == 0 else ODD)
                assert t == allowed[int(np.argmax(row[allowed]))]


def test_unconstrained_neighbours_are_unchanged(model):
    free = requests(None, n=6, temperature=1.0)
    alone = run(engine_for(model), free)
    constrained = requests(alternating(), n=6, temperature=1.0)
    mixed = run(engine_for(model), [x for pair in zip(free, constrained) for x in pair])
    for a, b in zip(alone, mixed[0::2]):
        assert a.output_ids == b.output_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
    assert all(obeys(c.output_ids) for c in mixed[1::2])
    # Without the constraint, the same seeds leave it (so the test can fail).
    assert not all(obeys(c.output_ids) for c in alone)


def test_a_constraint_of_another_vocabulary_is_refused(model):
    table = np.zeros((1, VOCAB + 1), np.int32)
    request = GenerateRequest(input_ids=[1, 2], constraint=TokenConstraint(table, 0))
    engine = engine_for(model)
    try:
        with pytest.raises(ValueError, match="covers 257 token ids, more than the model's 256"):
            engine.check(request)
    finally:
        engine.close()


def test_tables_that_could_strand_a_row_are_refused():
    table = np.zeros((2, 4), np.int32)
    table[0, 1] = 1
    table[1] = -1
    with pytest.raises(ValueError, match=r"states \[1\] allow no token"):
        TokenConstraint(table, start=0)
    table[0, 2] = -1
    with pytest.raises(ValueError, match="start state must allow every token"):
        TokenConstraint(table, start=0)
