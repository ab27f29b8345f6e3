"""The probe process: runs generated domain code on its database, inside the sandbox.

`python -m orchestra_jax.synthesis.probe_worker` is started by `probe.py` in
the domain-code sandbox (`envs/domain_sandbox.py`: bubblewrap, no network,
its own pid namespace, read-only installation, an empty environment). It
imports tau2 once, then serves requests, one JSON line each on stdin, and
answers each with one verdict line `RESULTS_MARKER` + `{"id": …, "result": …}`
on its stdout.

The verdict channel is out of the probed code's reach: this process (the
judge) never runs model-written code. For each request it writes the
candidate's files into a fresh folder of a random name under /scratch
(emptied after each request, so nothing a candidate leaves there reaches the
next one) and forks a child that
closes the verdict pipe and stdin, sends its stdout and stderr to a log
file, lowers its CPU limit, runs the probe and reports the result on a pipe
of its own. The judge is made non-dumpable first (`PR_SET_DUMPABLE` 0), so
the child, though of the same user, cannot ptrace it, read its memory or
open its file descriptors through /proc. The judge waits at most the request's
time limit, then kills every other process of the sandbox (`kill(-1)`: in its
own pid namespace that is exactly the probed code and what it started) and
writes the verdict: the child's report if it is one JSON result, else
"timeout", "crash" (no report) or "garbled_result". A candidate's code can
shape only its own report (as any code can behave well only while probed),
never another request's verdict.

Kinds of request, each on a domain folder (`envs/tau2/domain_folder.py`
layout) given as its files (`name`, `files`):

  data_model  `data_model.py` imports and defines one subclass of tau2's `DB`
  database    `db.json` validates against that data model (table sizes back)
  tools       `tools.py` imports and defines one `ToolKitBase`; every tool has an
              example call in `examples` and each runs without error on its own
              fresh copy of the database (tool names, READ/WRITE kinds and OpenAI
              schemas back; with `examples` null, no call is made)
  replay      a task: its row validates as tau2's `Task`, every gold action names
              a tool of the domain and runs without error, in order, on a fresh
              copy of the database, twice (on two fresh copies); the two final
              database hashes must agree (a tool that uses the clock or random
              ids can never match the evaluator's replay); whether the database
              changed comes back
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import pathlib
import resource
import secrets
import select
import shutil
import signal
import sys
import time
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
    from orchestra_jax.envs.tau2.domain_code import load_domain_code, unload_domain_code

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

    from orchestra_jax.envs.tau2.domain_code import environment_constructor

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
    after = []
    for _ in range(2):
        replayed = environment_constructor(folder, db_class, toolkit_class)()
        for i, action in enumerate(request["actions"]):
            try:
                replayed.make_tool_call(
                    action["name"], requestor="assistant", **action["arguments"]
                )
            except Exception as e:
                return _failure(
                    "gold_action_fails", f"action {i} {action['name']}: {_error_text(e)}"
                )
        after.append(replayed.get_db_hash())
    if after[0] != after[1]:
        return _failure(
            "replay_not_deterministic",
            "two replays of the gold actions on fresh copies of the database end in different "
            "databases (a tool uses the clock, random ids or outside state)",
        )
    return {"ok": True, "changed": after[0] != before}


PROBES = {
    "data_model": probe_data_model,
    "database": probe_database,
    "tools": probe_tools,
    "replay": probe_replay,
}
SCRATCH = pathlib.Path("/scratch")
MAX_REPORT_BYTES = 16 * 1024 * 1024
PR_SET_DUMPABLE = 4


def probe(request: dict[str, Any], folder: pathlib.Path) -> dict[str, Any]:
    """The probe's result (a bug of the probe itself is a "probe_error" result)."""
    try:
        return PROBES[request["kind"]](folder, request)
    except Exception:
        return _failure("probe_error", traceback.format_exc())


def write_folder(root: pathlib.Path, request: dict[str, Any]) -> pathlib.Path:
    """The request's domain files written to `root/<name>/` (the candidate's own copy)."""
    name = request["name"]
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"domain name {name!r} is not a Python identifier")
    folder = root / name
    folder.mkdir(parents=True)
    for file_name, text in request["files"].items():
        if "/" in file_name or file_name.startswith("."):
            raise ValueError(f"file name {file_name!r}")
        (folder / file_name).write_text(text, encoding="utf-8")
    return folder


def _child(request: dict[str, Any], folder: pathlib.Path, log: int, report: int) -> None:
    """In the forked child: drop every channel of the judge's, run the probe, report, exit."""
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, report)
        os.closerange(report + 1, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536))
        cpu = math.ceil(float(request.get("timeout_s", 20.0))) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        data = json.dumps(probe(request, folder)).encode("utf-8")
    except BaseException:
        data = json.dumps(_failure("probe_error", traceback.format_exc())).encode("utf-8")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(report, view) :]
    finally:
        os._exit(0)


def _read_report(fd: int, deadline: float) -> tuple[bytes, bool]:
    """(what the child wrote before closing its pipe, whether the deadline passed first)."""
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b"".join(chunks), True
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), False
        size += len(chunk)
        if size <= MAX_REPORT_BYTES:
            chunks.append(chunk)


def _log_tail(path: pathlib.Path, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _kill_the_rest(child: int, own_pid_namespace: bool) -> None:
    """Kills the probed code and whatever it started (module docstring)."""
    try:
        if own_pid_namespace:
            os.kill(-1, signal.SIGKILL)  # all but this process and the namespace's init
        else:
            os.killpg(child, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.waitpid(child, 0)
    except ChildProcessError:
        pass
    while True:  # reap what else was ours
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break


def wipe(folder: pathlib.Path) -> None:
    """Removes everything in `folder` (what the probed code left there too, whatever its
    permissions), so the next candidate starts on an empty scratch folder."""

    def writable_again(function: Any, path: str, excinfo: Any) -> None:
        del excinfo
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            function(path)
        except OSError:
            pass

    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, onerror=writable_again)
        else:
            try:
                entry.unlink()
            except OSError:
                pass


def judge(request: dict[str, Any], number: int, own_pid_namespace: bool) -> dict[str, Any]:
    """Runs one request in a forked child (module docstring); its result."""
    del number
    scratch = SCRATCH if own_pid_namespace else pathlib.Path.cwd()
    root = scratch / f"request-{secrets.token_hex(8)}"  # no earlier candidate can plant it
    try:
        folder = write_folder(root, request)
    except Exception as e:
        shutil.rmtree(root, ignore_errors=True)
        return _failure("probe_error", f"the request's files: {_error_text(e)}")
    log_path = root / "output.log"
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    read_end, write_end = os.pipe()
    deadline = time.monotonic() + float(request.get("timeout_s", 20.0))
    child = os.fork()
    if child == 0:
        os.close(read_end)
        _child(request, folder, log, write_end)
    os.close(write_end)
    os.close(log)
    try:
        data, timed_out = _read_report(read_end, deadline)
    finally:
        os.close(read_end)
        _kill_the_rest(child, own_pid_namespace)
    tail = _log_tail(log_path)
    wipe(scratch)
    if timed_out:
        return _failure("timeout", f"no result within {request.get('timeout_s')} s\n{tail}")
    if not data:
        return _failure("crash", f"the probed code ended without a result\n{tail}")
    try:
        result = json.loads(data)
    except ValueError as e:
        return _failure("garbled_result", f"{_error_text(e)}: {data[:200]!r}")
    if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
        return _failure("garbled_result", f"not a result: {data[:200]!r}")
    return result


def main(argv: list[str]) -> None:
    """Serves requests, one JSON line in, one verdict line out (after `RESULTS_MARKER`),
    until stdin closes; see the module docstring."""
    own_pid_namespace = "--own-pid-namespace" in argv
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # fd 1 is stderr from here on
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    with contextlib.redirect_stdout(sys.stderr):
        from orchestra_jax.envs.tau2.setup import import_tau2

        import_tau2()
        out.write(RESULTS_MARKER + json.dumps({"ready": True}) + "\n")
        out.flush()
        for number, line in enumerate(sys.stdin):
            if not line.strip():
                continue
            request_id = None
            try:
                request = json.loads(line)
                request_id = request["id"]
                result = judge(request, number, own_pid_namespace)
            except Exception:
                result = _failure("probe_error", traceback.format_exc())
            out.write(RESULTS_MARKER + json.dumps({"id": request_id, "result": result}) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
