"""τ²-bench tasks (a tau2 domain folder, or ToolScale rows) → `Task`s the "tau2" env plays.

A tau2 task row: `id`, `description`, `user_scenario{persona, instructions}`,
`ticket`, `initial_state`, `evaluation_criteria{actions, env_assertions,
communicate_info, nl_assertions, reward_basis}` (tau2's `Task` schema;
ToolScale, HF `nvidia/ToolScale`, uses the same one). `instructions` is free
text or structured (`domain`, `reason_for_call`, `known_info`,
`unknown_info`, `task_instructions`). Parquet exports may hold the nested
objects as JSON strings; both layouts read the same.

The `Task` keeps the whole row in `metadata["tau2_task"]` and its domain in
`metadata["tau2_domain"]`; `metadata["env"] = "tau2"` routes it to the τ²
environment (`envs/routing.py`), which rebuilds tau2's own task from the row,
plays it with tau2's environment and user simulator and grades it with tau2's
evaluator (`answer_type="environment"`). The user's scenario is hidden from the
policy: `question` only names the domain and the task.

Sources: a domain folder (`tasks.json`, optionally `split_tasks.json`, whose
`split` option picks a split such as "train" or "test"; the folder's name is
the domain), or a `.json`, `.jsonl` or `.parquet` file of rows (ToolScale),
whose domain is the structured instructions' `domain`, else the `domain` option.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from orchestra_jax.data.rows import MalformedRow, ReadReport, maybe_json, read_file, text_field
from orchestra_jax.tasks import Task

# tau2's `Task` fields; nested ones may arrive JSON-encoded.
TASK_FIELDS = (
    "id",
    "description",
    "user_scenario",
    "ticket",
    "initial_state",
    "evaluation_criteria",
    "issues",
    "required_documents",
    "user_tools",
)


def tau2_task(row: dict, where: str, *, domain: str | None = None, source: str = "tau2") -> Task:
    """One tau2 task row → `Task` (see the module docstring)."""
    del where
    task_id = text_field(row, "id")
    fields = {k: maybe_json(row[k]) for k in TASK_FIELDS if row.get(k) is not None}
    fields["id"] = task_id
    scenario = fields.get("user_scenario")
    if not isinstance(scenario, dict):
        raise MalformedRow("missing object field 'user_scenario'")
    instructions = maybe_json(scenario.get("instructions"))
    if isinstance(instructions, str) and instructions.strip():
        task_domain = domain
    elif isinstance(instructions, dict):
        task_domain = instructions.get("domain") or domain
    else:
        raise MalformedRow("user_scenario.instructions must be text or an object")
    fields["user_scenario"] = {**scenario, "instructions": instructions}
    criteria = fields.get("evaluation_criteria")
    if not isinstance(criteria, dict):
        raise MalformedRow("missing object field 'evaluation_criteria'")
    if not task_domain:
        raise MalformedRow("no τ² domain: the instructions name none; give the reader `domain`")
    return Task(
        id=f"tau2/{task_domain}/{task_id}",
        question=f"A conversation with a customer of the τ² {task_domain} domain (task {task_id}).",
        answer=json.dumps(criteria, sort_keys=True, ensure_ascii=False),
        answer_type="environment",
        domain=str(task_domain),
        metadata={
            "env": "tau2",
            "tau2_domain": str(task_domain),
            "tau2_task": fields,
            "source": source,
        },
    )


def read_tau2_tasks(
    path: str | os.PathLike,
    *,
    domain: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    source: str = "tau2",
) -> tuple[list[Task], ReadReport]:
    """Tasks of a tau2 domain folder or a task file (module docstring); bad rows are
    counted in the report, not raised."""
    path = pathlib.Path(path)
    if path.is_dir():
        tasks_file = path / "tasks.json"
        if not tasks_file.exists():
            raise FileNotFoundError(f"{path} is not a τ² domain folder (no tasks.json)")
        domain = domain or path.name
        keep = _split_ids(path, split)
        tasks, report = read_file(
            tasks_file,
            lambda row, where: _in_split(row, keep, domain, source, where),
            limit=limit,
        )
        report.source = f"{path}" + (f":{split}" if split else "")
        return tasks, report
    if split is not None:
        raise ValueError(f"split={split!r} needs a τ² domain folder with split_tasks.json")
    return read_file(
        path, lambda row, where: tau2_task(row, where, domain=domain, source=source), limit=limit
    )


def _split_ids(folder: pathlib.Path, split: str | None) -> set[str] | None:
    if split is None:
        return None
    split_file = folder / "split_tasks.json"
    if not split_file.exists():
        raise FileNotFoundError(f"split={split!r}: {folder} has no split_tasks.json")
    splits: dict[str, Any] = json.loads(split_file.read_text(encoding="utf-8"))
    if split not in splits:
        raise ValueError(f"split {split!r} not in {split_file}: {sorted(splits)}")
    return {str(i) for i in splits[split]}


def _in_split(
    row: dict, keep: set[str] | None, domain: str, source: str, where: str
) -> Task | None:
    if keep is not None and str(row.get("id")) not in keep:
        return None  # another split's task: skipped, not malformed
    return tau2_task(row, where, domain=domain, source=source)
