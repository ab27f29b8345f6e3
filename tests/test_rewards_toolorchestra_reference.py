"""The released code's reward (`toolorchestra_reference`), each quirk hand-computed."""

import numpy as np
import pytest

from experiments.configs import grpo_hle
from orchestra_jax.agent.trajectory import Trajectory, Turn
from orchestra_jax.rewards.config import RewardConfig
from orchestra_jax.rewards.preference import preference_rewards
from orchestra_jax.rewards.registry import group_rewards, make_reward
from orchestra_jax.rewards.toolorchestra_reference import toolorchestra_reference_rewards
from orchestra_jax.training import experiment_config

# Equal cost and latency across a group: both terms are skipped (max == min).
FLAT = {"cost": 0.2, "latency": 5.0}


def test_tools_count_first_calls_normalised_over_the_episodes_that_used_them():
    # "tool:search-1" counts every search call (preference's feature); the
    # reference reads "first_call:tool:search-1": turns whose first valid call
    # was search-1.
    features = [
        {**FLAT, "tool:search-1": 5, "first_call:tool:search-1": 3, "first_call:tool:answer-1": 1},
        {**FLAT, "tool:search-1": 4, "first_call:tool:search-1": 1, "first_call:tool:answer-1": 1},
        # Searched only as a turn's second call: no first-call search count. The one
        # episode that called reasoner-1 first.
        {
            **FLAT,
            "tool:search-1": 2,
            "first_call:tool:reasoner-1": 1,
            "first_call:tool:answer-1": 1,
        },
        {**FLAT, "tool:search-1": 2, "first_call:tool:search-1": 2, "first_call:tool:answer-1": 1},
    ]
    pref = {"tool:search-1": 1.0, "tool:answer-1": 0.5, "tool:reasoner-1": 2.0}
    r = toolorchestra_reference_rewards(features, [True] * 4, pref)
    # search-1 users: episodes 0, 1, 3 with 3, 1, 2 -> min 1, max 3, range 2;
    #   episode 0: (3 − 1) / 2 = 1;  1: (1 − 1) / 2 = 0;  3: (2 − 1) / 2 = 0.5;
    #   episode 2 never called it first: (0 − 1) / 2 = −0.5.
    # answer-1: every episode 1 -> max == min, skipped.
    # reasoner-1: one user -> max == min, skipped, though three episodes never used it.
    # accuracy all right, cost and latency equal: skipped.
    np.testing.assert_allclose(r, [1.0, 0.0, -0.5, 0.5], rtol=1e-6)
    # preference counts every call and normalises over all four:
    # search (5, 4, 2, 2) -> (1, 2/3, 0, 0); answer-1 and reasoner-1 have no
    # "tool:" counts here (0 everywhere): skipped.
    p = preference_rewards(features, [True] * 4, pref)
    np.testing.assert_allclose(p, [1.0, 2 / 3, 0.0, 0.0], rtol=1e-6)


def test_cost_and_latency_rise_with_spending_and_count_twice():
    features = [
        {"cost": 0.10, "latency": 10.0},
        {"cost": 0.30, "latency": 30.0},
        {"cost": 0.20, "latency": 20.0},  # wrong, still in every min and max
    ]
    pref = {"accuracy": 1.0, "cost": 0.5, "latency": 0.25}
    r = toolorchestra_reference_rewards(features, [True, True, False], pref)
    # accuracy (1, 1, 0): min 0, max 1 -> 1 for the right episodes, × 1.0.
    # cost: min/max over −c = (−.1, −.3, −.2): lo = −0.3, hi = −0.1, range 0.2.
    #   explicit term   (c − lo) / 0.2:  ep 0 (0.1 + 0.3) / 0.2 = 2.0; ep 1 (0.3 + 0.3) / 0.2 = 3.0
    #   feature loop    (0 − lo) / 0.2 = 0.3 / 0.2 = 1.5 for both
    #   × 0.5:          ep 0 0.5 · 3.5 = 1.75; ep 1 0.5 · 4.5 = 2.25
    # latency: lo = −30, hi = −10, range 20.
    #   explicit        ep 0 (10 + 30) / 20 = 2.0; ep 1 (30 + 30) / 20 = 3.0
    #   feature loop    30 / 20 = 1.5
    #   × 0.25:         ep 0 0.25 · 3.5 = 0.875; ep 1 0.25 · 4.5 = 1.125
    # ep 0: 1 + 1.75 + 0.875 = 3.625; ep 1: 1 + 2.25 + 1.125 = 4.375; ep 2 wrong: 0.
    r_expected = [3.625, 4.375, 0.0]
    np.testing.assert_allclose(r, r_expected, rtol=1e-6)
    assert r[1] > r[0]  # the dearer, slower episode scores higher
    # preference orients −c and −ℓ consistently: (−.1, −.3, −.2) -> (1, 0, 0.5) for
    # both; ep 0: 1 + 0.5 · 1 + 0.25 · 1 = 1.75; ep 1: 1 + 0 + 0 = 1.
    p = preference_rewards(features, [True, True, False], pref)
    np.testing.assert_allclose(p, [1.75, 1.0, 0.0], rtol=1e-6)


def test_flat_groups_and_wrong_episodes_get_zero():
    features = [{**FLAT, "first_call:tool:search-1": 2}] * 3
    pref = {"accuracy": 1.0, "cost": 1.0, "latency": 1.0, "tool:search-1": 1.0}
    # Every term's max == min: all skipped.
    assert toolorchestra_reference_rewards(features, [True] * 3, pref).tolist() == [0.0] * 3
    mixed = [{"cost": 0.1, "latency": 1.0}, {"cost": 0.3, "latency": 2.0}]
    assert toolorchestra_reference_rewards(mixed, [False, False], pref).tolist() == [0.0, 0.0]


def test_unnamed_features_weigh_zero_and_mistakes_are_errors():
    features = [
        {"cost": 0.1, "latency": 1.0, "first_call:tool:search-1": 1},
        {"cost": 0.3, "latency": 1.0, "first_call:tool:search-1": 3},
    ]
    # P names only accuracy (all right: skipped): search and cost weigh 0.
    r = toolorchestra_reference_rewards(features, [True, True], {"accuracy": 1.0})
    assert r.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="unknown reward feature"):
        toolorchestra_reference_rewards(features, [True, True], {"speed": 1.0})
    with pytest.raises(ValueError, match="'latency'"):
        toolorchestra_reference_rewards([{"cost": 1.0}] * 2, [True, True], {"cost": 1.0})
    with pytest.raises(ValueError, match="correctness flags"):
        toolorchestra_reference_rewards(features, [True], {"cost": 1.0})


def _traj(g, first_calls, cost, correct):
    turns = [Turn("t", 1, "stop", first_call_feature=f) for f in first_calls]
    return Trajectory(
        task_id="q",
        group_index=g,
        seed=g,
        token_ids=[0] + [1] * len(turns),
        loss_mask=[0] + [1] * len(turns),
        rollout_logprobs=[0.0] * (1 + len(turns)),
        prompt_length=1,
        turns=turns,
        finish_reason="answer",
        tool_call_counts={"tool:search-1": 9},  # every call: the reference ignores it
        cost_usd=cost,
        latency_s=1.0,
        correct=correct,
        preference={"tool:search-1": 1.0, "cost": 1.0},
    )


def test_registered_and_fed_by_the_turns_first_valid_calls():
    reward = make_reward({"type": "toolorchestra_reference"})
    trajs = [
        _traj(0, ["tool:search-1", "tool:search-1", "tool:answer-1"], 0.2, True),
        _traj(1, ["tool:search-1", None, "tool:answer-1"], 0.4, True),
        _traj(2, ["tool:answer-1"], 0.2, False),
    ]
    r = group_rewards(trajs, 3, reward)
    # search-1 first calls (2, 1, 0): users 0 and 1, min 1, max 2 -> (1, 0, −1).
    # cost (0.2, 0.4, 0.2): range 0.2; explicit (c + 0.4) / 0.2 -> 3, 4; loop 0.4 / 0.2 = 2.
    # ep 0: 1 + 3 + 2 = 6; ep 1: 0 + 4 + 2 = 6; ep 2 wrong: 0.
    np.testing.assert_allclose(r, [6.0, 6.0, 0.0], rtol=1e-6)


def test_config_checks_accept_the_reference_settings():
    config = grpo_hle.get_config("demo")
    config.reward.type = "toolorchestra_reference"
    config.rl.advantage_boost = 0.1
    config.rl.drop_no_answer = True
    assert RewardConfig.from_config(config.reward).problems() == []
    assert experiment_config.problems(config) == []
    config.rl.advantage_boost = -0.1
    assert experiment_config.problems(config) == ["rl.advantage_boost must be >= 0, got -0.1"]
