"""ToolScale tasks (tau2-bench task schema) → `Task`.

A tau2 task row: `id`, `description{purpose, relevant_policies, notes}`,
`user_scenario{persona, instructions}`, `initial_state`,
`evaluation_criteria{actions[{action_id, name, arguments}], communicate_info,
nl_assertions}`. `instructions` is free text or structured
(`task_instructions`, `reason_for_call`, `known_info`, `unknown_info`,
`domain`). Parquet exports may hold the nested objects as JSON strings; both
layouts read the same.
"""

from __future__ import annotations

import json
from typing import Any

from orchestra_jax.data.rows import MalformedRow, maybe_json, text_field
from orchestra_jax.envs.base import Task


def toolscale_task(row: dict, where: str) -> Task:
    """tau2 task → Task. The evaluation criteria (actions, communicate_info,
    nl_assertions) are the answer a judge compares the episode against."""
    task_id = text_field(row, "id")
    scenario = maybe_json(row.get("user_scenario"))
    if not isinstance(scenario, dict):
        raise MalformedRow("missing object field 'user_scenario'")
    instructions = maybe_json(scenario.get("instructions"))
    question = _render_instructions(instructions)
    criteria = maybe_json(row.get("evaluation_criteria"))
    if not isinstance(criteria, dict):
        raise MalformedRow("missing object field 'evaluation_criteria'")
    tau2_domain = instructions.get("domain") if isinstance(instructions, dict) else None
    return Task(
        id=task_id,
        question=question,
        answer=json.dumps(criteria, sort_keys=True, ensure_ascii=False),
        answer_type="judge",
        domain="toolscale",
        metadata={
            "source": "toolscale",
            "tau2_domain": tau2_domain,
            "persona": scenario.get("persona"),
            "description": maybe_json(row.get("description")),
            "initial_state": maybe_json(row.get("initial_state")),
            "evaluation_criteria": criteria,
        },
    )


# tau2 `StructuredUserInstructions` fields, in the order a reader meets them.
_INSTRUCTION_SECTIONS = (
    ("reason_for_call", "Reason for call"),
    ("known_info", "Known info"),
    ("unknown_info", "Unknown info"),
    ("task_instructions", "Task instructions"),
)


def _render_instructions(instructions: Any) -> str:
    """tau2 instructions (free text, or structured sections) → one text block."""
    if isinstance(instructions, str) and instructions.strip():
        return instructions
    if not isinstance(instructions, dict):
        raise MalformedRow("user_scenario.instructions must be text or an object")
    sections = [
        f"{title}: {instructions[key]}"
        for key, title in _INSTRUCTION_SECTIONS
        if instructions.get(key)
    ]
    if not sections:
        raise MalformedRow("user_scenario.instructions has no text")
    return "\n".join(sections)
