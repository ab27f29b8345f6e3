"""Per-step metrics: `<workdir>/metrics.jsonl`, TensorBoard events, a console line.

The workdir is a local folder or a `gs://` URI (`orchestra_jax/io/paths.py`).
`metrics.jsonl` holds one JSON object per step, `{"step": s, "time": unix, …}`,
an `io.jsonl_log.JsonlLog`: appended to locally, the whole file uploaded after
each step on an object store. A resumed run keeps its history:
`MetricsWriter(..., resume_step=s)` first drops lines with step > s (written
after the checkpoint being resumed from), so every step appears once.
TensorBoard events go to `<workdir>/tensorboard/`; on an object store
tensorboardX writes them into a local staging folder whose event files are
uploaded after each step (`io.staging.StagedFolder`). TensorBoard itself shows
the latest value written for a step, so re-written steps after a resume
display correctly.

On a multi-host job only process 0 writes: the others' writers are built with
`enabled=False` and write nothing (no file, no events, no console line).

Only numbers are logged: ints, floats, bools and 0-d arrays; NaN and ±inf are
written to the jsonl as null (strict JSON) and to TensorBoard as they are. Nested dicts are
flattened with "/" (`{"tools": {"search-1": 3}}` → `"tools/search-1"`), which
is also how TensorBoard groups them.
"""

from __future__ import annotations

import math
import numbers
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

from orchestra_jax.io import paths
from orchestra_jax.io.jsonl_log import JsonlLog
from orchestra_jax.io.staging import StagedFolder

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def flatten_scalars(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Nested mapping → flat `{"a/b": float}`; non-numeric leaves raise TypeError."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_scalars(value, prefix=f"{name}/"))
            continue
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()  # numpy / JAX scalars
        if not isinstance(value, numbers.Real):
            raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__}")
        flat[name] = float(value)
    return flat


def _step_at_most(record: Any, max_step: int) -> bool:
    try:
        return record["step"] <= max_step
    except (KeyError, TypeError):
        return False


def format_eta(seconds: float) -> str:
    """`3725.0` → `"1:02:05"`; unknown (nan/inf) → `"?"`."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(max(seconds, 0.0)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class MetricsWriter:
    """Writes each step's metrics to jsonl, TensorBoard and the console.

    ETA = (total_steps − step) × mean seconds per step over the steps logged by
    this process (so time spent before a resume does not skew it).
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        total_steps: int,
        use_tensorboard: bool = True,
        resume_step: int | None = None,
        console: bool = True,
        console_keys: Sequence[str] = ("reward", "accuracy", "cost_usd", "kl"),
        enabled: bool = True,
    ):
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.enabled = enabled
        self.workdir = paths.as_path(workdir)
        self.path = self.workdir / METRICS_FILE
        self.total_steps = total_steps
        self.console_keys = tuple(console_keys)
        self._start_time = time.monotonic()
        self._first_step: int | None = None
        self._log: JsonlLog | None = None
        self._tb = self._console = self._tb_staging = None
        if not enabled:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        keep = None if resume_step is None else (lambda r: _step_at_most(r, resume_step))
        self._log = JsonlLog(self.path, keep=keep)
        if use_tensorboard:
            from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

            self._tb_staging = StagedFolder(self.workdir / TENSORBOARD_DIR)
            # A suffix of its own: two writers started in the same second (a quick
            # resume) would otherwise name the same event file and one would replace the other.
            self._tb = SummaryWriter(
                logdir=os.fspath(self._tb_staging.local),
                filename_suffix=f".{uuid.uuid4().hex[:8]}",
            )
        if console:
            from rich.console import Console  # pylint: disable=g-import-not-at-top

            self._console = Console(stderr=True)

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Logs one step; returns the flattened scalars written."""
        flat = flatten_scalars(metrics)
        reserved = {"step", "time"} & flat.keys()
        if reserved:
            raise ValueError(f"metric names {sorted(reserved)} are reserved for the record itself")
        if self._log is None:  # disabled: not process 0
            return flat
        # Strict JSON has no NaN/Infinity: non-finite values are written as null.
        finite = {k: (v if math.isfinite(v) else None) for k, v in flat.items()}
        self._log.append({"step": int(step), "time": time.time(), **finite})
        if self._tb is not None:
            for name, value in flat.items():
                self._tb.add_scalar(name, value, global_step=step)
        if self._log.remote:
            # Locally the line is on disk already (and tensorboardX flushes on its own);
            # on an object store this uploads the file and the staged event files, so a
            # SIGKILL loses at most this step.
            self.flush()
        if self._console is not None:
            self._console.print(
                self.progress_line(step, flat), highlight=False, markup=False, soft_wrap=True
            )
        return flat

    def progress_line(self, step: int, flat: Mapping[str, float]) -> str:
        """`step 12/100 (12%) eta 0:01:40 | reward 0.412 | …` for the console."""
        if self._first_step is None:
            self._first_step = step
            self._start_time = time.monotonic()
            per_step = math.nan
        else:
            done = step - self._first_step
            per_step = (time.monotonic() - self._start_time) / done if done > 0 else math.nan
        eta = format_eta((self.total_steps - step) * per_step)
        parts = [f"step {step}/{self.total_steps} ({100 * step / self.total_steps:.0f}%) eta {eta}"]
        parts += [f"{key} {flat[key]:.4g}" for key in self.console_keys if key in flat]
        return " | ".join(parts)

    def truncate_after(self, step: int) -> int:
        """Drops already-written records with step > `step` (resume decided late)."""
        if self._log is None:
            return 0
        return self._log.truncate(lambda r: _step_at_most(r, step))

    def flush(self) -> None:
        if self._log is None:
            return
        if self._tb is not None:
            self._tb.flush()
        self._log.flush()
        if self._tb_staging is not None:
            self._tb_staging.upload()

    def close(self) -> None:
        if self._log is None:
            return
        if self._tb is not None:
            self._tb.close()
        self._log.close()
        if self._tb_staging is not None:
            self._tb_staging.close()
        self._log = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics.jsonl, a torn last line skipped; any other line that
    is not a JSON object raises `JsonlLogError` naming the file and line."""
    return JsonlLog.read(path, what="metrics record")


def plot_metrics(
    metrics_jsonl: str | os.PathLike, out_png: str | os.PathLike, keys: Sequence[str]
) -> epath.Path:
    """One curve per key (value against step), stacked vertically, saved as PNG."""
    import matplotlib  # pylint: disable=g-import-not-at-top

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

    if not keys:
        raise ValueError("plot_metrics needs at least one key")
    records = read_metrics(metrics_jsonl)
    fig, axes = plt.subplots(len(keys), 1, figsize=(6, 2.2 * len(keys)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, marker="." if len(points) < 50 else None)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    out_png = paths.as_path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    with out_png.open("wb") as f:
        fig.savefig(f, dpi=100, format="png")
    plt.close(fig)
    return out_png
