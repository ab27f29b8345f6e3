"""Preference, efficiency and registry rewards, hand-computed."""

import numpy as np
import pytest

from orchestra_jax.rewards.efficiency import efficiency_rewards
from orchestra_jax.rewards.preference import preference_rewards
from orchestra_jax.rewards.registry import REWARDS, group_rewards, make_reward


def test_preference_reward_hand_computed():
    features = [
        {"tool:search-1": 2, "accuracy": 1, "cost": 0.10, "latency": 10.0},
        {"tool:search-1": 0, "accuracy": 1, "cost": 0.30, "latency": 30.0},
        {"tool:search-1": 1, "accuracy": 1, "cost": 0.20, "latency": 20.0},
    ]
    pref = {"tool:search-1": 1.0, "accuracy": 2.0, "cost": 0.5, "latency": 0.25}
    r = preference_rewards(features, [True, True, True], pref)
    # accuracy all equal -> skipped. search: (2,0,1)->(1,0,.5). -cost: (-.1,-.3,-.2)->(1,0,.5).
    expected = [1.0 + 0.5 + 0.25, 0.0, 0.5 + 0.25 + 0.125]
    np.testing.assert_allclose(r, expected, rtol=1e-6)


def test_cheaper_and_faster_is_better_and_wrong_is_zero():
    features = [
        {"cost": 1.0, "latency": 5.0},
        {"cost": 3.0, "latency": 1.0},
        {"cost": 0.5, "latency": 0.5},
    ]
    r = preference_rewards(features, [True, True, False], {"cost": 1.0, "latency": 1.0})
    # -cost over the whole group (wrong one included): (-1,-3,-.5) -> (0.8, 0, 1)
    # -latency: (-5,-1,-.5) -> (0, 0.888.., 1)
    np.testing.assert_allclose(r, [0.8, 4.0 / 4.5, 0.0], rtol=1e-6)
    assert r.dtype == np.float32


def test_accuracy_term_and_missing_tool_counts():
    features = [{"cost": 1, "latency": 1}, {"cost": 1, "latency": 1, "tool:python": 3}]
    r = preference_rewards(features, [True, False], {"accuracy": 1.0, "tool:python": 1.0})
    np.testing.assert_allclose(r, [1.0, 0.0])  # accuracy from `correct`; python 0 vs 3 -> 0


def test_all_equal_group_gets_zero_and_bad_names_fail():
    same = [{"cost": 1, "latency": 1}] * 4
    assert preference_rewards(same, [True] * 4, {"cost": 1, "latency": 1}).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="unknown reward feature"):
        preference_rewards(same, [True] * 4, {"speed": 1.0})
    with pytest.raises(ValueError, match="no 'cost'"):
        preference_rewards([{}, {}], [True, True], {"cost": 1.0})


def test_negative_preference_weight_penalises_a_tool():
    r = preference_rewards([{"tool:x": 0}, {"tool:x": 4}], [True, True], {"tool:x": -1.0})
    np.testing.assert_allclose(r, [0.0, -1.0])


def test_efficiency_reward_with_floor():
    features = [
        {"cost": 0.1, "latency": 2.0},
        {"cost": 5.0, "latency": 0.0},
        {"cost": 0.0, "latency": 0.0},
    ]
    r = efficiency_rewards(
        features, [True, True, False], cost_weight=1.0, latency_weight=0.1, floor=0.05
    )
    np.testing.assert_allclose(r, [1 - 0.1 - 0.2, 0.05, 0.0], rtol=1e-6)
    with pytest.raises(ValueError, match="non-negative"):
        efficiency_rewards(features, [True] * 3, cost_weight=-1.0, latency_weight=0.0)


def test_utility_reward_weighs_cost_and_latency_by_the_tasks_preference():
    features = [
        {"cost": 0.01, "latency": 30.0},
        {"cost": 0.04, "latency": 60.0},
        {"cost": 0.0, "latency": 0.0},
    ]
    pref = {"accuracy": 1.0, "cost": 0.5, "latency": 0.2}
    fn = make_reward({"type": "utility", "cost_scale_usd": 0.02, "latency_scale_s": 120.0})
    # 1 - 0.5*0.01/0.02 - 0.2*30/120 = 0.7; the second would be 1 - 1 - 0.1 < 0: floor 0.
    np.testing.assert_allclose(fn(features, [True, True, False], pref), [0.7, 0.0, 0.0], rtol=1e-6)
    # No stated efficiency preference: every right answer is worth 1, whatever it cost.
    np.testing.assert_allclose(fn(features, [True, True, True], {"accuracy": 1.0}), [1, 1, 1])
    with pytest.raises(ValueError, match="scales must be positive"):
        make_reward({"type": "utility", "cost_scale_usd": 0.0, "latency_scale_s": 1.0})(
            features, [True] * 3, pref
        )


def test_registry_binds_weights_and_rejects_unknown_names():
    assert REWARDS.names() == [
        "efficiency",
        "outcome",
        "preference",
        "toolorchestra_reference",
        "utility",
    ]
    fn = make_reward(
        {
            "type": "efficiency",
            "efficiency_alpha": 2.0,
            "efficiency_beta": 0.0,
            "efficiency_floor": 0,
        }
    )
    assert fn([{"cost": 0.25, "latency": 9.0}], [True], {}).tolist() == [0.5]
    with pytest.raises(ValueError, match="unknown reward"):
        make_reward({"type": "vibes"})
    with pytest.raises(ValueError, match="bad weights"):
        make_reward({"type": "efficiency", "efficiency_alpha": 1.0})


class Episode:
    def __init__(self, task_id, correct, cost, preference):
        self.task_id, self.correct, self.preference = task_id, correct, preference
        self._cost = cost

    def features(self):
        return {"accuracy": float(self.correct), "cost": self._cost, "latency": 1.0}


def test_group_rewards_walks_groups_in_order():
    pref = {"cost": 1.0}
    eps = [
        Episode("a", True, 1.0, pref),
        Episode("a", True, 2.0, pref),
        Episode("b", True, 5.0, pref),
        Episode("b", False, 1.0, pref),
    ]
    r = group_rewards(eps, 2, make_reward({"type": "preference"}))
    np.testing.assert_allclose(r, [1.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="mixes tasks"):
        group_rewards(eps[1:3] + eps[:2], 2, make_reward({"type": "outcome"}))
    with pytest.raises(ValueError, match="groups of 3"):
        group_rewards(eps, 3, make_reward({"type": "outcome"}))


def test_preference_ignores_first_call_features():
    # Trajectory.features() also holds "first_call:tool:<name>" counts; the
    # preference reward reads "tool:<name>" (every call) alone, so its values are
    # those of test_preference_reward_hand_computed.
    features = [
        {"tool:search-1": 2, "accuracy": 1, "cost": 0.10, "latency": 10.0},
        {"tool:search-1": 0, "accuracy": 1, "cost": 0.30, "latency": 30.0},
        {"tool:search-1": 1, "accuracy": 1, "cost": 0.20, "latency": 20.0},
    ]
    pref = {"tool:search-1": 1.0, "accuracy": 2.0, "cost": 0.5, "latency": 0.25}
    with_first = [
        {**f, "first_call:tool:search-1": n, "first_call:tool:answer-1": 1}
        for f, n in zip(features, (1, 0, 3))
    ]
    expected = [1.0 + 0.5 + 0.25, 0.0, 0.5 + 0.25 + 0.125]
    for rows in (features, with_first):
        np.testing.assert_allclose(preference_rewards(rows, [True] * 3, pref), expected, rtol=1e-6)
