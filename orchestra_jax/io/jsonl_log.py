"""An append-only JSON-lines file that works on local disks and object stores.

Used for `metrics.jsonl` and `judge_cache.jsonl`. The records already in the
file are read on opening. Every record is written as one whole line, so a
writer killed mid-write leaves at most its last line torn (no line end): that
line is logged as a warning and dropped from the file. Any other line that is
not a record (a JSON object, and whatever the caller's `check` asks) raises
`error` naming the file and line: the file is then not what this class wrote
(edited, damaged, or written by another program), and a log whose records
feed a run (a judge's verdicts, the steps to resume) must not be guessed at.

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
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from orchestra_jax.io import paths

log = logging.getLogger(__name__)


class JsonlLogError(ValueError):
    """A JSON-lines log holds a line, other than a torn last one, that is not a record."""


class JsonlLog:
    """Records (JSON objects) of one `.jsonl` file, appended to and rewritten.

    `keep(record) -> bool`, when given, filters the records read on opening; the
    file is rewritten at once if any were dropped (e.g. metrics after a resumed
    checkpoint's step, or a torn last line). `check(record)` returns what is
    wrong with a record, or None; `what` names a record and `error` is the
    exception raised for a bad line (see the module docstring).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        keep: Callable[[dict], bool] | None = None,
        check: Callable[[dict], str | None] | None = None,
        what: str = "JSON record",
        error: type[ValueError] = JsonlLogError,
    ):
        self.path = paths.as_path(path)
        self.remote = paths.is_remote(self.path)
        self.records: list[dict[str, Any]] = []
        self.dropped = 0
        self._dirty = False
        self._file = None
        self._last_flush = time.monotonic()
        rewrite = False
        if self.path.exists():
            text = self.path.read_text(encoding="utf-8")
            self.records = _read_records(os.fspath(self.path), text, check, what, error)
            if keep is not None:
                self.records = [r for r in self.records if keep(r)]
            self.dropped = sum(1 for line in text.splitlines() if line.strip()) - len(self.records)
            # A whole last record without its line end is kept, and ended, so the next
            # append starts a line of its own.
            rewrite = self.dropped > 0 or (bool(text) and not text.endswith("\n"))
        if rewrite:
            paths.write_text_atomic(self.path, self._text())
        if not self.remote:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")

    @staticmethod
    def read(
        path: str | os.PathLike,
        *,
        check: Callable[[dict], str | None] | None = None,
        what: str = "JSON record",
        error: type[ValueError] = JsonlLogError,
    ) -> list[dict[str, Any]]:
        """The records of a file, a torn last line skipped (others raise `error`)."""
        text = paths.as_path(path).read_text(encoding="utf-8")
        return _read_records(os.fspath(path), text, check, what, error)

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


def _read_records(
    path: str,
    text: str,
    check: Callable[[dict], str | None] | None,
    what: str,
    error: type[ValueError],
) -> list[dict[str, Any]]:
    """The records of a file's `text`; see the module docstring for bad lines."""
    lines = text.split("\n")  # the last item is "" when the text ends with a line end
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record, problem = _parse(line, check)
        if problem is None:
            records.append(record)
        elif number == len(lines):  # no line end after it: cut by a stopped writer
            log.warning(
                "%s: line %d was cut off by a stopped run (%d characters, no line end); dropped it",
                path,
                number,
                len(line),
            )
        else:
            raise error(
                f"{path}, line {number}: not a {what} ({problem}): {line[:80]!r}. "
                "Delete that line, or the file."
            )
    return records


def _parse(
    line: str, check: Callable[[dict], str | None] | None
) -> tuple[dict[str, Any], str | None]:
    """One line's record and what is wrong with it (None when nothing)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return {}, f"JSONDecodeError: {e}"
    if not isinstance(record, dict):
        return {}, f"a JSON {type(record).__name__}, not an object"
    problem = check(record) if check is not None else None
    return record, problem
