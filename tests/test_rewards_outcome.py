"""Outcome checks: normalised match, numbers, math-verify, the LLM judge protocol."""

import asyncio
import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestra_jax.rewards import judge as judge_lib
from orchestra_jax.rewards.outcome import (
    exact_match,
    is_correct,
    is_valid_answer,
    normalize_answer,
    numeric_match,
    outcome_rewards,
    unboxed,
)
from orchestra_jax.tasks import Task
from tests.linear_time import LINEAR_BOUND, growth


def task(answer, answer_type="exact"):
    return Task(id="t", question="q?", answer=answer, answer_type=answer_type)


BOXED = re.compile(r"\\boxed\{(.*)\}", re.DOTALL)  # the rule: first `\boxed{` to the last `}`


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["\\boxed{", "{", "}", "a", " ", "\n", "\\"])).map("".join))
def test_boxed_answers_unwrap_from_the_first_boxed_to_the_last_brace(text):
    match = BOXED.search(text)
    assert unboxed(text) == (match.group(1) if match else text)


@pytest.mark.parametrize("piece", ["\\boxed{", "\\boxed{a}{"])
def test_answer_normalisation_time_is_linear(piece):
    make = lambda n: piece * n  # noqa: E731 - a model may repeat one token until its budget ends
    assert growth(normalize_answer, make, 500) < LINEAR_BOUND


def test_normalisation_and_exact_match():
    assert normalize_answer("  The  Eiffel-Tower! ") == "eiffeltower"
    assert normalize_answer(r"\boxed{Paris}") == "paris"
    assert is_correct("the paris.", task("Paris"))
    assert not is_correct("Lyon", task("Paris"))
    assert exact_match("An Apple", "apple")


@pytest.mark.parametrize("prediction", ["", "   ", None, "word " * 501])
def test_empty_and_overlong_answers_are_wrong(prediction):
    assert not is_valid_answer(prediction)
    assert not is_correct(prediction, task("word"))
    assert not is_correct(prediction, task("1", "numeric"))


def test_exactly_500_words_is_still_valid():
    assert is_valid_answer("w " * 500)


def test_numeric_tolerance():
    assert numeric_match("The answer is 1,234.5 dollars", "1234.5")
    assert numeric_match("$0.30000001", "0.3")
    assert not numeric_match("0.31", "0.3")
    assert not numeric_match("no number", "3")
    assert is_correct("-2e3", task("-2000", "numeric"))


def test_an_integer_reference_needs_the_exact_integer():
    # Within 1e-4 of each other, but a different count or computation result.
    assert not numeric_match("27512346", "27512345")
    assert not numeric_match("27,512,355 members", 27512345)
    assert numeric_match("Final answer: 27,512,345.", "27512345")
    assert numeric_match("2000.0", "2,000") and not numeric_match("2000.5", "2000")
    big = "123456789012345678901"  # Beyond float precision: still compared exactly.
    assert numeric_match(big, big) and not numeric_match(str(int(big) + 1), big)
    assert numeric_match("0.30000001", "0.3")  # Non-integer references keep the tolerance.


def test_math_verify_equivalence():
    assert is_correct(r"\boxed{\frac{1}{2}}", task("0.5", "math"))
    assert is_correct("x(x+2)", task("x^2+2x", "math"))
    assert not is_correct("1/3", task("0.5", "math"))


def test_judge_tasks_need_a_judge_and_unknown_types_fail():
    with pytest.raises(ValueError, match="judge"):
        is_correct("anything", task("a", "judge"))
    bad = dataclasses.replace(task("a"))
    object.__setattr__(bad, "answer_type", "fuzzy")
    with pytest.raises(ValueError, match="fuzzy"):
        is_correct("a", bad)


def test_outcome_reward_is_one_for_correct():
    assert outcome_rewards([{}, {}], [True, False]).tolist() == [1.0, 0.0]


@dataclasses.dataclass
class Reply:
    text: str
    prompt_tokens: int = 1000
    completion_tokens: int = 100
    latency_s: float = 0.5


class FakeExpert:
    def __init__(self, texts):
        self.texts, self.calls = list(texts), []

    async def complete(self, messages, *, max_tokens, temperature):
        self.calls.append(messages)
        return Reply(self.texts.pop(0))


def test_parse_verdict_takes_the_last_tag():
    assert judge_lib.parse_verdict("hmm <correct>False</correct> no: <correct> true </correct>")
    assert judge_lib.parse_verdict("<correct>False</correct>") is False
    assert judge_lib.parse_verdict("I think yes") is None


def test_llm_judge_caches_and_reports_cost_separately(tmp_path):
    expert = FakeExpert(["Same. <correct>True</correct>", "no tag", "<correct>False</correct>"])
    cache = judge_lib.JudgeCache(tmp_path / "judge.jsonl")
    judge = judge_lib.LLMJudge(expert, cache, price_in=1.0, price_out=10.0)
    t = task("Marie Curie", "judge")

    first = asyncio.run(judge_lib.grade("Curie", t, judge=judge))
    assert first.correct and not first.cached
    assert first.cost_usd == pytest.approx((1000 * 1.0 + 100 * 10.0) / 1e6)
    again = asyncio.run(judge_lib.grade("Curie", t, judge=judge))
    assert again.correct and again.cached and again.cost_usd == 0.0
    assert len(expert.calls) == 1 and "Marie Curie" in expert.calls[0][0]["content"]

    untagged = asyncio.run(judge_lib.grade("Pierre", t, judge=judge))
    assert not untagged.correct and untagged.parse_failed  # not cached: asked again next time
    assert not asyncio.run(judge_lib.grade("Pierre", t, judge=judge)).correct
    assert judge.stats()["judge/calls"] == 3 and judge.stats()["judge/cache_hits"] == 1
    assert judge.stats()["judge/cost_usd"] == pytest.approx(3 * 0.002)

    reloaded = judge_lib.JudgeCache(tmp_path / "judge.jsonl")  # a resumed run pays nothing
    assert len(reloaded) == 2


def test_judge_cache_drops_a_line_cut_by_a_kill_and_goes_on(tmp_path, caplog):
    path = tmp_path / "judge.jsonl"
    cache = judge_lib.JudgeCache(path)
    cache["a"], cache["b"] = True, False
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"key": "c", "corr')  # the run was killed while writing
    with caplog.at_level("WARNING", logger="orchestra_jax.rewards.judge"):
        resumed = judge_lib.JudgeCache(path)
    assert dict(resumed) == {"a": True, "b": False}
    assert f"{path}: line 3 was cut off" in caplog.text
    resumed["c"] = True  # appends start on a line of their own
    assert dict(judge_lib.JudgeCache(path)) == {"a": True, "b": False, "c": True}


def test_judge_cache_keeps_a_whole_last_verdict_without_its_line_end(tmp_path):
    path = tmp_path / "judge.jsonl"
    path.write_text('{"key": "a", "correct": true}', encoding="utf-8")
    cache = judge_lib.JudgeCache(path)
    cache["b"] = False
    assert dict(judge_lib.JudgeCache(path)) == {"a": True, "b": False}


@pytest.mark.parametrize(
    "bad", ['{"key": "b", "corr', "not json", '{"key": "b"}', '{"key": 1, "correct": true}']
)
def test_judge_cache_names_the_file_and_line_of_a_damaged_line(tmp_path, bad):
    path = tmp_path / "judge.jsonl"
    path.write_text(f'{{"key": "a", "correct": true}}\n{bad}\n{{"key": "c", "correct": false}}\n')
    with pytest.raises(judge_lib.JudgeCacheError, match=f"{path}, line 2: not a judge verdict"):
        judge_lib.JudgeCache(path)


def test_grade_skips_the_judge_for_invalid_answers_and_rule_types():
    judge = judge_lib.LLMJudge(FakeExpert([]), None)
    assert not asyncio.run(judge_lib.grade("", task("x", "judge"), judge=judge)).correct
    assert asyncio.run(judge_lib.grade("4", task("4.0", "numeric"), judge=judge)).correct
    with pytest.raises(ValueError, match="no judge"):
        asyncio.run(judge_lib.grade("x", task("x", "judge")))
