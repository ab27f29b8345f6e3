"""Shared helpers for benchmarks: fair alternating timing, medians, machine info, JSON output.

Every benchmark compares "ours" with a peer measured in the same run. Timing the
two alternately (ours, peer, ours, peer, ...) spreads background load on a shared
machine evenly over both, and reporting medians ignores the odd slow outlier.

API:
    machine_info() -> dict
    time_call(fn) -> float                       # seconds for one call of fn()
    alternate_timings(fns, repeats, warmup=1) -> dict[str, list[float]]
    summarize(timings) -> dict[str, dict]        # median / min / max / n per name
    code_version() -> dict                       # the commit timed, and whether the tree was clean
    result_suffix() -> str                       # "" on Python 3.11, "_py313" on 3.13, ...
    write_result(name, payload) -> pathlib.Path  # results/<name><suffix>.json with date, commit, machine
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


# CPU features that decide which matmul kernels XLA and oneDNN can use.
_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_model() -> dict[str, Any]:
    """The CPU's model name and which of `_CPU_FLAGS` it has (Linux; empty elsewhere)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {
        "cpu_model": fields.get("model name", ""),
        "cpu_flags": [f for f in _CPU_FLAGS if f in flags],
    }


# The stack whose versions decide a figure (installed versions, imported or not).
_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "torch")


def library_versions() -> dict[str, str]:
    """`_LIBRARIES`' installed versions (those not installed are left out)."""
    versions = {}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def machine_info() -> dict[str, Any]:
    """Platform, CPU model and flags, CPU count, Python, the library versions and
    (if imported) JAX's devices and torch's threads."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        **cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "libraries": library_versions(),
        # XLA flags change which CPU kernels a dot compiles to (decode_matmul_flags).
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
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
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


def code_version() -> dict[str, Any]:
    """The git commit of the checkout being timed and whether its code had uncommitted changes.

    `{"commit": None}` outside a git checkout (an installed copy): the figure then names
    no code, and the docs say so.
    """
    root = pathlib.Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        # Results written by earlier benchmarks of the same checkout do not count.
        dirty = bool(
            git("status", "--porcelain", "--untracked-files=no", "--", ".", f":!{RESULTS_DIR}")
        )
    except (OSError, subprocess.SubprocessError):
        return {"commit": None}
    return {"commit": commit, "dirty": dirty}


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


# The Python whose results carry no suffix: 3.11 (its last jax is 0.10.2), where the
# figures that docs/benchmarks.md cited first were measured.
_UNSUFFIXED_PYTHON = (3, 11)


def result_suffix(version: tuple[int, ...] | None = None) -> str:
    """The file-name suffix of a result written under Python `version` (default: this one).

    "" for Python 3.11, "_py313" for 3.13 (jax 0.12 there), so a run under another
    Python never overwrites the 3.11 record beside it.
    """
    major, minor = (version or sys.version_info)[:2]
    return "" if (major, minor) == _UNSUFFIXED_PYTHON else f"_py{major}{minor}"


def write_result(name: str, payload: Mapping[str, Any]) -> pathlib.Path:
    """Write `payload` plus UTC date, code version and machine info to
    results/<name><result_suffix()>.json.

    Returns the path.
    """
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "code": code_version(),
        "machine": machine_info(),
        **payload,
    }
    path = RESULTS_DIR / f"{name}{result_suffix()}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=False, default=str) + "\n")
    return path
