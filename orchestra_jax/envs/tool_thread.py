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


class _Call:
    """One call's thread and whether `fn` still runs in it (under `guard`, so an interrupt
    never reaches the thread once `fn` has returned, nor a thread that has ended)."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.running = True
        self.thread: threading.Thread | None = None

    def interrupt(self) -> bool:
        """Raises `ToolInterrupted` in the thread while `fn` runs (False when it no longer does)."""
        with self.guard:
            if not self.running or self.thread is None or self.thread.ident is None:
                return False
            done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self.thread.ident), ctypes.py_object(ToolInterrupted)
            )
            return done == 1

    def finished(self) -> None:
        """In the thread, once `fn` has returned: no interrupt from now on; one already
        sent but not yet raised is withdrawn."""
        with self.guard:
            self.running = False
            assert self.thread is not None and self.thread.ident is not None
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread.ident), None)


async def run_off_loop(fn: Callable[..., Any], *args: Any, lock: asyncio.Lock | None = None) -> Any:
    """`fn(*args)` in its own thread (module docstring); its value or its exception."""
    loop = asyncio.get_running_loop()
    if lock is not None:
        await lock.acquire()
    future: asyncio.Future = loop.create_future()
    call = _Call()

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
        outcome: tuple[Any, BaseException | None] | None = None
        while True:
            try:
                if outcome is None:
                    try:
                        outcome = (fn(*args), None)
                    except BaseException as e:  # handed to the awaiting task
                        outcome = (None, e)
                call.finished()
                break
            except ToolInterrupted as e:  # landed after `fn` returned, before `finished`
                if outcome is None:
                    outcome = (None, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop has closed; nobody waits
            pass

    call.thread = threading.Thread(
        target=target, name=f"tool:{getattr(fn, '__name__', fn)}", daemon=True
    )
    try:
        call.thread.start()
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        call.interrupt()
        raise
