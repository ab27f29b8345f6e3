"""Seconds a thread spends compiling: tracing, lowering to MLIR and XLA compiles.

JAX reports each phase's duration to `jax.monitoring` listeners on the thread
that compiles. `charging(sink)` sends the current thread's compile seconds to
`sink` while it is active; `JaxEngine`'s scheduler thread charges its own
counter, and a request's measured latency leaves out the compile seconds spent
while it was in flight: a first call's compile is not the policy's serving
time, so the same policy evaluated first or second gets the same latency.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import jax

# The phases of a jit's first call (jax._src.dispatch's event names).
COMPILE_EVENTS = frozenset(
    {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    }
)

_local = threading.local()
_registered = False
_register_lock = threading.Lock()


def _listener(event: str, duration_secs: float, **kwargs: str | int) -> None:
    del kwargs
    sink = getattr(_local, "sink", None)
    if sink is not None and event in COMPILE_EVENTS:
        sink(duration_secs)


def _register() -> None:
    global _registered
    with _register_lock:
        if not _registered:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            _registered = True


@contextlib.contextmanager
def charging(sink: Callable[[float], None]) -> Iterator[None]:
    """Within the block, every compile phase run on this thread calls `sink(seconds)`."""
    _register()
    previous = getattr(_local, "sink", None)
    _local.sink = sink
    try:
        yield
    finally:
        _local.sink = previous
