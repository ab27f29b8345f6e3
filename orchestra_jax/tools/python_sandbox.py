"""Run model-written Python as hostile input.

`run_python(code)` executes `code` with `python -I` in a bubblewrap (`bwrap`)
sandbox and returns its output, exit code and wall time.

What protects the host (isolation="bwrap", the default):
  * namespaces: new pid, network (no interfaces but its own loopback), IPC,
    UTS and cgroup namespaces, a private mount namespace; the sandbox dies
    with its parent;
  * identity: run by an unprivileged user, bwrap maps it to uid 65534 in a new
    user namespace; run by root, bwrap starts privileged and `setpriv` drops
    the code to a fresh unprivileged uid with no capabilities and
    no_new_privs (a fresh uid because the kernel never applies the process
    limit to uid 0 and so that concurrent runs don't share the budget);
  * file system: only read-only system directories (/usr and the /bin, /lib…
    links) and the Python installation are visible, plus a fresh in-memory
    scratch folder (/scratch, the working directory, size-limited tmpfs);
    nothing of the host's /tmp, /home, /root, /work, /etc;
  * environment: cleared; only PATH, HOME and thread-count variables are set;
  * resource limits (set by util-linux `prlimit` at exec, inherited):
    address space (`memory_mb`), CPU seconds (timeout + 1), processes
    (`max_processes`; for a non-root caller the limit is its current process
    count plus `max_processes`), file size (`max_output_bytes`, which also
    bounds stdout and stderr because they are written to files), open files,
    no core dumps;
  * wall time: the whole process tree is killed after `timeout_s`.

isolation="rlimits" (only for trusted code, e.g. where user namespaces are
disabled): the same resource limits, a fresh working directory and an empty
environment, but NO network or file-system isolation, and a process running
as root is not bound by the process limit. It must be chosen explicitly;
`run_python` never falls back to it silently.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from orchestra_jax.tools import pricing

ISOLATIONS = ("bwrap", "rlimits")
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/scratch",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "MPLBACKEND": "Agg",
}
MAX_CODE_BYTES = 1 << 20  # the program is written to a pipe before it runs
SANDBOX_UID_BASE = 2_000_000
SANDBOX_UID_SPAN = 1_000_000


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot run on this machine."""


@dataclasses.dataclass
class SandboxResult:
    """Outcome of one `run_python` call.

    Attributes:
      stdout / stderr: decoded output, at most `max_output_bytes` each.
      exit_code: the process exit status (negative: killed by that signal);
        None when it was killed for running past the wall-time limit.
      timed_out: True when the wall-time limit was hit.
      output_truncated: True when stdout or stderr reached `max_output_bytes`.
      duration_s: wall seconds from start to exit (what execution is billed by).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    output_truncated: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def cost_usd(self, price_per_second: float = pricing.CODE_PRICE_PER_SECOND) -> float:
        """duration_s * price_per_second."""
        return pricing.code_cost(self.duration_s, price_per_second)


def bwrap_available() -> bool:
    """True when bubblewrap and util-linux `prlimit` (and, for root, `setpriv`)
    are installed."""
    if shutil.which("bwrap") is None or shutil.which("prlimit") is None:
        return False
    return os.geteuid() != 0 or shutil.which("setpriv") is not None


def _fresh_uid() -> int:
    """An unused-looking unprivileged uid for one sandbox run.

    Running as root, the sandboxed code gets its own uid so RLIMIT_NPROC (which
    the kernel never applies to uid 0) bounds exactly this run's processes.
    """
    return SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN)


def _ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b'] (directories to create before binding c)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _bwrap_command(python: str, scratch_bytes: int, run_as_uid: int | None) -> list[str]:
    """The bwrap command line; `run_as_uid` set means we are root (see below)."""
    cmd = [
        "bwrap",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
    ]
    if run_as_uid is None:
        # Unprivileged caller: a user namespace maps it to uid 65534 inside.
        cmd += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
    else:
        # Root caller: bwrap keeps only the capabilities `setpriv` needs to drop
        # to `run_as_uid`; after that the code has no capabilities at all.
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    cmd += ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    # The Python installation (and a virtualenv, if any) must be readable; its
    # parent directories are created world-traversable (the host's may not be).
    prefixes = sorted(
        {
            os.path.realpath(sys.base_prefix),
            os.path.realpath(sys.prefix),
            os.path.dirname(os.path.dirname(python)),
        }
    )
    made = set()
    for prefix in prefixes:
        if prefix.startswith("/usr/") or prefix == "/usr":
            continue
        for parent in _ancestors(prefix):
            if parent not in made:
                made.add(parent)
                cmd += ["--perms", "0755", "--dir", parent]
        cmd += ["--ro-bind", prefix, prefix]
    cmd += [
        "--perms",
        "0777",
        "--size",
        str(scratch_bytes),
        "--tmpfs",
        "/scratch",
        "--chdir",
        "/scratch",
        "--clearenv",
    ]
    for k, v in SANDBOX_ENV.items():
        cmd += ["--setenv", k, v]
    cmd.append("--")
    if run_as_uid is not None:
        cmd += [
            "setpriv",
            f"--reuid={run_as_uid}",
            f"--regid={run_as_uid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ]
    return cmd + [python, "-I", "-"]


def _own_process_count() -> int:
    """Processes of this uid (RLIMIT_NPROC counts them all, not just ours)."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += os.stat(f"/proc/{pid}").st_uid == uid
            except OSError:
                pass
    return n


def _prlimit_prefix(
    memory_mb: int, cpu_s: int, max_processes: int, max_output_bytes: int
) -> list[str]:
    """`prlimit … --`: resource limits set by util-linux `prlimit` at exec.

    An exec-time tool instead of a Python `preexec_fn`, because running Python
    between fork and exec can deadlock a multithreaded parent (JAX).
    """
    return [
        "prlimit",
        f"--as={memory_mb * 1024 * 1024}",
        f"--cpu={cpu_s}",
        f"--nproc={max_processes}",
        f"--fsize={max_output_bytes}",
        "--nofile=256",
        "--core=0",
        "--",
    ]


def _read_capped(path: str, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data[:limit].decode("utf-8", "replace"), len(data) >= limit


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_output_bytes: int = 65536,
    max_processes: int = 32,
    scratch_mb: int = 64,
    isolation: str = "bwrap",
    python: str | None = None,
) -> SandboxResult:
    """Runs `code` in a sandbox (see the module docstring) and returns the result.

    Args:
      code: Python source, fed to `python -I -` on stdin.
      timeout_s: wall-time limit; CPU time is limited to ceil(timeout_s) + 1 s.
      memory_mb: address-space limit of every sandboxed process.
      max_output_bytes: cap on stdout and stderr (each) and on any file written.
      max_processes: cap on processes/threads inside the sandbox.
      scratch_mb: size of the in-memory scratch folder (bwrap only).
      isolation: "bwrap" (default) or "rlimits" (weak; see module docstring).
      python: interpreter path; defaults to this process's interpreter.

    Raises:
      SandboxUnavailable: isolation "bwrap" without a working `bwrap`.
      ValueError: on bad limits, an unknown isolation, or code over 1 MiB.
    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes <= 0:
        raise ValueError("timeout_s, memory_mb and max_output_bytes must be > 0")
    if len(code.encode("utf-8")) > MAX_CODE_BYTES:
        raise ValueError(f"code is longer than {MAX_CODE_BYTES} bytes")
    if shutil.which("prlimit") is None:
        raise SandboxUnavailable(
            "util-linux `prlimit` is required to set the sandbox's resource limits"
        )
    python = os.path.realpath(python or sys.executable)
    host_dir = tempfile.mkdtemp(prefix="orchestra_sandbox_")
    try:
        if isolation == "bwrap":
            if not bwrap_available():
                raise SandboxUnavailable(
                    "bubblewrap (`bwrap`) is not installed; install the Debian "
                    "package `bubblewrap` (and util-linux `setpriv` when running as "
                    "root), or pass isolation='rlimits' for trusted code only"
                )
            run_as_uid = _fresh_uid() if os.geteuid() == 0 else None
            cmd = _bwrap_command(python, scratch_mb * 1024 * 1024, run_as_uid)
            cwd, env = "/", dict(SANDBOX_ENV, HOME="/")
        else:
            run_as_uid = None
            cwd = os.path.join(host_dir, "scratch")
            os.mkdir(cwd)
            cmd, env = [python, "-I", "-"], dict(SANDBOX_ENV, HOME=cwd)
        if run_as_uid is None:
            max_processes += _own_process_count()
        out_path = os.path.join(host_dir, "stdout")
        err_path = os.path.join(host_dir, "stderr")
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                _prlimit_prefix(
                    memory_mb, math.ceil(timeout_s) + 1, max_processes, max_output_bytes
                )
                + cmd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.stdin.write(code.encode("utf-8"))
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it exited before reading everything; its status says why
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        duration = time.monotonic() - start
        stdout, cut_out = _read_capped(out_path, max_output_bytes)
        stderr, cut_err = _read_capped(err_path, max_output_bytes)
        if isolation == "bwrap" and proc.returncode == 1 and stderr.startswith("bwrap:"):
            raise SandboxUnavailable(f"bubblewrap failed to start: {stderr.strip()}")
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
