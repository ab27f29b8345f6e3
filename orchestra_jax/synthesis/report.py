"""The synthesis run's report: per stage, outputs kept, rejects by reason, calls, tokens, cost.

`report.json` holds everything (`Report.to_dict`); `report.md` a table a
person reads. Rejects keep their first few details per reason, so a reason
that fires on every output can be diagnosed from the report alone.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
from typing import Any

from orchestra_jax.synthesis.call_cache import Ledger
from orchestra_jax.synthesis.outputs import REASONS, Rejected

EXAMPLES_PER_REASON = 3


@dataclasses.dataclass
class StageOutcome:
    """What one stage kept and rejected, and the seconds its validation took."""

    kept: int = 0
    rejected: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    validation_s: float = 0.0
    validated: int = 0  # outputs that reached validation (probes included)


class Report:
    """Outcomes per stage (in order of first use) and the generator's ledger."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.stages: dict[str, StageOutcome] = {}

    def stage(self, name: str) -> StageOutcome:
        return self.stages.setdefault(name, StageOutcome())

    def keep(self, stage: str, n: int = 1) -> None:
        self.stage(stage).kept += n

    def reject(self, stage: str, rejected: Rejected, where: str) -> None:
        outcome = self.stage(stage)
        outcome.rejected[rejected.reason] += 1
        examples = outcome.examples.setdefault(rejected.reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(f"{where}: {rejected.detail}"[:500])

    def timed(self, stage: str, seconds: float, n: int) -> None:
        outcome = self.stage(stage)
        outcome.validation_s += seconds
        outcome.validated += n

    def to_dict(self) -> dict[str, Any]:
        usage = self.ledger.to_dict()
        stages = {}
        for name in list(self.stages) + [n for n in usage if n not in self.stages]:
            o = self.stages.get(name, StageOutcome())
            stages[name] = {
                "kept": o.kept,
                "rejected": dict(sorted(o.rejected.items())),
                "reject_examples": o.examples,
                "validation_s": round(o.validation_s, 3),
                "validated": o.validated,
                "usage": usage.get(name, {}),
            }
        totals = dataclasses.asdict(self.ledger.totals())
        return {"stages": stages, "totals": totals}

    def write(self, directory: str | pathlib.Path, extra: dict[str, Any] | None = None) -> None:
        directory = pathlib.Path(directory)
        data = {**self.to_dict(), **(extra or {})}
        (directory / "report.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
        (directory / "report.md").write_text(markdown(data), encoding="utf-8")


def markdown(data: dict[str, Any]) -> str:
    """The report as a markdown table, then the reasons' legend."""
    lines = [
        "# Synthesis report",
        "",
        "| stage | kept | rejected (by reason) | calls paid / reused | tokens in / out | USD |",
        "|---|---|---|---|---|---|",
    ]
    reasons: set[str] = set()
    for name, s in data["stages"].items():
        u = s["usage"] or {}
        rejected = ", ".join(f"{r} {n}" for r, n in s["rejected"].items()) or "-"
        reasons.update(s["rejected"])
        lines.append(
            f"| {name} | {s['kept']} | {rejected} | {u.get('paid_calls', 0)} / "
            f"{u.get('reused_calls', 0)} | {u.get('prompt_tokens', 0)} / "
            f"{u.get('completion_tokens', 0)} | {u.get('cost_usd', 0.0):.4f} |"
        )
    t = data["totals"]
    lines += [
        "",
        f"This run paid {t['paid_calls']} calls (USD {t['cost_usd']:.4f}) and reused "
        f"{t['reused_calls']} from earlier runs (USD {t['reused_cost_usd']:.4f} when made).",
    ]
    if "tasks_written" in data:
        lines.append(f"Tasks written: {data['tasks_written']} to {data.get('tasks_file', '')}.")
    if reasons:
        lines += ["", "Reasons:", ""]
        lines += [f"- `{r}`: {REASONS.get(r, '')}" for r in sorted(reasons)]
    return "\n".join(lines) + "\n"
