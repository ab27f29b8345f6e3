"""Resource limits only (`tools.sandbox="rlimits"`): NOT a sandbox, for trusted code.

The program runs as `python -I -` under the limits of `sandbox_process`
(address space, CPU seconds, processes, file size, open files), in a fresh
working directory with an empty environment. It sees the network and every
file its user can read or write, can read the caller's environment through
/proc, can signal the caller, and a child that leaves the session outlives the
call; run as root, the process limit does not apply. `unblocked` lists those
escapes, so model-written code is refused here unless the config says the
code is trusted (`tools.code_is_trusted`), and then a warning says what is open.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from orchestra_jax.tools.sandbox import process as sandbox_process
from orchestra_jax.tools.sandbox.base import SandboxLimits, SandboxResult, SandboxUnavailable


class RlimitsSandbox:
    """`tools.sandbox="rlimits"`; see the module docstring."""

    name = "rlimits"

    def __init__(self, python: str | None = None):
        self.python = os.path.abspath(python or sys.executable)
        self.unblocked: tuple[str, ...] = (
            "network",
            "host_files",
            "environment",
            "writes_outside_scratch",
            "detached_survivors",
            "kill_caller",
        ) + (("fork_bomb",) if hasattr(os, "geteuid") and os.geteuid() == 0 else ())

    def unavailable_reason(self) -> str | None:
        if not sandbox_process.prlimit_available():
            return "util-linux `prlimit` is missing (Linux only)"
        return None

    def describe(self) -> str:
        return f"{self.python} -I under prlimit (no isolation)"

    def warm_up(self) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise SandboxUnavailable(reason)

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        self.warm_up()
        scratch = tempfile.mkdtemp(prefix="orchestra_rlimits_")
        try:
            return sandbox_process.run_limited(
                [self.python, "-I", "-"],
                code,
                limits,
                cwd=scratch,
                env=dict(sandbox_process.SANDBOX_ENV, HOME=scratch),
                max_processes=limits.max_processes + sandbox_process.own_process_count(),
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
