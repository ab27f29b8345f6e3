"""The paper's third axis: do a policy's choices move with the stated preference?

The same held-out tasks are played under two preference vectors that differ only
in the weight of cost (`PREFERENCE_VECTORS`): "cost_heavy" asks for a correct
answer at low cost, "accuracy_heavy" for a correct answer whatever it costs. For
each policy and vector the report gives the models called (calls per
`<tool>/<backend>`), accuracy, mean cost and the preference score: the mean
held-out utility under that vector,

    correct × max(0, 1 − P_cost·cost/cost_scale − P_latency·latency/latency_scale).

A policy follows the preference when it spends less where the user asked for low
cost. Its *cost saved* is the mean over tasks of cost under "accuracy_heavy"
minus cost under "cost_heavy" (paired task by task), with its standard error. The
verdict compares the trained policy's saving with its warm start's, paired by
task: better (or worse) only where the difference exceeds `Z` standard errors.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orchestra_jax.rewards.efficiency import utility_rewards

PREFERENCE_VECTORS: dict[str, dict[str, float]] = {
    # The top of training's cost-weight range, no latency term.
    "cost_heavy": {"accuracy": 1.0, "cost": 1.0, "latency": 0.0},
    # Accuracy alone (training's "efficiency off" tasks).
    "accuracy_heavy": {"accuracy": 1.0, "cost": 0.0, "latency": 0.0},
}
# Standard errors a difference must exceed to count.
Z = 2.0


@dataclasses.dataclass(frozen=True)
class Cell:
    """One policy's episodes under one preference vector."""

    policy: str
    preference: str
    episodes: int
    models_called: dict[str, int]
    accuracy: float
    mean_cost_usd: float
    preference_score: float


@dataclasses.dataclass(frozen=True)
class Saving:
    """Mean over tasks of a policy's cost under "accuracy_heavy" minus under "cost_heavy"."""

    policy: str
    cost_saved_usd: float
    stderr_usd: float
    tasks: int

    @property
    def follows(self) -> bool:
        return self.cost_saved_usd > Z * self.stderr_usd


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The trained policy's saving minus its warm start's, paired by task."""

    trained: str
    start: str
    difference_usd: float
    stderr_usd: float
    text: str


@dataclasses.dataclass(frozen=True)
class PreferenceAxisReport:
    cells: list[Cell]
    savings: list[Saving]
    verdict: Verdict


def model_of(feature: str, tool_config: Any | None) -> str:
    """`<tool>/<backend>` of a call feature (`tool:<alias>`) under the task's tool
    configuration; the alias itself where the configuration does not know it."""
    name = feature.removeprefix("tool:")
    if tool_config is None:
        return name
    try:
        alias = tool_config.alias(name)
    except KeyError:
        return name
    return f"{alias.tool}/{alias.backend}"


def models_called(trajectories: Sequence[Any], tool_configs: Mapping[str, Any]) -> dict[str, int]:
    """Calls per `<tool>/<backend>` over the episodes, in name order (models never
    called left out)."""
    counts: collections.Counter[str] = collections.Counter()
    for t in trajectories:
        for feature, n in t.tool_call_counts.items():
            if feature.startswith("tool:") and n:
                counts[model_of(feature, tool_configs.get(t.task_id))] += n
    return {k: counts[k] for k in sorted(counts)}


def cell(
    policy: str,
    preference: str,
    trajectories: Sequence[Any],
    tool_configs: Mapping[str, Any],
    *,
    cost_scale: float,
    latency_scale: float,
) -> Cell:
    """The report's row for `policy` under `PREFERENCE_VECTORS[preference]`; every
    episode must have been played under that vector."""
    vector = PREFERENCE_VECTORS[preference]
    if not trajectories:
        raise ValueError(f"no episodes of {policy!r} under {preference!r}")
    for t in trajectories:
        if dict(t.preference) != vector:
            raise ValueError(
                f"episode {t.task_id} of {policy!r} was played under {t.preference}, "
                f"not {preference!r} {vector}"
            )
    scores = np.concatenate(
        [
            utility_rewards(
                [t.features()],
                [bool(t.correct)],
                vector,
                cost_scale=cost_scale,
                latency_scale=latency_scale,
            )
            for t in trajectories
        ]
    )
    return Cell(
        policy=policy,
        preference=preference,
        episodes=len(trajectories),
        models_called=models_called(trajectories, tool_configs),
        accuracy=float(np.mean([bool(t.correct) for t in trajectories])),
        mean_cost_usd=float(np.mean([t.cost_usd for t in trajectories])),
        preference_score=float(scores.mean()),
    )


def _cost_by_task(trajectories: Sequence[Any]) -> dict[str, float]:
    return {t.task_id: float(t.cost_usd) for t in trajectories}


def _savings_by_task(episodes: Mapping[str, Sequence[Any]]) -> dict[str, float]:
    """task id -> cost under "accuracy_heavy" − cost under "cost_heavy" (shared tasks)."""
    accurate = _cost_by_task(episodes["accuracy_heavy"])
    cheap = _cost_by_task(episodes["cost_heavy"])
    return {task: accurate[task] - cheap[task] for task in sorted(set(accurate) & set(cheap))}


def _mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        raise ValueError(f"a paired comparison needs at least 2 shared tasks, got {len(x)}")
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x)))


def saving(policy: str, episodes: Mapping[str, Sequence[Any]]) -> Saving:
    """`policy`'s cost saved when asked for low cost (`episodes`: preference -> episodes)."""
    by_task = _savings_by_task(episodes)
    mean, stderr = _mean_and_stderr(list(by_task.values()))
    return Saving(policy=policy, cost_saved_usd=mean, stderr_usd=stderr, tasks=len(by_task))


def _describe(s: Saving) -> str:
    return f"{s.policy} spends ${s.cost_saved_usd:+.4f} ± {s.stderr_usd:.4f} less a task"


def verdict(
    trained: str,
    start: str,
    episodes: Mapping[str, Mapping[str, Sequence[Any]]],
) -> Verdict:
    """Whether `trained` follows the preference better than `start`, in words."""
    a, b = _savings_by_task(episodes[trained]), _savings_by_task(episodes[start])
    tasks = sorted(set(a) & set(b))
    diff, stderr = _mean_and_stderr([a[t] - b[t] for t in tasks])
    s_trained, s_start = saving(trained, episodes[trained]), saving(start, episodes[start])
    if diff > Z * stderr:
        head = f"{trained} follows the stated preference better than {start}"
    elif diff < -Z * stderr:
        head = f"{trained} follows the stated preference less than {start}"
    else:
        head = f"{trained} does not follow the stated preference measurably better than {start}"
    text = (
        f"{head}: asked for low cost rather than accuracy, {_describe(s_trained)}, "
        f"{_describe(s_start)} (difference ${diff:+.4f} ± {stderr:.4f} over {len(tasks)} "
        f"tasks; counted beyond {Z:g} standard errors)."
    )
    return Verdict(trained=trained, start=start, difference_usd=diff, stderr_usd=stderr, text=text)


def build_report(
    episodes: Mapping[str, Mapping[str, Sequence[Any]]],
    tool_configs: Mapping[str, Any],
    *,
    cost_scale: float,
    latency_scale: float,
    trained: str = "grpo",
    start: str = "warm_start",
) -> PreferenceAxisReport:
    """The report over `episodes` (policy -> preference name -> graded episodes),
    policies in the order given, vectors in `PREFERENCE_VECTORS`' order."""
    cells = [
        cell(
            policy,
            name,
            by_vector[name],
            tool_configs,
            cost_scale=cost_scale,
            latency_scale=latency_scale,
        )
        for policy, by_vector in episodes.items()
        for name in PREFERENCE_VECTORS
    ]
    savings = [saving(policy, by_vector) for policy, by_vector in episodes.items()]
    return PreferenceAxisReport(
        cells=cells, savings=savings, verdict=verdict(trained, start, episodes)
    )


def to_markdown(report: PreferenceAxisReport) -> str:
    """The report as a Markdown table, the savings and the verdict."""
    lines = [
        "| policy | preference | models called | accuracy | cost (USD) | preference score |",
        "|---|---|---|---|---|---|",
    ]
    for c in report.cells:
        called = ", ".join(f"{m} {n}" for m, n in c.models_called.items()) or "none"
        lines.append(
            f"| {c.policy} | {c.preference} | {called} | {c.accuracy:.3f} | "
            f"{c.mean_cost_usd:.4f} | {c.preference_score:.3f} |"
        )
    lines.append("")
    for s in report.savings:
        follows = "follows" if s.follows else "does not measurably follow"
        lines.append(f"- {_describe(s)} under cost_heavy: it {follows} the preference.")
    lines += ["", f"**{report.verdict.text}**", ""]
    return "\n".join(lines)
