"""What every Python sandbox shares: its limits, its result, the escapes it must block.

A sandbox backend (bubblewrap, WebAssembly, rlimits) runs one program written
by a model and returns a `SandboxResult`. Each backend declares which of the
`ESCAPES` it cannot block (`Sandbox.unblocked`); the escape suite
(tests/test_tools_sandbox.py) checks every other one on every backend, and a
backend with any unblocked escape runs model-written code only where the
config says the code is trusted (`python_sandbox.prepare_sandbox`).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from orchestra_jax.tools import pricing

# What hostile code tries, and what "blocked" means for each:
ESCAPES = (
    "network",  # reaching a listener on the host (or anywhere) fails
    "host_files",  # reading a file of the host's (a temp dir, /etc, home) fails
    "environment",  # the caller's environment variables are not visible
    "writes_outside_scratch",  # writing anywhere but the scratch folder fails
    "cpu_time",  # a busy loop is stopped at the time limit
    "wall_time",  # a sleeping program is stopped at the time limit
    "memory",  # allocating past `memory_mb` fails inside the program
    "fork_bomb",  # at most `max_processes` processes (or none at all)
    "detached_survivors",  # nothing the program started runs on after the call
    "output_flood",  # stdout/stderr are cut at `max_output_bytes`
    "kill_caller",  # the calling process cannot be signalled or crashed
)
MAX_CODE_BYTES = 1 << 20


class SandboxUnavailable(RuntimeError):
    """The requested sandbox cannot run on this machine (the message says why)."""


class SandboxRefused(ValueError):
    """A sandbox that does not block every escape was asked to run untrusted code."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run.

    Attributes:
      timeout_s: wall-time limit; CPU time is limited to it as well.
      memory_mb: memory the program may allocate (address space per process for
        native backends, linear memory for WebAssembly).
      max_output_bytes: cap on stdout and on stderr (each), and on any file written.
      max_processes: cap on processes/threads (native backends; WebAssembly has none).
      scratch_mb: size of the writable scratch folder (the working directory).
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    max_output_bytes: int = 65536
    max_processes: int = 32
    scratch_mb: int = 64

    def __post_init__(self):
        for name in ("timeout_s", "memory_mb", "max_output_bytes", "max_processes", "scratch_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


@dataclasses.dataclass
class SandboxResult:
    """Outcome of one sandboxed run.

    Attributes:
      stdout / stderr: decoded output, at most `max_output_bytes` each.
      exit_code: the process exit status (negative: killed by that signal);
        None when it was stopped for running past the time limit.
      timed_out: True when the time limit was hit.
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


class Sandbox(Protocol):
    """A backend: `run` executes Python source under `limits`.

    Attributes:
      name: the registry key (`tools.sandbox`).
      unblocked: the `ESCAPES` this backend cannot block (empty for a real sandbox).
    """

    name: str
    unblocked: tuple[str, ...]

    def unavailable_reason(self) -> str | None:
        """None when the backend runs on this machine, else why not (with the fix)."""
        ...

    def describe(self) -> str:
        """One line for the log: what runs the code (binary, version)."""
        ...

    def warm_up(self) -> None:
        """One-off start-up work (e.g. compiling a module) before the first timed call."""
        ...

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        """Runs `code` (Python source) and returns how it ended."""
        ...


def decode_capped(data: bytes, limit: int) -> tuple[str, bool]:
    """(first `limit` bytes decoded as UTF-8 with replacement, whether `data` reached `limit`)."""
    return data[:limit].decode("utf-8", "replace"), len(data) >= limit
