"""Rewards by config string, and the glue from graded trajectories to rewards.

Every reward is a *group* function with one signature,

    reward_fn(features, correct, preference) -> np.ndarray [G]

over the G episodes of one task, so relative rewards (preference) and absolute
ones (efficiency, outcome) are interchangeable. `make_reward(name, **weights)`
binds the weights from the config:

    "preference"  the paper's reward (rewards/preference.py); no weights, the
                  task's preference vector P does the weighting;
    "efficiency"  1 − α·cost − β·latency with a floor (rewards/efficiency.py);
                  weights: cost_weight, latency_weight, floor;
    "utility"     the same with α, β from the task's preference vector, the
                  held-out evaluation's reward; weights: cost_scale, latency_scale;
    "outcome"     1 if correct else 0 (rewards/outcome.py).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from orchestra_jax.rewards.efficiency import efficiency_rewards, utility_rewards
from orchestra_jax.rewards.outcome import outcome_rewards
from orchestra_jax.rewards.preference import preference_rewards
from orchestra_jax.rl.registry import Registry

GroupReward = Callable[
    [Sequence[Mapping[str, float]], Sequence[bool], Mapping[str, float]], np.ndarray
]

REWARDS: Registry[Callable[..., GroupReward]] = Registry("reward")


@REWARDS.register("preference")
def _preference() -> GroupReward:
    return preference_rewards


@REWARDS.register("efficiency")
def _efficiency(*, cost_weight: float, latency_weight: float, floor: float = 0.0) -> GroupReward:
    return functools.partial(
        efficiency_rewards, cost_weight=cost_weight, latency_weight=latency_weight, floor=floor
    )


@REWARDS.register("utility")
def _utility(*, cost_scale: float, latency_scale: float) -> GroupReward:
    return functools.partial(utility_rewards, cost_scale=cost_scale, latency_scale=latency_scale)


@REWARDS.register("outcome")
def _outcome() -> GroupReward:
    return outcome_rewards


def make_reward(name: str, **weights: float) -> GroupReward:
    """The group reward registered as `name`, with `weights` bound (clear error if wrong)."""
    factory = REWARDS.get(name)
    try:
        return factory(**weights)
    except TypeError as e:
        raise ValueError(f"bad weights {sorted(weights)} for reward {name!r}: {e}") from None


def group_rewards(
    trajectories: Sequence[Any], group_size: int, reward_fn: GroupReward
) -> np.ndarray:
    """Rewards for graded trajectories ordered group by group (G consecutive per task).

    Reads `features()`, `correct` and `preference` from each trajectory
    (`agent/trajectory.Trajectory`); the group's preference vector is the task's,
    so all G episodes must carry the same one.
    """
    if group_size < 1 or len(trajectories) % group_size:
        raise ValueError(
            f"{len(trajectories)} trajectories do not split into groups of {group_size}"
        )
    out = []
    for start in range(0, len(trajectories), group_size):
        group = trajectories[start : start + group_size]
        if len({t.task_id for t in group}) != 1:
            raise ValueError(
                f"group starting at {start} mixes tasks "
                f"{sorted({t.task_id for t in group})}; order trajectories by task"
            )
        preference = group[0].preference
        if any(t.preference != preference for t in group):
            raise ValueError(f"task {group[0].task_id!r}: episodes carry different preferences")
        out.append(
            reward_fn([t.features() for t in group], [bool(t.correct) for t in group], preference)
        )
    return np.concatenate(out).astype(np.float32)
