"""Episodes that failed by infrastructure: out of the loss and of their group's
statistics, counted, bounded per step; the policy's own failures still trained."""

import asyncio
import dataclasses
import types

import numpy as np
import pytest

from orchestra_jax.agent.trajectory import Trajectory, Turn, read_jsonl, write_jsonl
from orchestra_jax.agent.view import episode_view
from orchestra_jax.infra_failure import INFRA_KINDS, InfraFailure
from orchestra_jax.rewards.registry import make_reward
from orchestra_jax.rl.samples import samples_of
from orchestra_jax.training import infra_failures, loop_steps
from orchestra_jax.training.rollouts import score_groups

OUTAGE = InfraFailure(kind="expert", endpoint="http://expert.test/v1", message="HTTP 503")


def _traj(task, g, correct, *, cost=0.1, failure=None, valid=True, finish="answer"):
    # Two turns of two sampled tokens each, so turn samples can be cut from it.
    return Trajectory(
        task_id=task,
        group_index=g,
        seed=g,
        token_ids=[1, 2, 3, 4, 5, 6],
        loss_mask=[0, 1, 1, 0, 1, 1],
        rollout_logprobs=[0.0, -1.0, -1.0, 0.0, -1.0, -1.0],
        prompt_length=1,
        turns=[
            Turn(text="a", num_generated_tokens=2, finish_reason="stop", prompt_tokens=1),
            Turn(
                text="b",
                num_generated_tokens=2,
                finish_reason="stop",
                prompt_tokens=4,
                format_valid=valid,
            ),
        ],
        finish_reason="error" if failure else finish,
        format_valid=valid,
        cost_usd=cost,
        latency_s=1.0,
        correct=correct,
        final_answer="x" if finish == "answer" else None,
        preference={"accuracy": 1.0, "cost": 0.5},
        metadata={"domain": "d"},
        infra_failure=failure,
    )


def _score(trajs, group_size, reward="outcome", **kwargs):
    return score_groups(
        trajs,
        group_size=group_size,
        reward_fn=make_reward({"type": reward}),
        adv_clip=None,
        filter_reward_std=0.0,
        format_filter="off",
        **kwargs,
    )


def test_a_failed_episode_leaves_its_group_advantages_as_if_never_played():
    # Group a: rewards 1, 0, 1 and an episode whose expert failed (graded False, as
    # the grader leaves it). By hand over the three others: mean 2/3, sample std
    # sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3), so A = (1/3)/sqrt(1/3) = 0.57735
    # and (-2/3)/sqrt(1/3) = -1.1547. Counted as a policy failure (reward 0) it
    # would have been +-0.866 instead.
    group_a = [
        _traj("a", 0, True),
        _traj("a", 1, False),
        _traj("a", 2, True, failure=OUTAGE),
        _traj("a", 3, True),
    ]
    group_a[2].correct = False
    group_b = [_traj("b", g, g % 2 == 0) for g in range(4)]
    exp = _score(group_a + group_b, 4)
    s = np.sqrt(1 / 3)
    np.testing.assert_allclose(exp.advantages[:4], [1 / 3 / s, -2 / 3 / s, 0.0, 1 / 3 / s], 1e-5)
    assert exp.keep.tolist() == [True, True, False, True] + [True] * 4
    assert group_a[2].reward is None and group_a[2].advantage is None
    assert group_a[2] not in exp.kept
    # Group b (no failure) is scored exactly as without the failing group.
    alone = _score([_traj("b", g, g % 2 == 0) for g in range(4)], 4)
    np.testing.assert_array_equal(exp.advantages[4:], alone.advantages)
    assert exp.metrics["rollout/infra_failed"] == 1.0
    assert exp.metrics["rollout/infra_failed/expert"] == 1.0
    assert exp.metrics["rollout/infra_failed_at/http://expert.test/v1"] == 1.0
    assert exp.metrics["rollout/infra_groups_dropped"] == 0.0
    assert all(exp.metrics[f"rollout/infra_failed/{k}"] == 0 for k in INFRA_KINDS if k != "expert")
    assert exp.metrics["accuracy"] == pytest.approx(4 / 7)  # over the 7 scored episodes


def test_group_normalised_rewards_ignore_the_failed_episode():
    # The paper's reward normalises cost within the group: a failed episode's cost
    # must not move the others' rewards. The group with it equals the group without.
    costs, correct = [0.1, 0.4, 9.0, 0.2], [True, True, False, False]
    with_failure = [
        _traj("a", g, c, cost=cost, failure=OUTAGE if g == 2 else None)
        for g, (c, cost) in enumerate(zip(correct, costs))
    ]
    without = [t for t in with_failure if t.infra_failure is None]
    exp = _score(with_failure, 4, reward="preference")
    kept = [i for i in range(4) if i != 2]
    alone = _score([dataclasses.replace(t) for t in without], 3, reward="preference")  # copies
    np.testing.assert_allclose(exp.rewards[kept], alone.rewards, rtol=1e-6)
    np.testing.assert_allclose(exp.advantages[kept], alone.advantages, rtol=1e-6)


def test_a_group_with_too_few_episodes_left_is_dropped():
    group_a = [_traj("a", g, g == 0, failure=OUTAGE if g else None) for g in range(4)]
    group_b = [_traj("b", g, g % 2 == 0) for g in range(4)]
    exp = _score(group_a + group_b, 4, min_group_size_after_infra=2)
    assert exp.keep.tolist() == [False] * 4 + [True] * 4
    assert exp.advantages[:4].tolist() == [0.0] * 4
    assert exp.metrics["rollout/infra_groups_dropped"] == 1.0
    assert exp.metrics["rollout/infra_failed"] == 3.0
    # A whole group failing is dropped too, and an all-failed step scores nothing.
    gone = _score([_traj("a", g, True, failure=OUTAGE) for g in range(4)], 4)
    assert not gone.keep.any() and gone.metrics["rollout/infra_groups_dropped"] == 1.0
    assert gone.kept == [] and gone.metrics["kept_fraction"] == 0.0


@pytest.mark.parametrize("unit", ["episode", "turn"])
def test_neither_sample_unit_trains_on_a_failed_episode(unit):
    trajs = [_traj("a", g, g % 2 == 0, failure=OUTAGE if g == 1 else None) for g in range(4)]
    samples = samples_of(unit, _score(trajs, 4).kept)
    assert {(s.task_id, s.group_index) for s in samples} == {("a", 0), ("a", 2), ("a", 3)}
    assert len(samples) == (3 if unit == "episode" else 6)


def test_the_policys_own_failures_are_still_trained_with_reward_0():
    # A malformed call (format-invalid turn) and an episode that never answered are
    # the policy's: graded wrong, reward 0, a negative advantage on their tokens.
    trajs = [
        _traj("a", 0, True),
        _traj("a", 1, False, valid=False),
        _traj("a", 2, False, finish="max_turns"),
        _traj("a", 3, True),
    ]
    exp = _score(trajs, 4)
    assert exp.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert exp.keep.all() and exp.advantages[1] < 0 and exp.advantages[2] < 0
    assert exp.metrics["rollout/infra_failed"] == 0.0


def _step_run(max_fraction, min_group=2):
    rl = types.SimpleNamespace(
        group_size=4,
        adv_clip=3.0,
        filter_reward_std=0.0,
        format_filter="off",
        format_penalty=-1.0,
        filter_no_answer=False,
        advantage="grpo",
        advantage_boost=0.0,
        drop_no_answer=False,
        max_infra_failure_fraction=max_fraction,
        min_group_size_after_infra=min_group,
    )
    sections = types.SimpleNamespace(
        rl=rl, env=types.SimpleNamespace(tau2=types.SimpleNamespace(train_message_turns=True))
    )
    return types.SimpleNamespace(sections=sections, reward_fn=make_reward({"type": "outcome"}))


def test_a_step_past_the_fraction_fails_naming_the_endpoint():
    search = InfraFailure(kind="search", endpoint="https://search.test", message="timed out")
    trajs = [_traj("a", g, True, failure=OUTAGE if g < 2 else None) for g in range(4)]
    trajs += [_traj("b", g, g == 0, failure=search if g == 3 else None) for g in range(4)]
    # 3 of 8 failed: within 0.5, past 0.25.
    assert loop_steps.score_step(_step_run(0.5), trajs).metrics["rollout/infra_failed"] == 3.0
    with pytest.raises(infra_failures.InfraFailureError) as e:
        loop_steps.score_step(_step_run(0.25), trajs)
    message = str(e.value)
    assert "3 of 8" in message and "rl.max_infra_failure_fraction=0.25" in message
    assert "expert at http://expert.test/v1: 2 episode(s), last error: HTTP 503" in message
    assert "search at https://search.test: 1 episode(s), last error: timed out" in message


def test_the_record_round_trips_and_names_its_kind(tmp_path):
    traj = _traj("a", 0, False, failure=OUTAGE)
    traj.turns[0].tool_results = []
    write_jsonl(tmp_path / "t.jsonl", [traj])
    [back] = read_jsonl(tmp_path / "t.jsonl")
    assert back.infra_failure == OUTAGE
    with pytest.raises(ValueError, match="not in"):
        InfraFailure(kind="policy", endpoint="x", message="y")
    shown = episode_view(back, step=1, source="s", tokenizer=None)
    assert shown["infra_failure"] == "expert at http://expert.test/v1: HTTP 503"
    assert shown["reward"] is None


def test_evaluation_summary_counts_failures_apart():
    trajs = [_traj("a", g, g == 0, failure=OUTAGE if g == 3 else None) for g in range(4)]
    assert infra_failures.summary(trajs) == {
        "infra_failed": 1,
        "infra_failed_by_kind": {"expert": 1},
        "infra_failed_by_endpoint": {"http://expert.test/v1": 1},
    }


def _evaluator(tmp_path, task_ids, trials, max_fraction):
    from orchestra_jax.training import evaluation

    return evaluation.Evaluator(
        [types.SimpleNamespace(id=i, metadata={}) for i in task_ids],
        dict.fromkeys(task_ids),
        None,
        seed=0,
        cost_scale=1.0,
        latency_scale=100.0,
        workdir=str(tmp_path),
        max_infra_failure_fraction=max_fraction,
        trials=trials,
    )


def test_an_evaluation_scores_only_what_did_not_fail_by_infrastructure(tmp_path, monkeypatch):
    played = [_traj("a", 0, True), _traj("a", 1, False), _traj("a", 2, False, failure=OUTAGE)]
    evaluator = _evaluator(tmp_path, ["a"], trials=3, max_fraction=1.0)

    async def play(engine):
        return [dataclasses.replace(t) for t in played]

    monkeypatch.setattr(evaluator, "play", play)
    summary = asyncio.run(evaluator.evaluate("p", None))
    assert summary["num_episodes"] == 2 and summary["accuracy"] == 0.5  # 1 of the 2 scored
    assert summary["infra_failed"] == 1 and summary["infra_failed_by_kind"] == {"expert": 1}
    assert summary["pass_k"]["all"]["pass^1"] == 0.5
    assert len(read_jsonl(tmp_path / "trajectories" / "eval_p.jsonl")) == 3  # all kept to view
    played[:2] = [_traj("a", g, True, failure=OUTAGE) for g in range(2)]
    with pytest.raises(infra_failures.InfraFailureError, match="expert at http://expert.test"):
        asyncio.run(evaluator.evaluate("p", None))


def _played(num_tasks, trials, failed):
    """Every task wins its even trials; the episodes at places `failed` failed by
    infrastructure."""
    return [
        _traj(f"t{i}", g, g % 2 == 0, failure=OUTAGE if i * trials + g in failed else None)
        for i in range(num_tasks)
        for g in range(trials)
    ]


def test_an_evaluation_is_bounded_as_a_training_step_is(tmp_path, monkeypatch):
    evaluator = _evaluator(tmp_path, [f"t{i}" for i in range(4)], trials=4, max_fraction=0.25)
    played = _played(4, 4, failed={0, 5, 10, 15})  # 4 of 16: at the bound, scored

    async def play(engine):
        return [dataclasses.replace(t) for t in played]

    monkeypatch.setattr(evaluator, "play", play)
    assert asyncio.run(evaluator.evaluate("p", None))["infra_failed"] == 4
    played[:] = _played(4, 4, failed={0, 5, 10, 15, 1})  # 5 of 16: over it
    with pytest.raises(infra_failures.InfraFailureError) as e:
        asyncio.run(evaluator.evaluate("p", None))
    assert "5 of 16 of the evaluation of 'p'" in str(e.value)
    assert "rl.max_infra_failure_fraction=0.25" in str(e.value) and "expert at" in str(e.value)


def test_one_lost_episode_of_200_leaves_every_other_tasks_pass_k(tmp_path, monkeypatch):
    tasks = [f"t{i}" for i in range(50)]
    evaluator = _evaluator(tmp_path, tasks, trials=4, max_fraction=0.25)
    played = _played(50, 4, failed={7})  # task t1 keeps 3 trials

    async def play(engine):
        return [dataclasses.replace(t) for t in played]

    monkeypatch.setattr(evaluator, "play", play)
    summary = asyncio.run(evaluator.evaluate("p", None))
    # 2 wins of 4: pass^1 = 1/2, pass^2 = C(2,2)/C(4,2) = 1/6, pass^3 = pass^4 = 0;
    # t1 (wins g=0, g=2 of 3): pass^1 = 2/3, pass^2 = 1/3, pass^3 = 0.
    assert summary["pass_k"]["all"] == pytest.approx(
        {
            "pass^1": (49 / 2 + 2 / 3) / 50,
            "pass^2": (49 / 6 + 1 / 3) / 50,
            "pass^3": 0.0,
            "pass^4": 0.0,
        }
    )
    assert summary["pass_k_tasks"]["all"] == {
        "pass^1": 50,
        "pass^2": 50,
        "pass^3": 50,
        "pass^4": 49,
    }
    assert summary["infra_failed"] == 1


def test_bad_infrastructure_bounds_are_named_at_start_up(tmp_path):
    from orchestra_jax.config_section import ConfigError
    from tests.test_training_e2e import micro_config

    with pytest.raises(ConfigError) as e:
        micro_config(
            tmp_path,
            **{
                "rl.min_group_size_after_infra": 3,  # micro's groups have 2 episodes
                "rl.max_infra_failure_fraction": 1.5,
                "rollout.infra_retries": -1,
            },
        )
    for field in (
        "rl.min_group_size_after_infra",
        "rl.max_infra_failure_fraction",
        "rollout.infra_retries",
    ):
        assert field in str(e.value)
