"""Runs probe requests (`probe_worker.py`) in a long-lived subprocess under resource limits.

The probe process imports tau2 once (seconds on a loaded CPU) and then answers
requests one at a time. It runs under util-linux `prlimit` (the project's
sandbox runner's limits, `tools/sandbox_process.prlimit_prefix`: address
space, processes, file size, open files, no core dumps), in its own session,
in a fresh scratch working directory, with no environment but the few
variables tau2 needs. Each request has a wall-time limit: a request that runs
past it, or a process that dies (memory, a crash, `sys.exit` in generated
code), fails with reason "timeout" or "crash", the whole process group is
killed, and the next request starts a fresh process.

This confines a generated tool's infinite loop, memory hog or crash to its
probe and keeps model-written code out of the pipeline's process; it is not
an isolation boundary against malicious code (the rlimits sandbox's caveats
apply: `tools/sandbox_rlimits.py`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from orchestra_jax.synthesis.probe_worker import RESULTS_MARKER
from orchestra_jax.tools import sandbox_process
from orchestra_jax.tools.sandbox_base import SandboxLimits

# The folder that holds the `orchestra_jax` package the probe process imports.
PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parents[2])


@dataclasses.dataclass(frozen=True)
class ProbeLimits:
    """Wall seconds per request, seconds for the process to start (importing tau2),
    its address space, and CPU seconds over its whole life (then it is restarted)."""

    timeout_s: float = 20.0
    startup_s: float = 120.0
    memory_mb: int = 4096
    cpu_s: int = 3600
    max_stderr_bytes: int = 16 * 1024 * 1024


class Prober:
    """`run(requests) -> results`, one result per request (module docstring)."""

    def __init__(self, limits: ProbeLimits = ProbeLimits(), *, tau2_data_dir: str = ""):
        if not sandbox_process.prlimit_available():
            raise RuntimeError("the synthesis probes need util-linux `prlimit` (Linux)")
        data_dir = tau2_data_dir or os.environ.get("TAU2_DATA_DIR", "")
        if not data_dir:
            raise ValueError("the synthesis probes need tau2's data folder: set $TAU2_DATA_DIR")
        self.limits = limits
        self.env = dict(
            sandbox_process.SANDBOX_ENV,
            PYTHONPATH=PACKAGE_ROOT,
            TAU2_DATA_DIR=os.path.abspath(data_dir),
            LITELLM_LOCAL_MODEL_COST_MAP="True",
        )
        self.processes = 0  # probe processes started (the report says how many)
        self._proc: subprocess.Popen | None = None
        self._scratch = ""
        self._stderr: Any = None
        self._ended = False  # the process's output ended (it died)

    def run(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self.one(request) for request in requests]

    def one(self, request: dict[str, Any]) -> dict[str, Any]:
        if self._proc is None or self._proc.poll() is not None:
            failure = self._start()
            if failure:
                return failure
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps(request) + "\n").encode("utf-8"))
            self._proc.stdin.flush()
        except BrokenPipeError:
            return self._died("crash")
        return self._answer(self.limits.timeout_s) or self._died(self._silence())

    def close(self) -> None:
        """Stops the probe process (the next request starts another)."""
        if self._proc is not None:
            if self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = ""

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> dict[str, Any] | None:
        self.close()
        self._scratch = tempfile.mkdtemp(prefix="orchestra_probe_")
        self._stderr = tempfile.TemporaryFile()
        limits = SandboxLimits(
            timeout_s=self.limits.cpu_s,
            memory_mb=self.limits.memory_mb,
            max_output_bytes=self.limits.max_stderr_bytes,
            max_processes=64,
        )
        prefix = sandbox_process.prlimit_prefix(
            limits, limits.max_processes + sandbox_process.own_process_count()
        )
        self._proc = subprocess.Popen(
            prefix + [sys.executable, "-m", "orchestra_jax.synthesis.probe_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=self._scratch,
            env=dict(self.env, HOME=self._scratch),
            start_new_session=True,
        )
        self.processes += 1
        ready = self._answer(self.limits.startup_s)
        if not (ready and ready.get("ready")):
            return self._died(self._silence())
        return None

    def _silence(self) -> str:
        """Why no answer came: "crash" when the output ended, else "timeout"."""
        return "crash" if self._ended else "timeout"

    def _answer(self, timeout_s: float) -> dict[str, Any] | None:
        """The next result line within `timeout_s`; None on timeout or end of output."""
        assert self._proc is not None and self._proc.stdout is not None
        self._ended = False
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                line = self._proc.stdout.readline()
                if not line:
                    self._ended = True
                    return None
                text = line.decode("utf-8", errors="replace")
                if text.startswith(RESULTS_MARKER):
                    return json.loads(text[len(RESULTS_MARKER) :])

    def _died(self, reason: str) -> dict[str, Any]:
        """Kills the process; the failure with the end of its stderr."""
        stderr = ""
        if self._stderr is not None:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - 2000))
            stderr = self._stderr.read().decode("utf-8", errors="replace")
        self.close()
        return {"ok": False, "reason": reason, "error": stderr}
