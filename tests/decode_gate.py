"""Test helpers that make "requests in flight" deterministic on a loaded machine.

`DecodeGate` holds a JaxEngine's decode calls (after `allow` of them) until it is
opened, so requests stay in flight however slow or fast the machine is;
`wait_until` polls a condition with a bound, so a test fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import threading
import time


class DecodeGate:
    """Lets `allow` decode calls through, then holds each one until `open()`."""

    def __init__(self, engine, monkeypatch, *, allow: int = 0, timeout_s: float = 120.0):
        self._opened = threading.Event()
        self.calls = 0
        real = engine._steps.decode

        def gated(*args, **kwargs):
            self.calls += 1
            if self.calls > allow:
                self._opened.wait(timeout_s)
            return real(*args, **kwargs)

        monkeypatch.setattr(engine._steps, "decode", gated)

    def open(self) -> None:
        self._opened.set()


async def wait_until(condition, *, timeout_s: float = 120.0, what: str = "condition") -> None:
    """Poll `condition()` until true; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)
