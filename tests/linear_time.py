"""A scaling check for parsers of model output that a loaded 2-core machine cannot flake.

`growth(parse, make, n)` is the ratio of the CPU time `parse` takes on `make(16 * n)`
to the time on `make(n)`, each the least of several runs: about 16 for a linear-time
parser, up to 256 for a quadratic one (a tool-call parser that searches the
whole text per block measures 74 to 282 at n = 1000). Tests bound it at `LINEAR_BOUND`, 2.5 times the
linear value: CPU time (not wall time) leaves out other processes' share of the cores,
the least of several runs leaves out interruptions, and `n` is chosen so the small
input takes milliseconds, far above the clock's resolution.
"""

import time
from collections.abc import Callable

FACTOR = 16
LINEAR_BOUND = 2.5 * FACTOR


def cpu_seconds(parse: Callable[[str], object], text: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        parse(text)
        best = min(best, time.process_time() - start)
    return best


def growth(parse: Callable[[str], object], make: Callable[[int], str], n: int) -> float:
    small, large = make(n), make(FACTOR * n)
    parse(small)  # warm caches and lazy imports before timing
    return cpu_seconds(parse, large, 3) / max(cpu_seconds(parse, small, 5), 1e-6)
