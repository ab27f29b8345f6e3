"""The preference-axis report on hand-built episodes: the expected table and verdicts."""

from __future__ import annotations

import dataclasses

import pytest

from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.eval import preference_axis as pa
from tests.trajectory_helpers import graded_episode

COST_HEAVY = pa.PREFERENCE_VECTORS["cost_heavy"]
ACCURACY_HEAVY = pa.PREFERENCE_VECTORS["accuracy_heavy"]


@dataclasses.dataclass(frozen=True)
class _Alias:
    tool: str
    backend: str


class _Config:
    """The two answer models every task offers: answer-1 the big one, answer-2 the small."""

    ALIASES = {"answer-1": _Alias("answer", "big"), "answer-2": _Alias("answer", "small")}

    def alias(self, name: str) -> _Alias:
        return self.ALIASES[name]


CONFIGS = {task: _Config() for task in "abc"}


def _ep(task: str, model: str, cost: float, correct: bool, preference) -> Trajectory:
    return graded_episode(
        task,
        finish_reason="answer",
        tool_call_counts={f"tool:{model}": 1},
        cost_usd=cost,
        latency_s=10.0,
        correct=correct,
        preference=dict(preference),
    )


def _episodes(plays, preference):
    return [_ep(task, model, cost, ok, preference) for task, model, cost, ok in plays]


# The warm start plays the same models whatever the preference; GRPO moves every
# task to the small model when asked for low cost.
WARM_START = [
    ("a", "answer-1", 0.010, True),
    ("b", "answer-1", 0.012, True),
    ("c", "answer-2", 0.002, False),
]
GRPO_ACCURATE = [
    ("a", "answer-1", 0.010, True),
    ("b", "answer-1", 0.012, True),
    ("c", "answer-1", 0.011, True),
]
GRPO_CHEAP = [
    ("a", "answer-2", 0.001, True),
    ("b", "answer-2", 0.002, True),
    ("c", "answer-2", 0.001, False),
]


def _all_episodes():
    return {
        "warm_start": {
            "cost_heavy": _episodes(WARM_START, COST_HEAVY),
            "accuracy_heavy": _episodes(WARM_START, ACCURACY_HEAVY),
        },
        "grpo": {
            "cost_heavy": _episodes(GRPO_CHEAP, COST_HEAVY),
            "accuracy_heavy": _episodes(GRPO_ACCURATE, ACCURACY_HEAVY),
        },
    }


def _report(**kwargs):
    return pa.build_report(_all_episodes(), CONFIGS, cost_scale=0.02, latency_scale=120.0, **kwargs)


def test_expected_table():
    # Preference scores, cost scale $0.02, no latency weight: warm start under
    # cost_heavy (1 − 0.010/0.02, 1 − 0.012/0.02, wrong) = (0.5, 0.4, 0) → 0.3;
    # GRPO under cost_heavy (0.95, 0.9, wrong) → 0.617; under accuracy_heavy the
    # score is the accuracy.
    assert pa.to_markdown(_report()).splitlines()[:6] == [
        "| policy | preference | models called | accuracy | cost (USD) | preference score |",
        "|---|---|---|---|---|---|",
        "| warm_start | cost_heavy | answer/big 2, answer/small 1 | 0.667 | 0.0080 | 0.300 |",
        "| warm_start | accuracy_heavy | answer/big 2, answer/small 1 | 0.667 | 0.0080 | 0.667 |",
        "| grpo | cost_heavy | answer/small 3 | 0.667 | 0.0013 | 0.617 |",
        "| grpo | accuracy_heavy | answer/big 3 | 1.000 | 0.0110 | 1.000 |",
    ]


def test_savings_and_verdict_computed():
    report = _report()
    by_policy = {s.policy: s for s in report.savings}
    # GRPO saves (0.009, 0.010, 0.010) a task; the warm start nothing.
    assert by_policy["grpo"].cost_saved_usd == pytest.approx(0.029 / 3)
    assert by_policy["grpo"].stderr_usd == pytest.approx(0.0005773503 / 3**0.5)
    assert by_policy["grpo"].follows
    assert by_policy["warm_start"].cost_saved_usd == pytest.approx(0.0)
    assert not by_policy["warm_start"].follows
    v = report.verdict
    assert v.difference_usd == pytest.approx(0.029 / 3)
    assert v.text.startswith("grpo follows the stated preference better than warm_start:")


def test_verdict_says_less_and_not_measurably():
    less = _report(trained="warm_start", start="grpo").verdict
    assert less.text.startswith("warm_start follows the stated preference less than grpo:")
    same = pa.verdict("grpo", "grpo", _all_episodes())
    assert same.difference_usd == 0.0
    assert same.text.startswith(
        "grpo does not follow the stated preference measurably better than grpo:"
    )


def test_markdown_states_the_verdict():
    text = pa.to_markdown(_report())
    assert (
        "- warm_start spends $+0.0000 ± 0.0000 less a task under cost_heavy: it does not measurably follow the preference."
        in text
    )
    assert "**grpo follows the stated preference better than warm_start:" in text


def test_episode_played_under_another_preference_is_refused():
    episodes = _episodes(WARM_START, {"accuracy": 1.0, "cost": 0.5, "latency": 0.0})
    with pytest.raises(ValueError, match="not 'cost_heavy'"):
        pa.cell("warm_start", "cost_heavy", episodes, CONFIGS, cost_scale=0.02, latency_scale=120.0)


def test_unknown_alias_is_counted_under_its_own_name():
    episodes = [_ep("a", "search-1", 0.001, True, COST_HEAVY)]
    assert pa.models_called(episodes, CONFIGS) == {"search-1": 1}
    assert pa.models_called(episodes, {}) == {"search-1": 1}


def test_models_never_called_are_left_out():
    episode = _ep("a", "answer-1", 0.01, True, COST_HEAVY)
    episode.tool_call_counts["tool:answer-2"] = 0
    assert pa.models_called([episode], CONFIGS) == {"answer/big": 1}
