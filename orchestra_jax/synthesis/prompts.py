"""The synthesis pipeline's prompts: one builder per stage, `(inputs) -> (system, user)`.

Each asks for exactly what `outputs.py` reads (a fenced JSON object of the
stage's schema, or a fenced Python module) and says what its validation will
check, so a capable model can pass it on the first try. The domain code they
ask for follows tau2's API, as ToolScale's domains do: a pydantic `DB`
subclass in `data_model.py`, a `ToolKitBase` of `@is_tool` methods in
`tools.py` importing its models from `tau2.domains.<name>.data_model`.
"""

from __future__ import annotations

import json
from typing import Any

SYSTEM = (
    "You design realistic customer-service environments for training tool-using "
    "assistants. Follow the requested output format exactly; output nothing else."
)


def schema(name: str, description: str) -> tuple[str, str]:
    return SYSTEM, (
        f"Design the database of a customer-service domain named {name!r}: {description}\n\n"
        "Choose 3 to 5 tables a support agent needs to serve customers (e.g. customers, "
        "their orders or bookings, the catalogue). Every table is keyed by an id field; "
        "records of one table refer to records of another by id. Give each field a type "
        "(str, int, float, bool, a list or dict of those, or another table's id) and a "
        "one-sentence description.\n\n"
        "Answer with one fenced JSON block:\n"
        "```json\n"
        '{"tables": {"<table>": {"description": "...", "id_field": "<field>", '
        '"fields": {"<field>": {"type": "...", "description": "..."}}}}}\n'
        "```"
    )


def data_model(name: str, schema_json: dict[str, Any]) -> tuple[str, str]:
    class_name = "".join(part.title() for part in name.split("_")) + "DB"
    return SYSTEM, (
        f"Write `data_model.py` for the {name!r} domain: pydantic v2 models of this "
        f"database schema.\n\n{json.dumps(schema_json, indent=1)}\n\n"
        "Rules:\n"
        "- one `BaseModel` per table record, fields typed as in the schema (use "
        "`Literal[...]` for closed sets of values, `Optional[...] = None` for optional ones);\n"
        f"- exactly one database class `{class_name}(DB)` (`from tau2.environment.db import "
        "DB`) with one field per table: `Dict[str, <Record>]` keyed by the record's id;\n"
        "- no other imports than typing, pydantic and tau2; no code at module level but "
        "definitions.\n"
        "The module is imported and the database entries are validated against it.\n\n"
        "Answer with one ```python block."
    )


def entries(
    name: str, schema_json: dict[str, Any], model_code: str, focus: str, per_table: int
) -> tuple[str, str]:
    return SYSTEM, (
        f"Write database entries for the {name!r} domain, focused on: {focus}.\n\n"
        f"Schema:\n{json.dumps(schema_json, indent=1)}\n\nData model:\n```python\n"
        f"{model_code}\n```\n\n"
        f"Give {per_table} records per table, realistic and mutually consistent: every id "
        "a record refers to exists in this answer; ids are unique and not generic "
        "(not 1, 2, 3). The entries are validated against the data model.\n\n"
        "Answer with one fenced JSON block: "
        '```json\n{"<table>": {"<id>": {<record>}}}\n```'
    )


def tools(name: str, model_code: str, db_excerpt: str) -> tuple[str, str]:
    return SYSTEM, (
        f"Write `tools.py` for the {name!r} domain: the functions a support agent calls.\n\n"
        f"Data model (import it from `tau2.domains.{name}.data_model`):\n```python\n"
        f"{model_code}\n```\n\nSome database entries:\n{db_excerpt}\n\n"
        "Rules:\n"
        "- one class `<Name>Tools(ToolKitBase)` (`from tau2.environment.toolkit import "
        "ToolKitBase, ToolType, is_tool`) whose `__init__(self, db)` calls "
        "`super().__init__(db)`;\n"
        "- 6 to 12 tools, each a method decorated `@is_tool(ToolType.READ)` (looks up) or "
        "`@is_tool(ToolType.WRITE)` (changes `self.db`), typed arguments, a docstring with "
        "`Args:` and `Returns:`; a tool raises `ValueError` with a clear message on bad "
        "input (unknown id, rule broken) and returns a pydantic record or a string;\n"
        "- reads and writes go through `self.db` only.\n"
        "Then one example call per tool, with arguments taken from the entries above: each "
        "is run on a fresh copy of the database and must not raise.\n\n"
        "Answer with one ```python block, then one fenced JSON block "
        '```json\n{"examples": {"<tool>": {<arguments>}}}\n```'
    )


def policy(name: str, description: str, tool_schemas: list[dict[str, Any]]) -> tuple[str, str]:
    names = ", ".join(s["function"]["name"] for s in tool_schemas)
    return SYSTEM, (
        f"Write the agent policy of the {name!r} customer-service domain ({description}), "
        f"in markdown: who the agent serves, how it identifies the customer, what it may and "
        f"may not do with each kind of request, when it must ask for explicit confirmation "
        f"(before every change to the database), and when it transfers to a human. Its "
        f"tools: {names}.\n\nAnswer with the policy text only."
    )


def purposes(
    name: str, policy_text: str, tool_schemas: list[dict[str, Any]], n: int
) -> tuple[str, str]:
    names = ", ".join(s["function"]["name"] for s in tool_schemas)
    return SYSTEM, (
        f"List {n} distinct, realistic reasons a customer contacts the {name!r} domain's "
        f"support, each a few words, most needing several steps (look-ups, then a change). "
        f"Tools: {names}.\n\nPolicy:\n{policy_text[:4000]}\n\n"
        'Answer with one fenced JSON block: ```json\n{"purposes": ["...", ...]}\n```'
    )


TASK_FORMAT = (
    "Answer with one fenced JSON block:\n```json\n"
    "{\n"
    '  "user_scenario": {"persona": "...", "reason_for_call": "...", "known_info": "...",\n'
    '                    "unknown_info": "...", "task_instructions": "..."},\n'
    '  "actions": [{"name": "<tool>", "arguments": {...}}, ...],\n'
    '  "communicate_info": ["<a value the agent must tell the user>", ...],\n'
    '  "nl_assertions": ["<a fact that holds once the request is resolved>", ...],\n'
    '  "changes_database": true\n'
    "}\n```\n"
    "`actions` are the agent's gold tool calls, in order: they are replayed on a fresh "
    "copy of the database, must all succeed, and must change it exactly when "
    "`changes_database` says so. `known_info` is what the user can tell the agent "
    "(ids, names); `unknown_info` what they do not know; `task_instructions` how the "
    "simulated user behaves."
)


def task(
    name: str,
    policy_text: str,
    tool_schemas: list[dict[str, Any]],
    db_excerpt: str,
    purpose: str,
) -> tuple[str, str]:
    return SYSTEM, (
        f"Write one task of the {name!r} domain for the purpose: {purpose}.\n\n"
        f"Policy:\n{policy_text[:6000]}\n\nTools:\n{json.dumps(tool_schemas)}\n\n"
        f"Database entries:\n{db_excerpt}\n\n"
        "The user's request must be solvable with these tools on these entries, following "
        "the policy.\n\n" + TASK_FORMAT
    )


def evolve(
    name: str,
    tool_schemas: list[dict[str, Any]],
    db_excerpt: str,
    original: dict[str, Any],
) -> tuple[str, str]:
    return SYSTEM, (
        f"Make this task of the {name!r} domain harder: add a constraint the agent must "
        "check, a second request in the same call, or a step that links another table; "
        "keep it realistic and solvable with the tools on the entries.\n\n"
        f"Task:\n{json.dumps(original, indent=1)}\n\nTools:\n{json.dumps(tool_schemas)}\n\n"
        f"Database entries:\n{db_excerpt}\n\n" + TASK_FORMAT
    )
