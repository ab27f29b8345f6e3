"""Sandboxes by config string (`tools.sandbox`): where model-written code runs.

`SANDBOXES` maps a name to a factory `() -> run_code`, where
`run_code(code, *, timeout_s, **limits) -> SandboxResult` (`python_sandbox.py`).
A factory raises `SandboxUnavailable`, saying what to install or choose instead,
when its sandbox cannot run on this machine, so a config check fails at start-up
rather than at the first tool call.

  "bwrap"    `run_python` under bubblewrap: namespaces, a fresh uid, limits
  "rlimits"  `run_python` with resource limits only (no network or file
             isolation): trusted set-ups only

`make_sandbox(name, memoize=True)` puts `sandbox_cache.MemoizedSandbox` in front
(only where every program's output is a function of its text).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from orchestra_jax.registry import Registry
from orchestra_jax.tools.python_sandbox import SandboxUnavailable, bwrap_available, run_python
from orchestra_jax.tools.sandbox_cache import MemoizedSandbox

RunCode = Callable[..., Any]

SANDBOXES: Registry[Callable[[], RunCode]] = Registry("sandbox")


@SANDBOXES.register("bwrap")
def _bwrap() -> RunCode:
    if not bwrap_available():
        raise SandboxUnavailable(
            "tools.sandbox='bwrap' needs bubblewrap: apt-get install bubblewrap "
            "(or --config.tools.sandbox=rlimits, which does not isolate the network "
            "or files: trusted set-ups only)"
        )
    return functools.partial(run_python, isolation="bwrap")


@SANDBOXES.register("rlimits")
def _rlimits() -> RunCode:
    return functools.partial(run_python, isolation="rlimits")


def make_sandbox(name: str, *, memoize: bool = False) -> RunCode:
    """The sandbox `name` (a registered name or "package.module:factory")."""
    run_code = SANDBOXES.get(name)()
    return MemoizedSandbox(run_code) if memoize else run_code


def sandbox_problem(name: str) -> str | None:
    """Why sandbox `name` cannot run here (one message), or None."""
    try:
        SANDBOXES.get(name)()
    except (ValueError, SandboxUnavailable) as e:
        return f"tools.sandbox: {e}"
    return None
