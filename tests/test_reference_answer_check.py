"""The training answer check: `qwen3_8b` settles an answer as the release's `call_tool`
does (`generation_quick3.py` 431-440, ported verbatim below), lower-case exact match
and then the judge; `qwen3_8b_project` keeps the normalised match."""

import asyncio

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.rewards.judge import grade
from orchestra_jax.tools.experts.client import ExpertReply
from orchestra_jax.training import builders, experiment_config


def release_correctness(pred, answer, judge_says):
    """`generation_quick3.py` 431-447, verbatim but for the gpt-5 call (`judge_says`)."""
    if pred.strip() == "" or len(pred.split(" ")) > 500:
        correctness = False
    elif pred.strip().lower() == answer.strip().lower():
        correctness = True
    else:
        eval_result = judge_says
        eval_result = eval_result.split("<correct>")[-1].split("</correct>")[0]
        if eval_result.lower() == "true":
            correctness = True
        else:
            correctness = False
    return correctness


class Task:
    id, question, answer, answer_type = (
        "beatles",
        "Who recorded Abbey Road?",
        "the beatles",
        "judge",
    )


class SaysFalse:
    """A judge endpoint that always answers False, counting its calls."""

    def __init__(self):
        self.calls = 0

    async def complete(self, messages, *, max_tokens, temperature):
        self.calls += 1
        return ExpertReply("<correct>False</correct>", 10, 3, 0.1)


def judge_of(variant, monkeypatch):
    config = grpo_hle.get_config(variant)
    monkeypatch.setattr(builders, "probe_endpoint", lambda *a, **k: None)
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    judge = builders.build_judge(config)
    client = SaysFalse()
    judge.client = client
    return judge, client


PREDICTIONS = ["The Beatles.", "the beatles", "  THE BEATLES ", "The  Beatles", "Beatles", ""]


@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_qwen3_8b_grades_as_the_release(prediction, monkeypatch):
    judge, client = judge_of("qwen3_8b", monkeypatch)
    verdict = asyncio.run(grade(prediction, Task(), judge=judge))
    expected = release_correctness(prediction, Task.answer, "<correct>False</correct>")
    assert verdict.correct == expected
    # The judge is asked exactly where the release asks gpt-5.
    asked = prediction.strip() != "" and prediction.strip().lower() != Task.answer
    assert client.calls == int(asked)


def test_the_project_settles_the_beatles_without_the_judge(monkeypatch):
    project, _ = judge_of("qwen3_8b_project", monkeypatch)
    reference, _ = judge_of("qwen3_8b", monkeypatch)
    paid = [
        asyncio.run(grade("The Beatles.", Task(), judge=j)).correct for j in (project, reference)
    ]
    assert paid == [True, False]


def test_an_unknown_answer_match_is_a_config_error():
    config = grpo_hle.get_config("qwen3_8b")
    config.reward.judge.answer_match = "fuzzy"
    assert any("reward.judge.answer_match" in e for e in experiment_config.problems(config))
