"""pass^k: how reliably a policy solves a task in every one of k trials (τ²-bench's metric).

For a task played in n trials with c successes, the chance that k trials drawn
without replacement all succeed is

    pass^k(task) = C(c, k) / C(n, k)                       (k <= n)

and a policy's pass^k is its mean over tasks (Yao et al. 2024, arXiv
2406.12045; τ²-bench's leaderboard reports pass^1 .. pass^4). pass^1 is the
success rate. `pass_k_by_domain` reports pass^1 .. pass^n per task domain and
over all tasks, where n is the fewest trials any task had.
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


def pass_k_by_domain(trajectories: Sequence[Any]) -> dict[str, dict[str, float]]:
    """{"all": {"pass^1": ..., ...}, "<domain>": {...}} over graded episodes, grouped
    into tasks by `task_id` (the domain is `metadata["domain"]`)."""
    trials: dict[str, list[bool]] = collections.defaultdict(list)
    domain_of: dict[str, str] = {}
    for t in trajectories:
        if t.correct is None:
            raise ValueError(f"trajectory {t.task_id}/{t.group_index} is not graded")
        trials[t.task_id].append(bool(t.correct))
        domain_of[t.task_id] = str(t.metadata.get("domain", "all"))
    if not trials:
        return {}
    n = min(len(outcomes) for outcomes in trials.values())
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for task_id in trials:
        groups["all"].append(task_id)
        groups[domain_of[task_id]].append(task_id)
    return {
        group: {
            f"pass^{k}": sum(pass_hat_k(len(trials[i]), sum(trials[i]), k) for i in ids) / len(ids)
            for k in range(1, n + 1)
        }
        for group, ids in sorted(groups.items())
    }
