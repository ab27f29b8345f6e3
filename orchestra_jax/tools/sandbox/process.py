"""Run a native command under resource limits: what the bwrap and rlimits sandboxes share.

`run_limited(cmd, code, limits, ...)` starts `prlimit <limits> -- cmd` in a new
session, writes `code` to its stdin, kills the whole session at the wall-time
limit, and reads at most `max_output_bytes` of stdout and stderr, which go to
files (so RLIMIT_FSIZE bounds them too).

Resource limits are set by util-linux `prlimit` at exec rather than by a Python
`preexec_fn`, because running Python between fork and exec can deadlock a
multithreaded parent (JAX).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import tempfile
import time

from orchestra_jax.tools.sandbox.base import SandboxLimits, SandboxResult, decode_capped

# Environment of sandboxed programs: nothing of the caller's.
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/scratch",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "MPLBACKEND": "Agg",
}


def prlimit_available() -> bool:
    return shutil.which("prlimit") is not None


def prlimit_prefix(limits: SandboxLimits, max_processes: int) -> list[str]:
    """`prlimit … --` with address space, CPU seconds (ceil(timeout) + 1), processes,
    file size (= max_output_bytes), open files (256) and no core dumps."""
    return [
        "prlimit",
        f"--as={limits.memory_mb * 1024 * 1024}",
        f"--cpu={math.ceil(limits.timeout_s) + 1}",
        f"--nproc={max_processes}",
        f"--fsize={limits.max_output_bytes}",
        "--nofile=256",
        "--core=0",
        "--",
    ]


def own_process_count() -> int:
    """Processes of this uid (RLIMIT_NPROC counts them all, not just ours)."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += os.stat(f"/proc/{pid}").st_uid == uid
            except OSError:
                pass
    return n


def _read_capped(path: str, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        return decode_capped(f.read(limit + 1), limit)


def run_limited(
    cmd: list[str],
    code: str,
    limits: SandboxLimits,
    *,
    cwd: str,
    env: dict[str, str],
    max_processes: int,
) -> SandboxResult:
    """Runs `prlimit … -- cmd` with `code` on stdin; see the module docstring."""
    host_dir = tempfile.mkdtemp(prefix="orchestra_sandbox_out_")
    try:
        out_path = os.path.join(host_dir, "stdout")
        err_path = os.path.join(host_dir, "stderr")
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                prlimit_prefix(limits, max_processes) + cmd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
            assert proc.stdin is not None
            timed_out = False
            try:
                proc.stdin.write(code.encode("utf-8"))
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it exited before reading everything; its status says why
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        duration = time.monotonic() - start
        stdout, cut_out = _read_capped(out_path, limits.max_output_bytes)
        stderr, cut_err = _read_capped(err_path, limits.max_output_bytes)
        return SandboxResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=None if timed_out else proc.returncode,
            timed_out=timed_out,
            output_truncated=cut_out or cut_err,
            duration_s=duration,
        )
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
