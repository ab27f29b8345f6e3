"""Where a τ² domain's model-written code runs: the sandbox and the command that starts it.

A domain's `data_model.py` and `tools.py` are pydantic models and tau2
toolkits, so they need native CPython with tau2 and pydantic installed. Of the
project's sandboxes (`tools/sandbox/registry.py`), bubblewrap runs the caller's
own CPython in namespaces; the WebAssembly CPython has no pydantic (a
compiled extension) and cannot import tau2, so it cannot run domain code;
rlimits is no isolation, allowed only where the config says the code is
trusted (`code_is_trusted`), as for the code tool.

`start_python_module(...)` starts `python -I -m <module>` in the chosen backend
as a long-lived process with pipes on stdin and stdout:

  bwrap    new pid, network, IPC and mount namespaces (no network, no view of the
           host's processes: nothing of the caller's reachable through /proc), an
           empty environment but the variables given, a read-only view of the
           Python installation, of this package and of the `read_only` paths, a
           fresh size-limited tmpfs /scratch as the working directory; under
           `prlimit` (address space, CPU seconds, processes, file size, open files);
  rlimits  the same command without bwrap: limits only, every escape open
           (trusted code only; a warning says so).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import IO, Any

from orchestra_jax.tools.sandbox import bwrap as sandbox_bwrap
from orchestra_jax.tools.sandbox import process as sandbox_process
from orchestra_jax.tools.sandbox import registry as python_sandbox
from orchestra_jax.tools.sandbox.base import SandboxLimits, SandboxRefused, SandboxUnavailable

_log = logging.getLogger(__name__)

# The folder of the `orchestra_jax` package (made visible, read-only, in the sandbox).
PACKAGE_DIR = str(pathlib.Path(__file__).resolve().parents[1])
BACKENDS = ("bwrap", "rlimits")
WASM_REASON = (
    "the WebAssembly CPython has no pydantic (a compiled extension) and so cannot import "
    "tau2 or a domain's data model"
)


def domain_sandbox(name: str, *, code_is_trusted: bool) -> str:
    """The backend ("bwrap" or "rlimits") that runs domain code for `tools.sandbox=name`.

    Raises:
      SandboxUnavailable: bwrap cannot run here ("auto", "bwrap") or `name` is "wasm".
      SandboxRefused: "rlimits" without `code_is_trusted`.
      ValueError: an unknown name.
    """
    if name in ("auto", "bwrap"):
        reason = python_sandbox.get_sandbox("bwrap").unavailable_reason()
        if reason is not None:
            raise SandboxUnavailable(
                f"domain code runs in the bubblewrap sandbox, which cannot run here: {reason}"
                f" (wasm: {WASM_REASON})"
            )
        return "bwrap"
    if name == "wasm":
        raise SandboxUnavailable(f"tools.sandbox='wasm' cannot run domain code: {WASM_REASON}")
    if name == "rlimits":
        if not code_is_trusted:
            raise SandboxRefused(
                "tools.sandbox='rlimits' does not isolate model-written domain code (network, "
                "host files, the caller's environment through /proc stay open); use 'auto' or "
                "'bwrap', or set code_is_trusted=True for code you trust"
            )
        if not sandbox_process.prlimit_available():
            raise SandboxUnavailable("util-linux `prlimit` is missing (Linux only)")
        _log.warning(
            "domain code runs under rlimits only (code_is_trusted): network, host files and "
            "the caller's environment are open to it"
        )
        return "rlimits"
    raise ValueError(
        f"the domain-code sandbox must be one of auto, {', '.join(BACKENDS)}: {name!r}"
    )


@dataclasses.dataclass
class SandboxedProcess:
    """A started process: `proc` (pipes on stdin/stdout), its stderr file, its scratch folder
    on the host (rlimits only), and whether it has a pid namespace of its own."""

    proc: subprocess.Popen
    stderr: IO[bytes]
    host_scratch: str
    own_pid_namespace: bool

    def close(self) -> None:
        """Kills everything it started (its session) and removes its files."""
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self.stderr.close()
        if self.host_scratch:
            shutil.rmtree(self.host_scratch, ignore_errors=True)

    def stderr_tail(self, n: int = 2000) -> str:
        self.stderr.seek(0, os.SEEK_END)
        size = self.stderr.tell()
        self.stderr.seek(max(0, size - n))
        return self.stderr.read().decode("utf-8", errors="replace")


def start_python_module(
    backend: str,
    module: str,
    limits: SandboxLimits,
    *,
    read_only: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> SandboxedProcess:
    """Starts `python -I -m module *args` in `backend` (module docstring). `limits.timeout_s`
    is the process's CPU seconds over its whole life; the caller enforces wall time."""
    python = os.path.abspath(sys.executable)
    stderr = tempfile.TemporaryFile()
    python_args = ["-I", "-m", module, *args]
    if backend == "bwrap":
        bwrap = sandbox_bwrap.find_bwrap()
        if bwrap is None:
            raise SandboxUnavailable("no bwrap binary")
        if os.geteuid() == 0:
            run_as_uid, max_processes = sandbox_bwrap._fresh_uid(), limits.max_processes
        else:
            run_as_uid = None
            max_processes = limits.max_processes + sandbox_process.own_process_count()
        cmd = sandbox_bwrap.bwrap_command(
            bwrap,
            python,
            limits.scratch_mb * 1024 * 1024,
            run_as_uid,
            read_only=[PACKAGE_DIR, *read_only],
            env=env,
            python_args=python_args + ["--own-pid-namespace"],
        )
        host_scratch, cwd = "", "/"
        run_env: dict[str, Any] = dict(sandbox_process.SANDBOX_ENV, HOME="/")
    elif backend == "rlimits":
        host_scratch = tempfile.mkdtemp(prefix="orchestra_domain_")
        cmd, cwd = [python, *python_args], host_scratch
        max_processes = limits.max_processes + sandbox_process.own_process_count()
        run_env = dict(sandbox_process.SANDBOX_ENV, **(env or {}), HOME=host_scratch)
        # -I ignores PYTHONPATH; the package is found through the installation's own paths.
    else:
        raise ValueError(f"unknown domain-code backend {backend!r}")
    proc = subprocess.Popen(
        sandbox_process.prlimit_prefix(limits, max_processes) + cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        cwd=cwd,
        env=run_env,
        start_new_session=True,
    )
    return SandboxedProcess(proc, stderr, host_scratch, own_pid_namespace=backend == "bwrap")
