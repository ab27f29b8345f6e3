"""Runs probe requests (`probe_worker.py`) in a long-lived process inside the sandbox.

The probe process runs in the domain-code sandbox (`envs/domain_sandbox.py`:
bubblewrap where `sandbox` is "auto" or "bwrap"; rlimits only with
`code_is_trusted`): no network, its own pid namespace (nothing of this
process, its environment or its API keys is visible through /proc), an empty
environment but the variables tau2 needs, a read-only view of the Python
installation, of this package and of tau2's data folder, and a size-limited
in-memory /scratch. A request carries the candidate's files (the sandbox sees
no host folder of the pipeline's), and the process forks one child per
request, so the model-written code never holds the verdict channel
(`probe_worker.py`).

The process imports tau2 once (seconds on a loaded CPU) and answers requests
one at a time. Each verdict must be one line naming the request's id with a
result this module accepts (an `ok` flag and, when not ok, a known reason);
anything else, or no verdict within the time limit, is that request's reject
("garbled_result", "timeout", "crash"): the sandbox is killed, the next request
starts a fresh one, and the run goes on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import selectors
import time
from typing import Any

from orchestra_jax.envs import domain_sandbox
from orchestra_jax.synthesis.outputs import REASONS
from orchestra_jax.synthesis.probe_worker import RESULTS_MARKER
from orchestra_jax.tools.sandbox.base import SandboxLimits

# Slack the process gets past a request's own limit (its judge enforces that one).
VERDICT_SLACK_S = 10.0
FOLDER_FILES = (".py", ".json", ".md")
MAX_LINE_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ProbeLimits:
    """Wall seconds per request, seconds for the process to start (importing tau2),
    address space per process, CPU seconds of the process over its whole life (then
    it is restarted), processes, and the size of its stderr and of its /scratch."""

    timeout_s: float = 20.0
    startup_s: float = 120.0
    memory_mb: int = 4096
    cpu_s: int = 3600
    max_processes: int = 64
    max_stderr_bytes: int = 16 * 1024 * 1024
    scratch_mb: int = 256


def folder_files(folder: pathlib.Path) -> dict[str, str]:
    """The domain folder's top-level .py, .json and .md files, by name."""
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted(folder.iterdir())
        if p.is_file() and p.suffix in FOLDER_FILES and not p.name.startswith(".")
    }


class Prober:
    """`run(requests) -> results`, one result per request (module docstring).

    A request is `{"kind", "folder", …}` (`probe_worker.py`); the folder's files
    are read here and sent with it."""

    def __init__(
        self,
        limits: ProbeLimits = ProbeLimits(),
        *,
        tau2_data_dir: str = "",
        sandbox: str = "auto",
        code_is_trusted: bool = False,
    ):
        data_dir = tau2_data_dir or os.environ.get("TAU2_DATA_DIR", "")
        if not data_dir:
            raise ValueError("the synthesis probes need tau2's data folder: set $TAU2_DATA_DIR")
        self.backend = domain_sandbox.domain_sandbox(sandbox, code_is_trusted=code_is_trusted)
        self.limits = limits
        self.data_dir = os.path.abspath(data_dir)
        self.env = {"TAU2_DATA_DIR": self.data_dir, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        self.processes = 0  # probe processes started (the report says how many)
        self._process: domain_sandbox.SandboxedProcess | None = None
        self._requests = 0

    def run(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self.one(request) for request in requests]

    def one(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            folder = pathlib.Path(request["folder"])
            message = {
                **{k: v for k, v in request.items() if k != "folder"},
                "name": folder.name,
                "files": folder_files(folder),
                "timeout_s": self.limits.timeout_s,
            }
        except (OSError, KeyError, UnicodeDecodeError) as e:
            return {"ok": False, "reason": "probe_error", "error": f"{type(e).__name__}: {e}"}
        if self._process is None or self._process.proc.poll() is not None:
            failure = self._start()
            if failure:
                return failure
        assert self._process is not None
        self._requests += 1
        message["id"] = self._requests
        stdin = self._process.proc.stdin
        assert stdin is not None
        try:
            stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            stdin.flush()
        except BrokenPipeError:
            return self._died("crash", "the probe process ended")
        line = self._line(self.limits.timeout_s + VERDICT_SLACK_S)
        if line is None:
            return self._died("timeout" if self._process.proc.poll() is None else "crash", "")
        return self._verdict(line, self._requests, str(request.get("kind")))

    def close(self) -> None:
        """Stops the probe process (the next request starts another)."""
        if self._process is not None:
            self._process.close()
            self._process = None

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> dict[str, Any] | None:
        self.close()
        limits = SandboxLimits(
            timeout_s=self.limits.cpu_s,
            memory_mb=self.limits.memory_mb,
            max_output_bytes=self.limits.max_stderr_bytes,
            max_processes=self.limits.max_processes,
            scratch_mb=self.limits.scratch_mb,
        )
        self._process = domain_sandbox.start_python_module(
            self.backend,
            "orchestra_jax.synthesis.probe_worker",
            limits,
            read_only=[self.data_dir],
            env=self.env,
        )
        self.processes += 1
        line = self._line(self.limits.startup_s)
        if line != RESULTS_MARKER + json.dumps({"ready": True}):
            return self._died("crash", "the probe process did not start")
        return None

    def _line(self, timeout_s: float) -> str | None:
        """The next line of the process's stdout within `timeout_s`; None on timeout or end."""
        assert self._process is not None and self._process.proc.stdout is not None
        stdout = self._process.proc.stdout
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return None
            line = stdout.readline(MAX_LINE_BYTES)
        if not line:
            return None
        return line.decode("utf-8", errors="replace").rstrip("\n")

    def _verdict(self, line: str, request_id: int, kind: str) -> dict[str, Any]:
        """The result in a verdict line, or that request's "garbled_result" reject."""
        problem = ""
        result: Any = None
        if not line.startswith(RESULTS_MARKER):
            problem = "not a verdict line"
        else:
            try:
                verdict = json.loads(line[len(RESULTS_MARKER) :])
            except ValueError as e:
                verdict, problem = None, f"not JSON ({e})"
            if not problem:
                if not isinstance(verdict, dict) or verdict.get("id") != request_id:
                    problem = f"not the verdict of request {request_id}"
                else:
                    result = verdict.get("result")
                    problem = result_problem(result, kind)
        if problem:
            return self._died("garbled_result", f"{problem}: {line[:300]!r}")
        return result

    def _died(self, reason: str, detail: str) -> dict[str, Any]:
        """Kills the process; the failure with `detail` and the end of its stderr."""
        stderr = self._process.stderr_tail() if self._process is not None else ""
        self.close()
        return {"ok": False, "reason": reason, "error": (detail + "\n" + stderr).strip()}


# What an ok result of each kind of request carries (`probe_worker.py`), by type.
OK_FIELDS: dict[str, dict[str, type]] = {
    "data_model": {"db_class": str},
    "database": {"tables": dict},
    "tools": {"tools": dict, "schemas": list},
    "replay": {"changed": bool},
}


def result_problem(result: Any, kind: str) -> str:
    """ "" when `result` is a probe result of `kind` (an `ok` flag; when ok, the fields of
    `OK_FIELDS[kind]`; when not, a known `reason` and a text `error`), else what is wrong."""
    if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
        return "no result with an ok flag"
    if not result["ok"]:
        if result.get("reason") not in REASONS:
            return f"unknown reason {result.get('reason')!r}"
        if not isinstance(result.get("error", ""), str):
            return "an error that is not text"
        return ""
    wrong = [
        name
        for name, field_type in OK_FIELDS.get(kind, {}).items()
        if not isinstance(result.get(name), field_type)
    ]
    if wrong:
        return f"a {kind} result without {', '.join(wrong)}"
    if kind == "tools" and not all(
        isinstance(s, dict) and isinstance(s.get("function"), dict) for s in result["schemas"]
    ):
        return "tool schemas that are not OpenAI function schemas"
    return ""
