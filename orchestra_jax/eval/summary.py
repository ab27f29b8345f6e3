"""Evaluation summaries: accuracy, cost, latency and preference-following of a policy.

`summarize(trajectories, tool_configs)` reduces graded episodes to the numbers
the paper reports per policy (accuracy, mean cost, mean latency) plus the
tool-call mix and a preference score, the paper's third axis.

Preference score of one episode, over the tool features `tool:<x>` of its
stated preference P (episodes whose P weighs no tool are skipped):

    score = sum_t P_t * n_t / max(1, sum_t n_t) / max_t |P_t|        in [-1, 1]

where n_t counts the episode's calls of tool feature t. +1: every call went to
the most preferred tool; -1: every call went to a tool the user asked to avoid.
The policy's `preference_score` is the mean over scored episodes (None when no
episode states a tool preference).

`by_domain` repeats accuracy, cost, latency and backend mix per task domain
(the task's `metadata["domain"]`): whether a policy's choice of model depends on
the question shows there, not in the pooled mix. `by_category` does the same per
benchmark category (HLE's `category`), where the caller gives the tasks'
categories. `tool_errors` / `expert_errors` count failed calls per episode
(an expert error: the endpoint failed after its retries).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def episode_preference_score(
    tool_call_counts: Mapping[str, int], preference: Mapping[str, float]
) -> float | None:
    """The formula of the module docstring for one episode; None if P has no tool term."""
    weights = {k: float(v) for k, v in preference.items() if k.startswith("tool:") and v != 0}
    if not weights:
        return None
    total_calls = sum(n for k, n in tool_call_counts.items() if k.startswith("tool:"))
    aligned = sum(weights.get(k, 0.0) * n for k, n in tool_call_counts.items())
    return aligned / max(1, total_calls) / max(abs(w) for w in weights.values())


def backend_mix(trajectories: Sequence[Any], tool_configs: Mapping[str, Any]) -> dict[str, float]:
    """Share of all calls per `<tool>/<backend>` (alias names vary per config)."""
    counts: collections.Counter = collections.Counter()
    for traj in trajectories:
        config = tool_configs.get(traj.task_id)
        for feature, n in traj.tool_call_counts.items():
            name = feature.removeprefix("tool:")
            key = name
            if config is not None:
                try:
                    alias = config.alias(name)
                    key = f"{alias.tool}/{alias.backend}"
                except KeyError:
                    pass
            counts[key] += n
    total = sum(counts.values())
    return {k: counts[k] / total for k in sorted(counts)} if total else {}


def _groups(
    trajectories: Sequence[Any],
    key: Callable[[Any], str | None],
    correct: np.ndarray,
    cost: np.ndarray,
    latency: np.ndarray,
    tool_configs: Mapping[str, Any],
) -> dict[str, dict[str, Any]]:
    """Accuracy, mean cost, mean latency and backend mix per value of `key` (None: left out)."""
    groups: dict[str, list[int]] = collections.defaultdict(list)
    for i, t in enumerate(trajectories):
        value = key(t)
        if value is not None:
            groups[value].append(i)
    return {
        g: {
            "num_episodes": len(idx),
            "accuracy": float(correct[idx].mean()),
            "mean_cost_usd": float(cost[idx].mean()),
            "mean_latency_s": float(latency[idx].mean()),
            "backend_mix": backend_mix([trajectories[i] for i in idx], tool_configs),
        }
        for g, idx in sorted(groups.items())
    }


def summarize(
    trajectories: Sequence[Any],
    *,
    tool_configs: Mapping[str, Any] | None = None,
    categories: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Per-policy evaluation numbers from graded trajectories (`correct` set).

    Args:
      trajectories: episodes of one policy on one evaluation split.
      tool_configs: task id -> ToolConfig, to report the mix by backend.
      categories: task id -> benchmark category, for `by_category` (tasks not
        listed are left out of it; no `by_category` without it).
    """
    if not trajectories:
        raise ValueError("summarize needs at least one trajectory")
    ungraded = [t.task_id for t in trajectories if t.correct is None]
    if ungraded:
        raise ValueError(f"{len(ungraded)} trajectories are not graded, e.g. {ungraded[0]}")
    correct = np.array([bool(t.correct) for t in trajectories], dtype=np.float64)
    cost = np.array([t.cost_usd for t in trajectories], dtype=np.float64)
    latency = np.array([t.latency_s for t in trajectories], dtype=np.float64)
    scores = [
        s
        for s in (episode_preference_score(t.tool_call_counts, t.preference) for t in trajectories)
        if s is not None
    ]
    calls: collections.Counter = collections.Counter()
    for t in trajectories:
        calls.update(t.tool_call_counts)
    total_calls = sum(calls.values())
    rewards = [t.reward for t in trajectories if t.reward is not None]
    results = [r for t in trajectories for turn in t.turns for r in turn.tool_results]
    out = {
        "num_episodes": len(trajectories),
        "accuracy": float(correct.mean()),
        "accuracy_stderr": float(correct.std(ddof=1) / np.sqrt(len(correct)))
        if len(correct) > 1
        else 0.0,
        "mean_cost_usd": float(cost.mean()),
        "mean_latency_s": float(latency.mean()),
        "mean_reward": float(np.mean(rewards)) if rewards else None,
        "tool_call_mix": {k: calls[k] / total_calls for k in sorted(calls)} if total_calls else {},
        "backend_mix": backend_mix(trajectories, tool_configs or {}),
        "mean_tool_calls": total_calls / len(trajectories),
        "preference_score": float(np.mean(scores)) if scores else None,
        "num_preference_scored": len(scores),
        "format_valid_rate": float(np.mean([t.format_valid for t in trajectories])),
        "answered_rate": float(np.mean([t.finish_reason == "answer" for t in trajectories])),
        "tool_errors": sum(r.error is not None for r in results) / len(trajectories),
        "expert_errors": sum(bool(r.metadata.get("expert_failed")) for r in results)
        / len(trajectories),
        "by_domain": _groups(
            trajectories,
            lambda t: str(t.metadata.get("domain", "all")),
            correct,
            cost,
            latency,
            tool_configs or {},
        ),
    }
    if categories is not None:
        out["by_category"] = _groups(
            trajectories,
            lambda t: categories.get(t.task_id),
            correct,
            cost,
            latency,
            tool_configs or {},
        )
    return out
