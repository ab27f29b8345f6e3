"""An append-only JSON-lines file that works on local disks and object stores.

Used for `metrics.jsonl` and `judge_cache.jsonl`. The records already in the
file are read on opening (a torn last line, from a killed writer, is dropped).

Local files: each record is appended and flushed at once, so a SIGKILL loses
nothing written before it.

Object stores (`gs://`) cannot append: an object is uploaded whole. Records
are kept in memory and `flush()` uploads the whole file, which replaces the
previous object atomically: a reader, or a resumed run, sees the file as of
some flush, complete, never torn. Rewriting beats one object per record here:
the logs stay one file for every reader (and the same file as on local disk),
they are small (a metrics record is ~1-2 KB, one per GRPO step; a judge
verdict ~100 bytes), and a flush costs one upload, not a listing of thousands
of objects on resume. The cost is an upload of the whole file per flush, so
callers flush once per step, not per record (`MetricsWriter` flushes after
each step's record; `JudgeCache` at most every `flush_interval_s` and at the
end of each step). A killed run loses what was not flushed: at most the
current step's metrics, or verdicts that are paid for again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from orchestra_jax.io import paths


class JsonlLog:
    """Records (JSON objects) of one `.jsonl` file, appended to and rewritten.

    `keep(record) -> bool`, when given, filters the records read on opening; the
    file is rewritten at once if any were dropped (e.g. metrics after a resumed
    checkpoint's step, or a torn line).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        keep: Callable[[dict], bool] | None = None,
    ):
        self.path = paths.as_path(path)
        self.remote = paths.is_remote(self.path)
        self.records: list[dict[str, Any]] = []
        self.dropped = 0
        self._dirty = False
        self._file = None
        self._last_flush = time.monotonic()
        if self.path.exists():
            lines = self.path.read_text(encoding="utf-8").splitlines()
            self.records = [r for r in map(_parse, lines) if r is not None]
            if keep is not None:
                self.records = [r for r in self.records if keep(r)]
            self.dropped = sum(1 for line in lines if line.strip()) - len(self.records)
        if self.dropped:
            paths.write_text_atomic(self.path, self._text())
        if not self.remote:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")

    @staticmethod
    def read(path: str | os.PathLike) -> list[dict[str, Any]]:
        """The records of a file, torn or malformed lines skipped."""
        lines = paths.as_path(path).read_text(encoding="utf-8").splitlines()
        return [r for r in map(_parse, lines) if r is not None]

    def append(self, record: dict[str, Any]) -> None:
        """Adds a record: written at once locally, at the next `flush` on an object store."""
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        else:
            self._dirty = True

    def flush(self) -> None:
        """Local: flushes the file; object store: uploads the whole file if it changed."""
        self._last_flush = time.monotonic()
        if self._file is not None:
            self._file.flush()
        elif self._dirty:
            paths.write_text_atomic(self.path, self._text())
            self._dirty = False

    def seconds_since_flush(self) -> float:
        return time.monotonic() - self._last_flush

    def truncate(self, keep: Callable[[dict], bool]) -> int:
        """Drops the records `keep` rejects, rewriting the file; returns how many."""
        kept = [r for r in self.records if keep(r)]
        dropped = len(self.records) - len(kept)
        if dropped:
            self.records = kept
            if self._file is not None:
                self._file.close()
            paths.write_text_atomic(self.path, self._text())
            self._dirty = False
            if self._file is not None:
                self._file = open(self.path, "a", encoding="utf-8")
        return dropped

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _text(self) -> str:
        return "".join(json.dumps(r) + "\n" for r in self.records)


def _parse(line: str) -> dict[str, Any] | None:
    """One line's record; None for a blank, torn or non-object line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None
