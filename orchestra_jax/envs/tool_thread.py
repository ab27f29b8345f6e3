"""Run a domain tool's call off the event loop, in a thread that a timeout interrupts.

Domain tools (tau2's, ToolScale's) are plain synchronous Python. Awaited on
the agent's event loop they would freeze every other episode for as long as
they run, and no `asyncio.wait_for` could stop them. `run_off_loop(fn, …)`
runs `fn` in a thread of its own and awaits it; when the awaiting task is
cancelled (the tool runner's per-call timeout), `ToolInterrupted` is raised
inside that thread (`PyThreadState_SetAsyncExc`): a Python loop stops at its
next bytecode, a blocking C call (a sleep, a read) when it returns. The call's
caller sees the timeout at once either way.

One `asyncio.Lock` per episode (`lock`) keeps its calls in order and one at a
time, as tau2 runs them: it is released only when the thread has ended, so an
interrupted call never overlaps the next call on the same database.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import Callable
from typing import Any


class ToolInterrupted(Exception):
    """Raised inside a tool's thread when its call ran past its time limit."""


def interrupt(thread: threading.Thread) -> bool:
    """Raises `ToolInterrupted` in `thread` (False when it has already ended)."""
    if thread.ident is None or not thread.is_alive():
        return False
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(ToolInterrupted)
    )
    return done == 1


async def run_off_loop(fn: Callable[..., Any], *args: Any, lock: asyncio.Lock | None = None) -> Any:
    """`fn(*args)` in its own thread (module docstring); its value or its exception."""
    loop = asyncio.get_running_loop()
    if lock is not None:
        await lock.acquire()
    future: asyncio.Future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if lock is not None:
            lock.release()
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        value, error = None, None
        try:
            value = fn(*args)
        except BaseException as e:  # handed to the awaiting task
            error = e
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop has closed; nobody waits
            pass

    thread = threading.Thread(
        target=target, name=f"tool:{getattr(fn, '__name__', fn)}", daemon=True
    )
    try:
        thread.start()
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        interrupt(thread)
        raise
