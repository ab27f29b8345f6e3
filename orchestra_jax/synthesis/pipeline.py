"""The synthesis pipeline: a config's domain in, ToolScale-format tasks and a report out.

`synthesize(config)` (config: `experiments/configs/synthesize.py`) either
builds a new domain from a name and description (schema, data model,
entries, tools, policy: `stages.py`) into `<out_dir>/domain/<name>/`, a
domain folder the τ² environment loads by path, or takes an existing domain
folder (`domain.folder`: a path, or one of ToolScale's ten in
`domain.domains_dir`); then makes tasks for it (purposes, tasks, evolved
variants). It writes into `out_dir`:

  calls/         every generator reply, keyed by a hash of its inputs (resumption)
  work/          the candidate domain folders the probes checked
  domain/<name>/ the new domain, with its tasks.json (new domains only)
  tasks.json     the kept tasks, tau2 task rows as ToolScale publishes them
                 (`data.sources=toolscale`, `data.paths.toolscale=<this file>`)
  report.json, report.md   kept and rejected per stage by reason, calls, tokens, cost

A run that keeps no task fails (`StageFailed`, the task stages' rejects by
reason in its message and the report); experiments/synthesize.py exits non-zero.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import shutil
import time
from typing import Any

from orchestra_jax.synthesis import stages
from orchestra_jax.synthesis.call_cache import CachedGenerator
from orchestra_jax.synthesis.generator import Generator, make_generator
from orchestra_jax.synthesis.probe import ProbeLimits, Prober
from orchestra_jax.synthesis.report import Report


@dataclasses.dataclass(frozen=True)
class Result:
    """What a run produced: the tasks file, the tasks kept, the domain folder, the report."""

    tasks_file: pathlib.Path
    tasks: list[dict[str, Any]]
    domain_folder: pathlib.Path
    report: dict[str, Any]


def context(config: Any, generator: Generator) -> stages.Context:
    out = pathlib.Path(config.out_dir)
    cached = CachedGenerator(generator, out / "calls", max_concurrency=config.max_concurrency)
    prober = Prober(
        ProbeLimits(timeout_s=config.probe.timeout_s, memory_mb=config.probe.memory_mb),
        tau2_data_dir=config.tau2_data_dir,
        sandbox=config.probe.sandbox,
        code_is_trusted=config.probe.code_is_trusted,
    )
    return stages.Context(
        generator=cached,
        prober=prober,
        report=Report(cached.ledger),
        work_dir=out / "work",
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        attempts=config.attempts,
    )


async def new_domain(ctx: stages.Context, config: Any, out: pathlib.Path) -> stages.Domain:
    """Schema → data model → entries → tools → policy, into `<out>/domain/<name>/`."""
    name, description = config.domain.name, config.domain.description
    if not name.isidentifier():
        raise ValueError(f"domain.name must be a Python identifier, got {name!r}")
    schema = await stages.schema_stage(ctx, name, description)
    model_code = await stages.data_model_stage(ctx, name, schema)
    focuses = [f.strip() for f in config.domain.entry_focuses.split(",") if f.strip()]
    db = await stages.entries_stage(
        ctx, name, schema, model_code, focuses, config.domain.entries_per_table
    )
    tools_code, schemas = await stages.tools_stage(ctx, name, model_code, db)
    policy = await stages.policy_stage(ctx, name, description, schemas, config.min_policy_chars)
    folder = out / "domain" / name
    if folder.exists():
        shutil.rmtree(folder)
    stages.write_folder(
        folder,
        {
            "schema.json": json.dumps(schema, indent=1),
            "data_model.py": model_code,
            "db.json": json.dumps(db, indent=1, ensure_ascii=False),
            "tools.py": tools_code,
            "policy.md": policy,
        },
    )
    return stages.Domain(name, folder, policy, schemas, stages.db_excerpt(db))


def existing_domain(ctx: stages.Context, config: Any) -> stages.Domain:
    """A domain folder as it is (its tools' schemas read by a probe)."""
    from orchestra_jax.envs.tau2.domain_folder import check_domain_folder, domain_folder

    folder = domain_folder(config.domain.folder, config.domain.domains_dir)
    if folder is None:
        raise ValueError(
            f"domain.folder {config.domain.folder!r}: neither a folder nor a domain in "
            f"domain.domains_dir {config.domain.domains_dir!r}"
        )
    problems = check_domain_folder(folder)
    if problems:
        raise ValueError("; ".join(problems))
    [result] = ctx.prober.run([{"kind": "tools", "folder": str(folder), "examples": None}])
    if not result.get("ok"):
        raise ValueError(f"{folder}: its tools do not load: {result.get('error')}")
    db = json.loads((folder / "db.json").read_text(encoding="utf-8"))
    policy = (folder / "policy.md").read_text(encoding="utf-8")
    return stages.Domain(folder.name, folder, policy, result["schemas"], stages.db_excerpt(db))


async def run(config: Any, generator: Generator) -> Result:
    """The pipeline on `generator` (module docstring)."""
    out = pathlib.Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = context(config, generator)
    start = time.perf_counter()
    try:
        if config.domain.folder:
            domain = await asyncio.to_thread(existing_domain, ctx, config)
        else:
            domain = await new_domain(ctx, config, out)
        purposes = await stages.purposes_stage(ctx, domain, config.tasks.num_purposes)
        rows = await stages.task_stage(ctx, domain, purposes, config.tasks.samples_per_purpose)
        if config.tasks.evolve:
            rows += await stages.evolve_stage(ctx, domain, rows)
        if not rows:
            raise stages.StageFailed(f"no task kept: {no_task_reasons(ctx.report)}")
    except stages.StageFailed as e:
        ctx.report.write(out, {"failed": str(e)})
        raise
    finally:
        ctx.prober.close()
    tasks_file = out / "tasks.json"
    tasks_file.write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    if not config.domain.folder:
        shutil.copyfile(tasks_file, domain.folder / "tasks.json")
    extra = {
        "domain": domain.name,
        "domain_folder": str(domain.folder),
        "tasks_file": str(tasks_file),
        "tasks_written": len(rows),
        "probe_processes": ctx.prober.processes,
        "wall_s": round(time.perf_counter() - start, 3),
    }
    ctx.report.write(out, extra)
    return Result(tasks_file, rows, domain.folder, {**ctx.report.to_dict(), **extra})


def no_task_reasons(report: Report) -> str:
    """The task stages' rejects by reason, e.g. "tasks: gold_action_fails 3, timeout 1"."""
    parts = []
    for name in ("purposes", "tasks", "evolve"):
        rejected = report.stage(name).rejected
        counts = ", ".join(f"{reason} {n}" for reason, n in sorted(rejected.items()))
        parts.append(f"{name}: {counts or 'nothing rejected'}")
    return "; ".join(parts)


def synthesize(config: Any, generator: Generator | None = None) -> Result:
    """`run` with the config's generator (`synthesis/generator.py`) unless one is given."""
    return asyncio.run(run(config, generator or make_generator(config.generator)))
