"""What each stage's reply must contain, and how it is read: JSON against its schema, code.

A reply that cannot be used raises `Rejected(reason, detail)`; the reason is
one of `REASONS`, counted in the report. JSON is read from the reply's first
```json fenced block, else from its outermost `{…}` or `[…]`; code from its
first ```python block, compiled (never run) to reject syntax errors early.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

# Every reason an output is rejected for, with what it means (the report's legend).
REASONS = {
    "invalid_json": "the reply holds no parsable JSON",
    "schema_mismatch": "the JSON does not match the stage's schema",
    "no_code_block": "the reply holds no ```python block",
    "code_syntax_error": "the code does not compile",
    "data_model_invalid": "data_model.py does not import or defines no single DB class",
    "entries_mismatch_data_model": "the database entries do not validate against the data model",
    "duplicate_entry": "an entry's id is already in the database (later batch dropped)",
    "tools_import_error": "tools.py does not import or defines no single ToolKitBase",
    "no_tools": "tools.py defines no tool",
    "tool_without_example": "a tool has no example call",
    "tool_raises": "a tool's example call raises on the database",
    "policy_too_short": "the policy is shorter than the minimum",
    "task_schema": "the task does not validate as a tau2 Task",
    "unknown_tool": "a gold action names no tool of the domain",
    "gold_action_fails": "a gold action raises on a fresh copy of the database",
    "db_change_mismatch": "the gold actions do (not) change the database, against the task's claim",
    "domain_invalid": "the domain's code does not build an environment",
    "replay_not_deterministic": "two replays of the gold actions end in different databases "
    "(a tool uses the clock, random ids or outside state; tau2's hash can never match)",
    "communicate_info_vague": "a fact the agent must communicate is too short to mean anything "
    "when found by substring (fewer than MIN_FACT_CHARS letters or digits)",
    "timeout": "the probed code ran past its time limit",
    "crash": "the probed code (or its sandbox) ended without a result",
    "garbled_result": "the probe's answer is not a result of its request (the candidate's "
    "code wrote something else on its channel, or a malformed result)",
    "probe_error": "the probe itself failed (a bug: see the report's examples)",
    "generator_failed": "the generator call failed for good, after its retries (not stored: "
    "a rerun asks again)",
}


# A fact the agent must communicate is graded by tau2 as a case-insensitive substring of
# the agent's messages: one with fewer letters or digits than this ("4", "yes", "$12")
# is found in almost any reply and proves nothing.
MIN_FACT_CHARS = 4


def vague_facts(facts: list[str]) -> list[str]:
    """The `communicate_info` facts with fewer than `MIN_FACT_CHARS` letters or digits."""
    return [f for f in facts if sum(c.isalnum() for c in f) < MIN_FACT_CHARS]


class Rejected(ValueError):
    """An output that is not kept: `reason` (a `REASONS` key) and a detail."""

    def __init__(self, reason: str, detail: str):
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


_FENCE = re.compile(r"```(\w*)[ \t]*\n(.*?)```", re.DOTALL)


def extract_json(text: str, schema: dict[str, Any]) -> Any:
    """The reply's JSON, checked against `schema` (module docstring)."""
    candidates = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("json", "")]
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if starts:
        start = min(starts)
        end = max(text.rfind("}"), text.rfind("]"))
        if end > start:
            candidates.append(text[start : end + 1])
    value, error = None, "no JSON in the reply"
    for body in candidates:
        try:
            value = json.loads(body)
            break
        except ValueError as e:
            error = str(e)
    else:
        raise Rejected("invalid_json", error)
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(top)"
        raise Rejected("schema_mismatch", f"at {where}: {e.message}") from None
    return value


def extract_code(text: str, filename: str) -> str:
    """The reply's first ```python block, compiled (not run) as `filename`."""
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("python", "py")]
    if not blocks:
        raise Rejected("no_code_block", "no ```python block in the reply")
    code = blocks[0]
    try:
        compile(code, filename, "exec")
    except SyntaxError as e:
        raise Rejected("code_syntax_error", f"{filename}:{e.lineno}: {e.msg}") from None
    return code


_TEXT = {"type": "string"}
_NONEMPTY = {"type": "string", "minLength": 1}

SCHEMA_SCHEMA = {
    "type": "object",
    "required": ["tables"],
    "properties": {
        "tables": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {
                "type": "object",
                "required": ["description", "id_field", "fields"],
                "properties": {
                    "description": _TEXT,
                    "id_field": _NONEMPTY,
                    "fields": {
                        "type": "object",
                        "minProperties": 1,
                        "additionalProperties": {
                            "type": "object",
                            "required": ["type", "description"],
                            "properties": {"type": _NONEMPTY, "description": _TEXT},
                        },
                    },
                },
            },
        }
    },
}

ENTRIES_SCHEMA = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": {
        "type": "object",
        "additionalProperties": {"type": "object"},
    },
}

EXAMPLES_SCHEMA = {
    "type": "object",
    "required": ["examples"],
    "properties": {
        "examples": {"type": "object", "additionalProperties": {"type": "object"}},
    },
}

PURPOSES_SCHEMA = {
    "type": "object",
    "required": ["purposes"],
    "properties": {"purposes": {"type": "array", "minItems": 1, "items": _NONEMPTY}},
}

TASK_SCHEMA = {
    "type": "object",
    "required": [
        "user_scenario",
        "actions",
        "communicate_info",
        "nl_assertions",
        "changes_database",
    ],
    "properties": {
        "user_scenario": {
            "type": "object",
            "required": ["reason_for_call", "known_info", "unknown_info", "task_instructions"],
            "properties": {
                "persona": _TEXT,
                "reason_for_call": _NONEMPTY,
                "known_info": _TEXT,
                "unknown_info": _TEXT,
                "task_instructions": _NONEMPTY,
            },
        },
        "actions": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "arguments"],
                "properties": {"name": _NONEMPTY, "arguments": {"type": "object"}},
            },
        },
        "communicate_info": {"type": "array", "items": _NONEMPTY},
        "nl_assertions": {"type": "array", "items": _NONEMPTY},
        "changes_database": {"type": "boolean"},
    },
}
