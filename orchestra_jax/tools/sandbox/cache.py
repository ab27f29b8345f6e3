"""Run each distinct program once: a memo in front of a sandbox (`run_python`).

The offline environment's simulated experts write pure programs (no input, no
clock, no randomness), and a group plays the same question several times, so
most `enhance_reasoning` calls repeat a program already run (every entity and
logic question's reasoner prints the same "Nothing to compute" line). Starting
a sandbox costs tens of milliseconds of CPU; on a 2-core machine the warm
start's thousands of router episodes spent most of their time there.

Only for programs whose output is a function of their text: a model-written
program that reads the clock or draws random numbers would see its first
result again. Timed-out runs are not kept (they say more about the machine's
load than about the program).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any


class MemoizedSandbox:
    """`run_code(code, *, timeout_s, **limits)` with results kept per argument set.

    Thread-safe (tools call the sandbox from worker threads). Two first calls of
    one program that overlap may both run it; the results agree for pure programs.
    At most `max_entries` results are kept, least recently used dropped first.
    """

    def __init__(self, run_code: Callable[..., Any], *, max_entries: int = 65536):
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._run_code = run_code
        self._max_entries = max_entries
        self._results: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __call__(self, code: str, **limits: Any) -> Any:
        key = (code, tuple(sorted(limits.items())))
        with self._lock:
            if key in self._results:
                self._results.move_to_end(key)
                self.hits += 1
                return self._results[key]
            self.misses += 1
        result = self._run_code(code, **limits)
        if not getattr(result, "timed_out", False):
            with self._lock:
                self._results[key] = result
                while len(self._results) > self._max_entries:
                    self._results.popitem(last=False)
        return result
