"""Run a coroutine to completion from synchronous code, inside notebooks too.

`asyncio.run` refuses to start when the calling thread already runs an event
loop, as Jupyter's does; there the coroutine runs on a fresh loop in a worker
thread instead, and its result or exception comes back to the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
