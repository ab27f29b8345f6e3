"""Rewards by config string, and the glue from graded trajectories to rewards.

Every reward is a *group* function with one signature,

    reward_fn(features, correct, preference) -> np.ndarray [G]

over the G episodes of one task, so relative rewards (preference) and absolute
ones (efficiency, outcome) are interchangeable. `REWARDS` maps `reward.type` to
a factory that reads its weights from the `reward` config section;
`make_reward(config.reward)` builds the configured one:

    "preference"  the paper's reward (rewards/preference.py); no weights, the
                  task's preference vector P does the weighting;
    "efficiency"  1 − α·cost − β·latency with a floor (rewards/efficiency.py);
                  α, β, floor = reward.efficiency_alpha, _beta, _floor;
    "utility"     the same with α, β from the task's preference vector, the
                  held-out evaluation's reward; scales reward.cost_scale_usd and
                  reward.latency_scale_s (the config ties them to eval's);
    "outcome"     1 if correct else 0 (rewards/outcome.py);
    "toolorchestra_reference"  the released code's reward, quirks included
                  (rewards/toolorchestra_reference.py); no weights.

A reward of one's own: a factory `(section) -> GroupReward` in any module,
named by `reward.type="package.module:factory"`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from orchestra_jax.registry import Registry
from orchestra_jax.rewards.efficiency import efficiency_rewards, utility_rewards
from orchestra_jax.rewards.outcome import outcome_rewards
from orchestra_jax.rewards.preference import preference_rewards
from orchestra_jax.rewards.toolorchestra_reference import toolorchestra_reference_rewards

GroupReward = Callable[
    [Sequence[Mapping[str, float]], Sequence[bool], Mapping[str, float]], np.ndarray
]
# The `reward` config section (a ConfigDict or a plain mapping): `type` and weights.
RewardSection = Mapping[str, Any]

REWARDS: Registry[Callable[[RewardSection], GroupReward]] = Registry("reward")


@REWARDS.register("preference")
def _preference(section: RewardSection) -> GroupReward:
    del section
    return preference_rewards


@REWARDS.register("efficiency")
def _efficiency(section: RewardSection) -> GroupReward:
    return functools.partial(
        efficiency_rewards,
        cost_weight=section["efficiency_alpha"],
        latency_weight=section["efficiency_beta"],
        floor=section["efficiency_floor"],
    )


@REWARDS.register("utility")
def _utility(section: RewardSection) -> GroupReward:
    return functools.partial(
        utility_rewards,
        cost_scale=section["cost_scale_usd"],
        latency_scale=section["latency_scale_s"],
    )


@REWARDS.register("outcome")
def _outcome(section: RewardSection) -> GroupReward:
    del section
    return outcome_rewards


@REWARDS.register("toolorchestra_reference")
def _toolorchestra_reference(section: RewardSection) -> GroupReward:
    del section
    return toolorchestra_reference_rewards


def make_reward(section: RewardSection) -> GroupReward:
    """The group reward `section["type"]` with its weights read from `section`.

    Raises ValueError for an unknown type or a section without the fields the
    reward reads.
    """
    factory = REWARDS.get(section["type"])
    try:
        return factory(section)
    except (KeyError, AttributeError) as e:
        raise ValueError(
            f"bad weights for reward {section['type']!r}: the reward section has no field {e}"
        ) from None


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
