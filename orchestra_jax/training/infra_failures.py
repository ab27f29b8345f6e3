"""A step's (or an evaluation's) episodes that failed by infrastructure: counted,
named, and bounded.

An episode marked with `Trajectory.infra_failure` (`orchestra_jax/infra_failure.py`)
is left out of the loss and of its group's statistics (`rollouts.score_groups`)
and out of evaluation scores. This module counts them for the metrics

    rollout/infra_failed                  episodes of the step that failed so
    rollout/infra_failed/<kind>           … by kind (every kind of INFRA_KINDS)
    rollout/infra_failed_at/<endpoint>    … by endpoint (those that failed)

and stops a step where more than `rl.max_infra_failure_fraction` of the
episodes failed so (`check_fraction`): the error names every failing endpoint,
its kind, how many episodes it took and its last error.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from orchestra_jax.infra_failure import INFRA_KINDS, InfraFailure


class InfraFailureError(RuntimeError):
    """Too many of a step's episodes failed by infrastructure (`check_fraction`)."""


def failures(trajectories: Sequence[Any]) -> list[InfraFailure]:
    """The infrastructure failures of `trajectories`, in order (one per failed episode)."""
    return [t.infra_failure for t in trajectories if t.infra_failure is not None]


def metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """The counts of the module docstring."""
    found = failures(trajectories)
    kinds = collections.Counter(f.kind for f in found)
    out = {"rollout/infra_failed": float(len(found))}
    out.update({f"rollout/infra_failed/{kind}": float(kinds[kind]) for kind in INFRA_KINDS})
    endpoints = collections.Counter(f.endpoint for f in found)
    out.update({f"rollout/infra_failed_at/{e}": float(n) for e, n in sorted(endpoints.items())})
    return out


def describe(found: Sequence[InfraFailure]) -> str:
    """One clause per (kind, endpoint): how many episodes, and the last error."""
    by_source: dict[tuple[str, str], list[InfraFailure]] = collections.defaultdict(list)
    for failure in found:
        by_source[failure.kind, failure.endpoint].append(failure)
    return "; ".join(
        f"{kind} at {endpoint}: {len(items)} episode(s), last error: {items[-1].message}"
        for (kind, endpoint), items in sorted(by_source.items())
    )


def check_fraction(trajectories: Sequence[Any], max_fraction: float, *, what: str) -> None:
    """Raises `InfraFailureError` when more than `max_fraction` of `trajectories` failed
    by infrastructure, naming the failing endpoints (`describe`); `what` names the
    episodes ("the step's episodes", "the evaluation of 'grpo'")."""
    found = failures(trajectories)
    if trajectories and len(found) > max_fraction * len(trajectories):
        raise InfraFailureError(
            f"{len(found)} of {len(trajectories)} of {what} failed by infrastructure, "
            f"more than rl.max_infra_failure_fraction={max_fraction:g}: {describe(found)}"
        )


def summary(trajectories: Sequence[Any]) -> dict[str, Any]:
    """An evaluation summary's account of its infrastructure failures: how many
    episodes, by kind and by endpoint (those episodes are left out of its scores)."""
    found = failures(trajectories)
    return {
        "infra_failed": len(found),
        "infra_failed_by_kind": dict(sorted(collections.Counter(f.kind for f in found).items())),
        "infra_failed_by_endpoint": dict(
            sorted(collections.Counter(f.endpoint for f in found).items())
        ),
    }
