"""The probe process: runs generated domain code on its database, away from the pipeline.

`python -m orchestra_jax.synthesis.probe_worker` imports tau2 once, then
reads one JSON probe request a line on stdin and answers each with a line
`RESULTS_MARKER` + JSON result (`{"ok": bool, "reason": str, "error": str,
…}`) on its stdout; whatever the probed code prints, even to file descriptor
1, goes to stderr. `probe.py` runs it under resource limits, with a
wall-time limit per request; the pipeline itself never imports
model-written code. Kinds of request, each on
a domain folder (`envs/tau2_domain_folder.py` layout):

  data_model  `data_model.py` imports and defines one subclass of tau2's `DB`
  database    `db.json` validates against that data model (table sizes back)
  tools       `tools.py` imports and defines one `ToolKitBase`; every tool has an
              example call in `examples` and each runs without error on its own
              fresh copy of the database (tool names, READ/WRITE kinds and OpenAI
              schemas back; with `examples` null, no call is made)
  replay      a task: its row validates as tau2's `Task`, every gold action names
              a tool of the domain and runs without error, in order, on a fresh
              copy of the database; whether the database changed comes back
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import traceback
from typing import Any

RESULTS_MARKER = "@@probe-result@@ "


def _failure(reason: str, error: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "reason": reason, "error": error[-2000:], **extra}


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _code(folder: pathlib.Path) -> tuple[type, type | None]:
    """The folder's DB class and toolkit class (None without tools.py), freshly
    imported: an earlier candidate of the same domain name is forgotten first."""
    from orchestra_jax.envs.tau2_domain_folder import load_domain_code, unload_domain_code

    unload_domain_code(folder.name)
    return load_domain_code(folder, with_tools=(folder / "tools.py").exists())


def probe_data_model(folder: pathlib.Path, request: dict) -> dict[str, Any]:
    del request
    try:
        db_class, _ = _code(folder)
    except Exception as e:
        return _failure("data_model_invalid", _error_text(e))
    return {"ok": True, "db_class": db_class.__name__}


def probe_database(folder: pathlib.Path, request: dict) -> dict[str, Any]:
    del request
    try:
        db_class, _ = _code(folder)
    except Exception as e:
        return _failure("data_model_invalid", _error_text(e))
    try:
        db = db_class.load(str(folder / "db.json"))
    except Exception as e:
        return _failure("entries_mismatch_data_model", _error_text(e))
    sizes = {k: len(v) for k, v in db.model_dump().items() if isinstance(v, (dict, list))}
    return {"ok": True, "tables": sizes}


def probe_tools(folder: pathlib.Path, request: dict) -> dict[str, Any]:
    try:
        db_class, toolkit_class = _code(folder)
        if toolkit_class is None:
            raise ValueError(f"{folder} has no tools.py")
        toolkit = toolkit_class(db_class.load(str(folder / "db.json")))
        kinds = {name: str(toolkit.tool_type(name).value) for name in toolkit.tools}
        schemas = [t.openai_schema for t in toolkit.get_tools().values()]
    except Exception as e:
        return _failure("tools_import_error", _error_text(e))
    if not kinds:
        return _failure("no_tools", f"{folder / 'tools.py'} defines no @is_tool method")
    examples = request.get("examples")
    if examples is None:  # the schemas only (a domain whose tools are trusted)
        return {"ok": True, "tools": kinds, "schemas": schemas}
    missing = sorted(set(kinds) - set(examples))
    if missing:
        return _failure("tool_without_example", f"no example call for {missing}", tools=kinds)
    for name in sorted(kinds):
        fresh = toolkit_class(db_class.load(str(folder / "db.json")))
        try:
            fresh.use_tool(name, **examples[name])
        except Exception as e:
            return _failure(
                "tool_raises",
                f"{name}({json.dumps(examples[name])}): {_error_text(e)}",
                tools=kinds,
            )
    return {"ok": True, "tools": kinds, "schemas": schemas}


def probe_replay(folder: pathlib.Path, request: dict) -> dict[str, Any]:
    from tau2.data_model.tasks import Task

    from orchestra_jax.envs.tau2_domain_folder import environment_constructor

    try:
        Task.model_validate(request["task"])
    except Exception as e:
        return _failure("task_schema", _error_text(e))
    try:
        db_class, toolkit_class = _code(folder)
        assert toolkit_class is not None, f"{folder} has no tools.py"
        environment = environment_constructor(folder, db_class, toolkit_class)()
    except Exception as e:
        return _failure("domain_invalid", _error_text(e))
    names = {t.name for t in environment.get_tools()}
    before = environment.get_db_hash()
    for i, action in enumerate(request["actions"]):
        if action["name"] not in names:
            return _failure("unknown_tool", f"action {i}: no tool {action['name']!r}")
        try:
            environment.make_tool_call(action["name"], requestor="assistant", **action["arguments"])
        except Exception as e:
            return _failure("gold_action_fails", f"action {i} {action['name']}: {_error_text(e)}")
    return {"ok": True, "changed": environment.get_db_hash() != before}


PROBES = {
    "data_model": probe_data_model,
    "database": probe_database,
    "tools": probe_tools,
    "replay": probe_replay,
}


def run(requests: list[dict]) -> list[dict[str, Any]]:
    results = []
    for request in requests:
        try:
            folder = pathlib.Path(request["folder"]).resolve()
            results.append(PROBES[request["kind"]](folder, request))
        except Exception:
            results.append(_failure("probe_error", traceback.format_exc()))
    return results


def main() -> None:
    """Serves requests, one JSON line in, one result line out (after `RESULTS_MARKER`),
    until stdin closes; whatever the probed code prints goes to stderr."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # fd 1 is stderr from here on
    with contextlib.redirect_stdout(sys.stderr):
        from orchestra_jax.envs.tau2_setup import import_tau2

        import_tau2()
        out.write(RESULTS_MARKER + json.dumps({"ready": True}) + "\n")
        out.flush()
        for line in sys.stdin:
            if line.strip():
                [result] = run([json.loads(line)])
                out.write(RESULTS_MARKER + json.dumps(result) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
