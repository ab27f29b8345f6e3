"""pass^k: how reliably a policy solves a task in every one of k trials (τ²-bench's metric).

For a task played in n trials with c successes, the chance that k trials drawn
without replacement all succeed is

    pass^k(task) = C(c, k) / C(n, k)                       (k <= n)

and a policy's pass^k is its mean over tasks (Yao et al. 2024, arXiv
2406.12045; τ²-bench's leaderboard reports pass^1 .. pass^4). pass^1 is the
success rate. `pass_k_by_domain` reports pass^1 .. pass^n per task domain and
over all tasks, where n is the most trials any task of the group had: each task
counts towards pass^k for every k up to its own number of trials, so a task that
lost an episode (an infrastructure failure, left out of the scores) leaves the
other tasks' pass^k as it was and drops out of its own highest k alone.
`pass_k_task_counts` says how many tasks each pass^k is the mean over.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any


def pass_hat_k(num_trials: int, successes: int, k: int) -> float:
    """C(successes, k) / C(num_trials, k); ValueError unless 0 <= successes <= num_trials
    and 1 <= k <= num_trials."""
    if not 0 <= successes <= num_trials or not 1 <= k <= num_trials:
        raise ValueError(
            f"need 0 <= successes <= num_trials and 1 <= k <= num_trials, "
            f"got {successes}, {num_trials}, k={k}"
        )
    return math.comb(successes, k) / math.comb(num_trials, k)


def _tasks(trajectories: Sequence[Any]) -> tuple[dict[str, list[bool]], dict[str, list[str]]]:
    """Each task's trial outcomes, and the tasks of each group ("all" and each domain,
    `metadata["domain"]`)."""
    trials: dict[str, list[bool]] = collections.defaultdict(list)
    domain_of: dict[str, str] = {}
    for t in trajectories:
        if t.correct is None:
            raise ValueError(f"trajectory {t.task_id}/{t.group_index} is not graded")
        trials[t.task_id].append(bool(t.correct))
        domain_of[t.task_id] = str(t.metadata.get("domain", "all"))
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for task_id in trials:
        groups["all"].append(task_id)
        groups[domain_of[task_id]].append(task_id)
    return trials, dict(sorted(groups.items()))


def pass_k_by_domain(trajectories: Sequence[Any]) -> dict[str, dict[str, float]]:
    """{"all": {"pass^1": ..., ...}, "<domain>": {...}} over graded episodes, grouped
    into tasks by `task_id` (the domain is `metadata["domain"]`): pass^k is the mean
    over the group's tasks with at least k trials (see the module docstring)."""
    trials, groups = _tasks(trajectories)
    table = {}
    for group, ids in groups.items():
        table[group] = {}
        for k in range(1, max(len(trials[i]) for i in ids) + 1):
            played = [i for i in ids if len(trials[i]) >= k]
            total = sum(pass_hat_k(len(trials[i]), sum(trials[i]), k) for i in played)
            table[group][f"pass^{k}"] = total / len(played)
    return table


def pass_k_task_counts(trajectories: Sequence[Any]) -> dict[str, dict[str, int]]:
    """How many tasks each entry of `pass_k_by_domain` is the mean over: the group's
    tasks with at least k trials."""
    trials, groups = _tasks(trajectories)
    return {
        group: {
            f"pass^{k}": sum(len(trials[i]) >= k for i in ids)
            for k in range(1, max(len(trials[i]) for i in ids) + 1)
        }
        for group, ids in groups.items()
    }
