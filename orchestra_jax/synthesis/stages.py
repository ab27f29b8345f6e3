"""The synthesis stages: domain → schema → data model → entries → tools → policy →
purposes → tasks → evolved tasks. Each asks the generator, validates, keeps or rejects.

A stage's calls carry keys naming their item (`"tasks/003/1"`: purpose 3,
sample 1), so a rerun over the same output folder finds each reply in the
call cache (`call_cache.py`) and pays for none twice. Stages that need one
output (schema, data model, tools, policy, purposes) try up to `attempts`
samples in turn and keep the first valid one; stages of many items (entries,
tasks, evolved tasks) ask for all of them at once (concurrency bounded by the
generator) and keep every valid one. Model-written code is only ever run by
the probe process, in the sandbox (`probe.py`); this module reads it as text.

Validation per stage (rejects counted by reason, `outputs.REASONS`):
  schema      JSON of `SCHEMA_SCHEMA`
  data_model  a ```python module that compiles, imports and defines one `DB`
  entries     JSON of `ENTRIES_SCHEMA` per batch, each validated by the data model;
              batches merged (an id seen before is a duplicate, dropped), the
              merged database validated again
  tools       a module that imports, one `ToolKitBase`, an example call per
              tool, each run without error on its own fresh copy of the database
  policy      at least `min_policy_chars` characters
  purposes    JSON of `PURPOSES_SCHEMA`
  tasks, evolve
              JSON of `TASK_SCHEMA`, a valid tau2 `Task` once converted, every
              `communicate_info` fact with at least `outputs.MIN_FACT_CHARS`
              letters or digits (tau2 grades a fact by substring), and the
              verifiability filter: the gold actions name the domain's tools and
              replay without error, in order, on two fresh copies of the
              database, ending both times in the same database (tau2's evaluator
              compares hashes), which they change exactly when the task says
              they do
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import time
from collections.abc import Callable
from typing import Any

from orchestra_jax.synthesis import outputs, prompts
from orchestra_jax.synthesis.call_cache import CachedGenerator, GeneratorFailure
from orchestra_jax.synthesis.generator import Call, messages
from orchestra_jax.synthesis.outputs import Rejected
from orchestra_jax.synthesis.probe import Prober
from orchestra_jax.synthesis.report import Report


class StageFailed(RuntimeError):
    """A stage that needs one output kept none (the report says why)."""


@dataclasses.dataclass
class Context:
    """What every stage uses: the cached generator, the prober, the report, a
    scratch folder for candidate domain folders, and the sampling settings."""

    generator: CachedGenerator
    prober: Prober
    report: Report
    work_dir: pathlib.Path
    max_tokens: int = 8192
    temperature: float = 1.0
    attempts: int = 3  # samples tried by stages that keep one output


@dataclasses.dataclass(frozen=True)
class Domain:
    """A domain the task stages write for: its folder (`envs/tau2/domain_folder.py`
    layout), policy, tools' OpenAI schemas and an excerpt of its database."""

    name: str
    folder: pathlib.Path
    policy: str
    tool_schemas: list[dict[str, Any]]
    db_excerpt: str


async def ask(ctx: Context, stage: str, key: str, prompt: tuple[str, str]) -> str | None:
    """The generator's reply to `prompt` (None when the call failed for good: counted)."""
    call = Call(stage, key, messages(*prompt), ctx.max_tokens, ctx.temperature)
    try:
        return (await ctx.generator.generate(call)).text
    except GeneratorFailure as e:
        ctx.report.reject(stage, Rejected("generator_failed", str(e)), key)
        return None


async def first_kept(
    ctx: Context, stage: str, prompt: tuple[str, str], check: Callable[[str, str], Any]
) -> Any:
    """The first of up to `ctx.attempts` replies that `check(text, key)` accepts."""
    for attempt in range(ctx.attempts):
        key = f"{stage}/{attempt}"
        text = await ask(ctx, stage, key, prompt)
        if text is None:
            continue
        start = time.perf_counter()
        try:
            value = await asyncio.to_thread(check, text, key)
        except Rejected as e:
            ctx.report.reject(stage, e, key)
            continue
        finally:
            ctx.report.timed(stage, time.perf_counter() - start, 1)
        ctx.report.keep(stage)
        return value
    raise StageFailed(f"stage {stage!r}: no valid output in {ctx.attempts} attempt(s)")


def probed(result: dict[str, Any]) -> dict[str, Any]:
    """A probe's result, or its failure as `Rejected`."""
    if not result.get("ok"):
        raise Rejected(result.get("reason", "probe_error"), result.get("error", ""))
    return result


def write_folder(folder: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def db_excerpt(db: dict[str, Any], per_table: int = 3, max_chars: int = 6000) -> str:
    """The first `per_table` records of each table, as JSON, at most `max_chars`."""
    excerpt = {
        table: dict(list(rows.items())[:per_table]) if isinstance(rows, dict) else rows
        for table, rows in db.items()
    }
    return json.dumps(excerpt, ensure_ascii=False)[:max_chars]


# --- a new domain -------------------------------------------------------------------------


async def schema_stage(ctx: Context, name: str, description: str) -> dict[str, Any]:
    return await first_kept(
        ctx,
        "schema",
        prompts.schema(name, description),
        lambda text, key: outputs.extract_json(text, outputs.SCHEMA_SCHEMA),
    )


async def data_model_stage(ctx: Context, name: str, schema: dict[str, Any]) -> str:
    def check(text: str, key: str) -> str:
        code = outputs.extract_code(text, "data_model.py")
        folder = write_folder(ctx.work_dir / key / name, {"data_model.py": code})
        probed(ctx.prober.run([{"kind": "data_model", "folder": str(folder)}])[0])
        return code

    return await first_kept(ctx, "data_model", prompts.data_model(name, schema), check)


async def entries_stage(
    ctx: Context,
    name: str,
    schema: dict[str, Any],
    model_code: str,
    focuses: list[str],
    per_table: int,
) -> dict[str, Any]:
    """One call per focus; the valid batches merged in focus order."""
    stage = "entries"
    keys = [f"{stage}/{i:03d}" for i in range(len(focuses))]
    texts = await asyncio.gather(
        *(
            ask(ctx, stage, key, prompts.entries(name, schema, model_code, focus, per_table))
            for key, focus in zip(keys, focuses, strict=True)
        )
    )
    start = time.perf_counter()
    batches: dict[str, dict[str, Any]] = {}
    for key, text in zip(keys, texts, strict=True):
        if text is None:
            continue
        try:
            batches[key] = outputs.extract_json(text, outputs.ENTRIES_SCHEMA)
        except Rejected as e:
            ctx.report.reject(stage, e, key)
    requests = []
    for key, batch in batches.items():
        folder = write_folder(
            ctx.work_dir / key / name,
            {"data_model.py": model_code, "db.json": json.dumps(batch)},
        )
        requests.append({"kind": "database", "folder": str(folder)})
    results = await asyncio.to_thread(ctx.prober.run, requests)
    merged: dict[str, dict[str, Any]] = {}
    for (key, batch), result in zip(batches.items(), results, strict=True):
        try:
            probed(result)
            clash = [
                f"{table}/{i}"
                for table, rows in batch.items()
                for i in rows
                if i in merged.get(table, {})
            ]
            if clash:
                raise Rejected("duplicate_entry", f"ids already kept: {clash[:5]}")
        except Rejected as e:
            ctx.report.reject(stage, e, key)
            continue
        for table, rows in batch.items():
            merged.setdefault(table, {}).update(rows)
        ctx.report.keep(stage)
    if not merged:
        raise StageFailed("stage 'entries': no valid batch of entries")
    folder = write_folder(
        ctx.work_dir / stage / "merged" / name,
        {"data_model.py": model_code, "db.json": json.dumps(merged)},
    )
    [result] = await asyncio.to_thread(
        ctx.prober.run, [{"kind": "database", "folder": str(folder)}]
    )
    ctx.report.timed(stage, time.perf_counter() - start, len(batches) + 1)
    if not result.get("ok"):
        raise StageFailed(f"stage 'entries': the merged database fails: {result.get('error')}")
    return merged


async def tools_stage(
    ctx: Context, name: str, model_code: str, db: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    def check(text: str, key: str) -> tuple[str, list[dict[str, Any]]]:
        code = outputs.extract_code(text, "tools.py")
        examples = outputs.extract_json(
            text[text.find("```python") :].split("```", 2)[-1], outputs.EXAMPLES_SCHEMA
        )["examples"]
        folder = write_folder(
            ctx.work_dir / key / name,
            {"data_model.py": model_code, "db.json": json.dumps(db), "tools.py": code},
        )
        request = {"kind": "tools", "folder": str(folder), "examples": examples}
        result = probed(ctx.prober.run([request])[0])
        return code, result["schemas"]

    prompt = prompts.tools(name, model_code, db_excerpt(db))
    return await first_kept(ctx, "tools", prompt, check)


async def policy_stage(
    ctx: Context, name: str, description: str, tool_schemas: list[dict[str, Any]], min_chars: int
) -> str:
    def check(text: str, key: str) -> str:
        del key
        if len(text.strip()) < min_chars:
            raise Rejected("policy_too_short", f"{len(text.strip())} < {min_chars} characters")
        return text.strip() + "\n"

    return await first_kept(ctx, "policy", prompts.policy(name, description, tool_schemas), check)


# --- tasks --------------------------------------------------------------------------------


async def purposes_stage(ctx: Context, domain: Domain, n: int) -> list[str]:
    found = await first_kept(
        ctx,
        "purposes",
        prompts.purposes(domain.name, domain.policy, domain.tool_schemas, n),
        lambda text, key: outputs.extract_json(text, outputs.PURPOSES_SCHEMA)["purposes"],
    )
    return list(found)[:n]


def task_row(domain: str, task_id: str, purpose: str, value: dict[str, Any]) -> dict[str, Any]:
    """A task reply as a ToolScale / tau2 task row (`data/tau2_tasks.py`)."""
    scenario = value["user_scenario"]
    criteria = {
        "actions": [
            {
                "action_id": f"{task_id}-{i}",
                "name": a["name"],
                "arguments": a["arguments"],
                "requestor": "assistant",
            }
            for i, a in enumerate(value["actions"])
        ],
        "communicate_info": list(value["communicate_info"]),
        "nl_assertions": list(value["nl_assertions"]),
        "reward_basis": ["DB", "COMMUNICATE"]
        + (["NL_ASSERTION"] if value["nl_assertions"] else []),
    }
    return {
        "id": task_id,
        "description": {"purpose": purpose, "relevant_policies": None, "notes": None},
        "user_scenario": {
            "persona": scenario.get("persona") or None,
            "instructions": {
                "domain": domain,
                "reason_for_call": scenario["reason_for_call"],
                "known_info": scenario["known_info"],
                "unknown_info": scenario["unknown_info"],
                "task_instructions": scenario["task_instructions"],
            },
        },
        "initial_state": None,
        "evaluation_criteria": criteria,
    }


def task_reply(row: dict[str, Any]) -> dict[str, Any]:
    """A kept task row back in the reply format (what the evolve prompt shows)."""
    instructions = row["user_scenario"]["instructions"]
    criteria = row["evaluation_criteria"]
    return {
        "user_scenario": {
            k: instructions[k]
            for k in ("reason_for_call", "known_info", "unknown_info", "task_instructions")
        },
        "actions": [{"name": a["name"], "arguments": a["arguments"]} for a in criteria["actions"]],
        "communicate_info": criteria["communicate_info"],
        "nl_assertions": criteria["nl_assertions"],
    }


async def verified_tasks(
    ctx: Context,
    stage: str,
    domain: Domain,
    items: list[tuple[str, str, tuple[str, str]]],
) -> list[dict[str, Any]]:
    """Asks for every `(task id, purpose, prompt)` at once; keeps the tasks that pass
    the verifiability filter (module docstring), in item order."""
    texts = await asyncio.gather(*(ask(ctx, stage, tid, prompt) for tid, _, prompt in items))
    start = time.perf_counter()
    candidates = []
    for (task_id, purpose, _), text in zip(items, texts, strict=True):
        if text is None:
            continue
        try:
            value = outputs.extract_json(text, outputs.TASK_SCHEMA)
            vague = outputs.vague_facts(value["communicate_info"])
            if vague:
                raise Rejected(
                    "communicate_info_vague",
                    f"{vague}: each fact needs at least {outputs.MIN_FACT_CHARS} letters or "
                    "digits (tau2 finds it in the agent's reply by substring)",
                )
        except Rejected as e:
            ctx.report.reject(stage, e, task_id)
            continue
        candidates.append((task_id, value, task_row(domain.name, task_id, purpose, value)))
    requests = [
        {"kind": "replay", "folder": str(domain.folder), "actions": v["actions"], "task": row}
        for _, v, row in candidates
    ]
    results = await asyncio.to_thread(ctx.prober.run, requests)
    kept = []
    for (task_id, value, row), result in zip(candidates, results, strict=True):
        try:
            probed(result)
            if result["changed"] != value["changes_database"]:
                said = "changes" if value["changes_database"] else "leaves"
                did = "changed" if result["changed"] else "left"
                raise Rejected(
                    "db_change_mismatch",
                    f"the task says it {said} the database; the gold actions {did} it",
                )
        except Rejected as e:
            ctx.report.reject(stage, e, task_id)
            continue
        ctx.report.keep(stage)
        kept.append(row)
    ctx.report.timed(stage, time.perf_counter() - start, len(candidates))
    return kept


async def task_stage(
    ctx: Context, domain: Domain, purposes: list[str], samples: int
) -> list[dict[str, Any]]:
    """`samples` tasks per purpose, ids `<domain>-<purpose index>-<sample>`."""
    items = [
        (
            f"{domain.name}-{p:03d}-{s}",
            purpose,
            prompts.task(
                domain.name, domain.policy, domain.tool_schemas, domain.db_excerpt, purpose
            ),
        )
        for p, purpose in enumerate(purposes)
        for s in range(samples)
    ]
    return await verified_tasks(ctx, "tasks", domain, items)


async def evolve_stage(
    ctx: Context, domain: Domain, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One harder variant per kept task, id `<task id>-evolved`."""
    items = [
        (
            f"{row['id']}-evolved",
            row["description"]["purpose"],
            prompts.evolve(domain.name, domain.tool_schemas, domain.db_excerpt, task_reply(row)),
        )
        for row in rows
    ]
    return await verified_tasks(ctx, "evolve", domain, items)
