"""Absolute (not group-relative) rewards that trade correctness against spending.

Efficiency, preference-free:

    R_i = max(floor, 1 − α · cost_i − β · latency_i)   if episode i is correct,
    R_i = 0                                             otherwise,

with cost in US dollars and latency in seconds. Unlike the preference reward it
is not relative to the group, so it is meaningful for G = 1 and for evaluation.
The floor (≥ 0 by default) keeps a right-but-expensive answer from scoring below
a wrong one.

Utility, the same with the weights taken from the task's preference vector P:

    α = P_cost / cost_scale,   β = P_latency / latency_scale,   floor 0,

so a dollar weighs what the user said it does. Held-out evaluation scores every
policy with it (`training/evaluation.py`); as a training reward it optimises
that score directly, where the paper's reward only ranks a group's episodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def efficiency_rewards(
    features: Sequence[Mapping[str, float]],
    correct: Sequence[bool],
    preference: Mapping[str, float] | None = None,
    *,
    cost_weight: float,
    latency_weight: float,
    floor: float = 0.0,
) -> np.ndarray:
    """max(floor, 1 − α·cost − β·latency) for correct episodes, 0 for wrong ones.

    `preference` is accepted (and ignored) so that every registered reward has the
    same group signature; `cost_weight` is α, `latency_weight` is β.
    """
    del preference
    if len(features) != len(correct):
        raise ValueError(f"{len(features)} feature rows but {len(correct)} correctness flags")
    if cost_weight < 0 or latency_weight < 0:
        raise ValueError(f"weights must be non-negative, got α={cost_weight}, β={latency_weight}")
    try:
        cost = np.asarray([float(f["cost"]) for f in features], dtype=np.float64)
        latency = np.asarray([float(f["latency"]) for f in features], dtype=np.float64)
    except KeyError as e:
        raise ValueError(
            f"efficiency reward needs 'cost' and 'latency' features: missing {e}"
        ) from None
    value = np.maximum(floor, 1.0 - cost_weight * cost - latency_weight * latency)
    return np.where(np.asarray(correct, dtype=bool), value, 0.0).astype(np.float32)


def utility_rewards(
    features: Sequence[Mapping[str, float]],
    correct: Sequence[bool],
    preference: Mapping[str, float],
    *,
    cost_scale: float,
    latency_scale: float,
) -> np.ndarray:
    """max(0, 1 − P_cost·cost/cost_scale − P_latency·latency/latency_scale) for
    correct episodes, 0 for wrong ones (see the module docstring)."""
    if cost_scale <= 0 or latency_scale <= 0:
        raise ValueError(
            f"scales must be positive, got cost_scale={cost_scale}, latency_scale={latency_scale}"
        )
    return efficiency_rewards(
        features,
        correct,
        cost_weight=preference.get("cost", 0.0) / cost_scale,
        latency_weight=preference.get("latency", 0.0) / latency_scale,
    )
