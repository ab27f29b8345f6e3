"""Shared helpers for benchmarks: fair alternating timing, medians, machine info, JSON output.

Every benchmark compares "ours" with a peer measured in the same run. Timing the
two alternately (ours, peer, ours, peer, ...) spreads background load on a shared
machine evenly over both, and reporting medians ignores the odd slow outlier.

API:
    machine_info() -> dict
    time_call(fn) -> float                       # seconds for one call of fn()
    alternate_timings(fns, repeats, warmup=1) -> dict[str, list[float]]
    summarize(timings) -> dict[str, dict]        # median / min / max / n per name
    write_result(name, payload) -> pathlib.Path  # results/<name>.json with date + machine
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    """Platform, CPU count, Python and (if imported) JAX / torch versions and devices."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        info["load_average_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    try:
        import jax

        info["jax"] = jax.__version__
        info["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception:  # JAX missing or not initialisable: the benchmark may not need it.
        pass
    import sys

    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


def time_call(fn: Callable[[], Any]) -> float:
    """Wall-clock seconds of one `fn()`; `fn` must block until its work is done."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate_timings(
    fns: Mapping[str, Callable[[], Any]], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Time each of `fns` `repeats` times, interleaved round-robin, after `warmup` untimed rounds.

    Each callable must block until its result is ready (call
    `jax.block_until_ready` inside it for JAX work).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    timings: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            timings[name].append(time_call(fn))
    return timings


def summarize(timings: Mapping[str, list[float]]) -> dict[str, dict[str, float]]:
    """Median, min, max and count of each named list of seconds."""
    return {
        name: {
            "median_s": statistics.median(ts),
            "min_s": min(ts),
            "max_s": max(ts),
            "n": len(ts),
        }
        for name, ts in timings.items()
    }


def write_result(name: str, payload: Mapping[str, Any]) -> pathlib.Path:
    """Write `payload` plus UTC date and machine info to results/<name>.json; return the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        **payload,
    }
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=False, default=str) + "\n")
    return path
