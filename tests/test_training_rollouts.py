"""Scoring one step's groups: rewards, advantages and every filter, by hand."""

import dataclasses
import types

import numpy as np
import pytest

from experiments.configs import grpo_hle
from orchestra_jax.agent.trajectory import Trajectory, Turn
from orchestra_jax.envs.config import EnvConfig
from orchestra_jax.rewards.registry import make_reward
from orchestra_jax.rl.config import RLConfig
from orchestra_jax.training import builders, loop_steps
from orchestra_jax.training.rollouts import score_groups


def _traj(task, correct, cost, valid=True, answer="x"):
    return Trajectory(
        task_id=task,
        group_index=0,
        seed=0,
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        rollout_logprobs=[0.0, -1.0, -1.0],
        prompt_length=1,
        finish_reason="answer",
        format_valid=valid,
        cost_usd=cost,
        latency_s=1.0,
        correct=correct,
        final_answer=answer,
        preference={"accuracy": 1.0},
        metadata={"domain": "d"},
    )


def test_filters_and_advantages():
    trajs = [
        _traj("a", True, 0.1),
        _traj("a", False, 0.1, valid=False),  # signal
        _traj("b", True, 0.1),
        _traj("b", True, 0.2),  # all right: std 0
        _traj("c", False, 0.1, answer=""),
        _traj("c", False, 0.1, answer=""),  # nobody answered
    ]
    exp = score_groups(
        trajs,
        group_size=2,
        reward_fn=make_reward({"type": "outcome"}),
        adv_clip=3.0,
        filter_reward_std=0.1,
        format_filter="episode",
        filter_no_answer=True,
    )
    np.testing.assert_array_equal(exp.rewards, [1, 0, 1, 1, 0, 0])
    # Group a: mean 0.5, sample std 0.707 -> +-0.707; the malformed episode is dropped.
    np.testing.assert_array_equal(exp.keep, [True, False, False, False, False, False])
    assert exp.advantages[0] == pytest.approx(0.5 / np.sqrt(0.5), rel=1e-5)
    assert exp.advantages[1:].tolist() == [0.0] * 5
    assert [t.advantage for t in exp.kept] == [pytest.approx(exp.advantages[0])]
    assert exp.metrics["accuracy"] == pytest.approx(0.5)
    assert exp.metrics["kept_fraction"] == pytest.approx(1 / 6)

    loose = score_groups(
        trajs,
        group_size=2,
        reward_fn=make_reward({"type": "outcome"}),
        adv_clip=None,
        filter_reward_std=0.0,
        format_filter="off",
    )
    np.testing.assert_array_equal(loose.keep, [True, True, False, False, False, False])


def test_dr_grpo_advantages_are_centred_not_scaled():
    # Efficiency rewards: group a differs by a little cost (0.9 vs 0.8), group b
    # by correctness (1 vs 0). GRPO scales both to +-0.707; Dr. GRPO keeps 10:1.
    trajs = [
        _traj("a", True, 0.1),
        _traj("a", True, 0.2),
        _traj("b", True, 0.0),
        _traj("b", False, 0.0),
    ]
    reward = make_reward(
        {
            "type": "efficiency",
            "efficiency_alpha": 1.0,
            "efficiency_beta": 0.0,
            "efficiency_floor": 0,
        }
    )
    grpo_exp = score_groups(
        trajs,
        group_size=2,
        reward_fn=reward,
        adv_clip=None,
        filter_reward_std=0.0,
        format_filter="off",
    )
    dr_exp = score_groups(
        trajs,
        group_size=2,
        reward_fn=reward,
        adv_clip=None,
        filter_reward_std=0.0,
        format_filter="off",
        advantage="dr_grpo",
    )
    np.testing.assert_allclose(grpo_exp.advantages, [0.7071, -0.7071, 0.7071, -0.7071], atol=1e-3)
    np.testing.assert_allclose(dr_exp.advantages, [0.05, -0.05, 0.5, -0.5], atol=1e-6)
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        score_groups(
            trajs,
            group_size=2,
            reward_fn=reward,
            adv_clip=None,
            filter_reward_std=0.0,
            format_filter="off",
            advantage="ppo",
        )


def _two_turn_traj(task, correct, first_valid):
    # prompt 2 | turn 1: 2 sampled | observation 1 | turn 2: 3 sampled
    turns = [Turn("a", 2, "stop", format_valid=first_valid), Turn("b", 3, "stop")]
    return Trajectory(
        task_id=task,
        group_index=0,
        seed=0,
        token_ids=list(range(8)),
        loss_mask=[0, 0, 1, 1, 0, 1, 1, 1],
        rollout_logprobs=[0.0] * 8,
        prompt_length=2,
        turns=turns,
        finish_reason="answer",
        format_valid=first_valid,
        correct=correct,
        final_answer="x",
        preference={"accuracy": 1.0},
        metadata={"domain": "d"},
    )


def test_turn_format_filter_masks_only_malformed_turns():
    trajs = [_two_turn_traj("a", True, first_valid=False), _two_turn_traj("a", False, True)]
    exp = score_groups(
        trajs,
        group_size=2,
        reward_fn=make_reward({"type": "outcome"}),
        adv_clip=3.0,
        filter_reward_std=0.0,
        format_filter="turn",
    )
    np.testing.assert_array_equal(exp.keep, [True, True])
    kept = exp.kept
    assert kept[0].loss_mask == [0, 0, 0, 0, 0, 1, 1, 1]  # the malformed turn 1 is out
    assert kept[1].loss_mask == [0, 0, 1, 1, 0, 1, 1, 1]  # untouched
    assert trajs[0].loss_mask == [0, 0, 1, 1, 0, 1, 1, 1]  # the record keeps what was sampled
    assert exp.metrics["turn_format_valid"] == pytest.approx(3 / 4)
    assert exp.advantages[0] > 0 > exp.advantages[1]  # advantages use every episode


def test_message_turns_leave_the_loss_when_configured():
    trajs = [_two_turn_traj("a", True, first_valid=False), _two_turn_traj("a", False, True)]
    for traj in trajs:
        traj.turns[1].message_to_party = True  # turn 2 spoke to the other party

    def score(**options):
        return score_groups(
            trajs,
            group_size=2,
            reward_fn=make_reward({"type": "outcome"}),
            adv_clip=3.0,
            filter_reward_std=0.0,
            format_filter="turn",
            **options,
        )

    kept = score(train_message_turns=False).kept
    assert kept[0].loss_mask == [0] * 8  # malformed turn 1 and message turn 2: both out
    assert kept[1].loss_mask == [0, 0, 1, 1, 0, 0, 0, 0]  # only the message turn out
    assert [t.loss_mask for t in score().kept][1] == [0, 0, 1, 1, 0, 1, 1, 1]  # default
    assert trajs[1].loss_mask == [0, 0, 1, 1, 0, 1, 1, 1]  # the record keeps what was sampled


def test_turn_mask_checks_turn_lengths():
    traj = _two_turn_traj("a", True, first_valid=False)
    traj.turns[1].num_generated_tokens = 4
    with pytest.raises(ValueError, match="generated 6 tokens but the loss mask has 5"):
        traj.loss_mask_without_invalid_turns()


def test_unknown_format_filter_is_an_error():
    with pytest.raises(ValueError, match="format_filter"):
        score_groups(
            [_two_turn_traj("a", True, True)] * 2,
            group_size=2,
            reward_fn=make_reward({"type": "outcome"}),
            adv_clip=3.0,
            filter_reward_std=0.0,
            format_filter="drop",
        )


def test_penalty_format_filter_ranks_malformed_episodes_last():
    # Group a: right but malformed, wrong and well-formed. Outcome rewards 1, 0;
    # the penalty makes them -1, 0, so the malformed episode gets the negative
    # advantage and is trained on in full (every turn).
    trajs = [_two_turn_traj("a", True, first_valid=False), _two_turn_traj("a", False, True)]
    exp = score_groups(
        trajs,
        group_size=2,
        reward_fn=make_reward({"type": "outcome"}),
        adv_clip=3.0,
        filter_reward_std=0.0,
        format_filter="penalty",
        format_penalty=-1.0,
    )
    np.testing.assert_array_equal(exp.rewards, [-1.0, 0.0])
    np.testing.assert_array_equal(exp.keep, [True, True])
    assert exp.advantages[0] == pytest.approx(-0.5 / np.sqrt(0.5), rel=1e-5)
    assert exp.kept[0].loss_mask == [0, 0, 1, 1, 0, 1, 1, 1]


def test_drop_no_answer_and_advantage_boost():
    """The reference's filter and boost: episodes that did not answer contribute no
    sample but stay in their group's rewards and advantages; advantages >= 1 gain b."""
    unanswered = dict(finish_reason="max_turns", final_answer=None)
    trajs = [
        _traj("a", True, 0.1),
        _traj("a", False, 0.1),
        dataclasses.replace(_traj("a", False, 0.1), **unanswered),
        dataclasses.replace(_traj("a", False, 0.1), **unanswered),
    ]
    exp = score_groups(
        trajs,
        group_size=4,
        reward_fn=make_reward({"type": "outcome"}),
        adv_clip=3.0,
        filter_reward_std=0.1,
        format_filter="turn",
        advantage_boost=0.1,
        drop_no_answer=True,
    )
    # Rewards (1, 0, 0, 0): mean 0.25, sample std 0.5 -> (1.5, −0.5, −0.5, −0.5);
    # 1.5 >= 1 gains 0.1 -> 1.6; episodes 2 and 3 never answered: dropped, 0.
    np.testing.assert_array_equal(exp.keep, [True, True, False, False])
    np.testing.assert_allclose(exp.advantages, [1.6, -0.5, 0.0, 0.0], rtol=1e-5)
    assert len(exp.kept) == 2
    plain = score_groups(
        trajs,
        group_size=4,
        reward_fn=make_reward({"type": "outcome"}),
        adv_clip=3.0,
        filter_reward_std=0.1,
        format_filter="turn",
    )
    np.testing.assert_array_equal(plain.keep, [True] * 4)
    np.testing.assert_allclose(plain.advantages, [1.5, -0.5, -0.5, -0.5], rtol=1e-5)


def test_score_step_reads_the_reference_settings():
    config = grpo_hle.get_config("micro")
    config.reward.type = "toolorchestra_reference"
    config.rl.group_size = 4
    config.rl.filter_reward_std = 0.1
    config.rl.format_filter = "turn"
    config.rl.advantage_boost = 0.1
    config.rl.drop_no_answer = True
    sections = types.SimpleNamespace(  # what score_step reads
        rl=RLConfig.from_config(config.rl), env=EnvConfig.from_config(config.env)
    )
    run = types.SimpleNamespace(sections=sections, reward_fn=builders.build_reward(config))
    unanswered = dict(finish_reason="max_turns", final_answer=None)
    trajs = [
        _traj("a", True, 0.1),
        _traj("a", False, 0.1),
        dataclasses.replace(_traj("a", False, 0.1), **unanswered),
        dataclasses.replace(_traj("a", False, 0.1), **unanswered),
    ]
    exp = loop_steps.score_step(run, trajs)
    # P = {accuracy: 1}: rewards (1, 0, 0, 0) as in test_drop_no_answer_and_advantage_boost.
    np.testing.assert_allclose(exp.rewards, [1.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(exp.advantages, [1.6, -0.5, 0.0, 0.0], rtol=1e-5)
