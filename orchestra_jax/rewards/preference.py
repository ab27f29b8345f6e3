"""The paper's preference-weighted reward (ToolOrchestra, §3 "Reward").

For the G episodes of one task, each episode i has features x_i,f:
  "tool:<name>"  how many times it called that tool / model alias,
  "accuracy"     1 if its answer is right else 0,
  "cost"         dollars spent (tools + orchestrator tokens),
  "latency"      seconds taken.
Cost and latency are "less is better", so they enter as v = −x; tool counts and
accuracy as v = x. Each feature is min-max normalised over the group,

    norm_i,f = (v_i,f − min_j v_j,f) / (max_j v_j,f − min_j v_j,f),

a term being skipped when max == min (it carries no preference signal there).
With the task's preference vector P,

    R_i = Σ_f P_f · norm_i,f   if episode i is correct,   R_i = 0 otherwise.

Sign convention vs the released code: the reference implementation negates cost
and latency when taking the group min/max but divides the *un*-negated value,
so its normalised cost is not in [0, 1] and rises with spending. Here the
negation is applied everywhere, so the cheapest/fastest episode of the group
gets norm = 1 and the most expensive/slowest norm = 0, for every feature alike.
Normalisation runs over all G episodes, wrong ones included, as in the paper.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

LOWER_IS_BETTER = ("cost", "latency")
PLAIN_FEATURES = ("accuracy",) + LOWER_IS_BETTER
TOOL_PREFIX = "tool:"


def check_feature_name(name: str) -> None:
    """Feature names are "accuracy", "cost", "latency" or "tool:<name>"."""
    if name not in PLAIN_FEATURES and not (name.startswith(TOOL_PREFIX) and len(name) > 5):
        raise ValueError(
            f"unknown reward feature {name!r}: expected one of {PLAIN_FEATURES} or 'tool:<name>'"
        )


def oriented_feature(
    features: Sequence[Mapping[str, float]], correct: Sequence[bool], name: str
) -> np.ndarray:
    """v_i = x_i,f ("more is better" orientation); −x for cost and latency.

    A tool an episode never called counts 0; a missing "accuracy" is taken from
    `correct`; a missing "cost"/"latency" is an error (it cannot be guessed).
    """
    values = []
    for i, episode in enumerate(features):
        if name in episode:
            values.append(float(episode[name]))
        elif name == "accuracy":
            values.append(1.0 if correct[i] else 0.0)
        elif name.startswith(TOOL_PREFIX):
            values.append(0.0)
        else:
            raise ValueError(f"episode {i} of the group has no {name!r} feature")
    v = np.asarray(values, dtype=np.float64)
    return -v if name in LOWER_IS_BETTER else v


def min_max_normalise(values: np.ndarray) -> np.ndarray | None:
    """(v − min v) / (max v − min v), or None when max == min (the term is skipped)."""
    lo, hi = values.min(), values.max()
    if hi == lo:
        return None
    return (values - lo) / (hi - lo)


def preference_rewards(
    features: Sequence[Mapping[str, float]],
    correct: Sequence[bool],
    preference: Mapping[str, float],
) -> np.ndarray:
    """R_i = [correct_i] · Σ_f P_f · norm_i,f over one group (see module docstring).

    Args:
      features: one mapping per episode of the group (e.g. `Trajectory.features()`).
      correct: whether each episode's answer is right.
      preference: P, weights keyed by feature name; features not in P are ignored.

    Returns:
      float32 rewards, one per episode.
    """
    if len(features) != len(correct):
        raise ValueError(f"{len(features)} feature rows but {len(correct)} correctness flags")
    if not features:
        raise ValueError("a reward group needs at least one episode")
    rewards = np.zeros(len(features), dtype=np.float64)
    for name, weight in preference.items():
        check_feature_name(name)
        if weight == 0:
            continue
        norm = min_max_normalise(oriented_feature(features, correct, name))
        if norm is not None:
            rewards += weight * norm
    return np.where(np.asarray(correct, dtype=bool), rewards, 0.0).astype(np.float32)
