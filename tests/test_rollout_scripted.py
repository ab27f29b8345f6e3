"""The rollout data types and the scripted engine."""

import asyncio

import pytest

from orchestra_jax.rollout.engine import (
    Completion,
    GenerateRequest,
    RolloutEngine,
    SamplingParams,
    make_engine,
)
from orchestra_jax.rollout.scripted import ScriptedEngine


def test_sampling_params_validate():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=-1)
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5)
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0.0)
    with pytest.raises(ValueError, match="finite"):
        SamplingParams(frequency_penalty=float("nan"))
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=("",))
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
    assert SamplingParams(stop="x").stop == ("x",) and SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="input_ids"):
        GenerateRequest([])


def test_completion_checks_lengths_and_reason():
    with pytest.raises(ValueError, match="logprobs"):
        Completion([1, 2], [0.0], "stop", 1, 2, 0.0)
    with pytest.raises(ValueError, match="finish_reason"):
        Completion([1], [0.0], "eos", 1, 1, 0.0)


def test_scripted_policy_applies_stop_and_length():
    engine = make_engine("scripted", policy=lambda ids, req: [ids[-1] + 1, 9, 5, 6])
    assert isinstance(engine, RolloutEngine)
    reqs = [
        GenerateRequest([1, 2], SamplingParams(stop_token_ids=(9,))),
        GenerateRequest([4], SamplingParams(max_new_tokens=2)),
        GenerateRequest([4], SamplingParams(max_new_tokens=10)),
    ]
    stop, length, ran_out = asyncio.run(engine.generate(reqs))
    assert (stop.output_ids, stop.finish_reason) == ([3, 9], "stop")
    assert (length.output_ids, length.finish_reason) == ([5, 9], "length")
    assert (ran_out.output_ids, ran_out.finish_reason) == ([5, 9, 5, 6], "stop")
    assert stop.prompt_tokens == 2 and stop.completion_tokens == 2
    assert stop.logprobs == [0.0, 0.0]
    assert engine.requests == reqs


def test_scripted_list_with_logprobs_and_weights():
    engine = ScriptedEngine([([1, 2], [-0.5, -0.25]), [3]])
    first, second = asyncio.run(engine.generate([GenerateRequest([0]), GenerateRequest([0])]))
    assert first.logprobs == [-0.5, -0.25] and second.output_ids == [3]
    with pytest.raises(RuntimeError, match="ran out"):
        asyncio.run(engine.generate([GenerateRequest([0])]))
    asyncio.run(engine.update_weights({"w": 1}, version=3))
    assert engine.weight_versions == [3] and asyncio.run(engine.health())


def test_make_engine_unknown_name():
    with pytest.raises(ValueError, match="unknown rollout engine"):
        make_engine("trt")
