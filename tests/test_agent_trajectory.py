"""Trajectory records: validation, reward features, JSONL round trip."""

import dataclasses
import json

import pytest

from orchestra_jax.agent.trajectory import (
    ToolCallRecord,
    ToolResultRecord,
    Trajectory,
    Turn,
    read_jsonl,
    write_jsonl,
)


def make_trajectory(**overrides) -> Trajectory:
    fields = dict(
        task_id="t1",
        group_index=2,
        seed=7,
        token_ids=[1, 2, 3, 4, 5],
        loss_mask=[0, 0, 1, 1, 0],
        rollout_logprobs=[0.0, 0.0, -0.5, -1.25, 0.0],
        prompt_length=2,
        turns=[
            Turn(
                text="<tool_call>…</tool_call><|im_end|>",
                num_generated_tokens=2,
                finish_reason="stop",
                tool_calls=[
                    ToolCallRecord(
                        name="answer",
                        arguments={"model": "answer-1"},
                        raw="{}",
                        feature="tool:answer-1",
                    ),
                    ToolCallRecord(name=None, arguments=None, raw="{bad", error="invalid JSON"),
                ],
                tool_results=[
                    ToolResultRecord(text="42", cost_usd=0.01, latency_s=3.0),
                    ToolResultRecord(text="Error: invalid JSON", error="invalid JSON"),
                ],
            )
        ],
        final_answer="42",
        finish_reason="answer",
        format_valid=False,
        tool_call_counts={"tool:answer-1": 1, "tool:search-1": 0},
        cost_usd=0.0101,
        tool_cost_usd=0.01,
        orchestrator_cost_usd=0.0001,
        latency_s=3.5,
        correct=True,
        reward=0.75,
        advantage=-0.3,
        preference={"accuracy": 1.0},
        metadata={"domain": "math", "unicode": "é ∑ 😀"},
    )
    fields.update(overrides)
    return Trajectory(**fields)


def test_jsonl_round_trip(tmp_path):
    trajs = [make_trajectory(), make_trajectory(group_index=3, correct=None, reward=None)]
    path = tmp_path / "deep" / "step_000010.jsonl"
    write_jsonl(path, trajs)
    assert read_jsonl(path) == trajs
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2
    assert not (tmp_path / "deep" / "step_000010.jsonl.tmp").exists()


def test_features():
    feats = make_trajectory().features()
    assert feats == {
        "tool:answer-1": 1.0,
        "tool:search-1": 0.0,
        "accuracy": 1.0,
        "cost": 0.0101,
        "latency": 3.5,
    }
    assert make_trajectory(correct=False).features()["accuracy"] == 0.0


def test_first_call_features_count_turns_by_their_first_valid_call():
    turn = make_trajectory().turns[0]
    turns = [
        dataclasses.replace(turn, first_call_feature="tool:search-1"),
        dataclasses.replace(turn, first_call_feature=None),
        dataclasses.replace(turn, first_call_feature="tool:search-1"),
        dataclasses.replace(turn, first_call_feature="tool:answer-1"),
    ]
    traj = make_trajectory(turns=turns)
    assert traj.first_call_counts() == {"tool:search-1": 2, "tool:answer-1": 1}
    feats = traj.features()
    assert feats["first_call:tool:search-1"] == 2.0
    assert feats["first_call:tool:answer-1"] == 1.0
    assert "first_call:tool:reasoner-1" not in feats
    assert Trajectory.from_dict(json.loads(json.dumps(traj.to_dict()))) == traj


def test_features_need_grading():
    with pytest.raises(ValueError, match="not graded"):
        make_trajectory(correct=None).features()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(loss_mask=[0, 1]), "same length"),
        (dict(rollout_logprobs=[0.0]), "same length"),
        (dict(prompt_length=6), "prompt_length"),
        (dict(finish_reason="done"), "finish_reason"),
    ],
)
def test_bad_records_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_trajectory(**overrides)


def test_bad_line_names_its_number(tmp_path):
    path = tmp_path / "t.jsonl"
    good = json.dumps(make_trajectory().to_dict())
    path.write_text(good + "\n\n" + json.dumps({"task_id": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t\.jsonl:3"):
        read_jsonl(path)


def test_num_generated_tokens():
    assert make_trajectory().num_generated_tokens == 2
