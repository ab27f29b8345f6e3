"""Raw rows from task files (jsonl, json, parquet) and the report of what was read.

Readers never crash on a bad row: each row is either a `dict` or a
`RowError` explaining why it could not be decoded, and every reader fills a
`ReadReport` that counts good, malformed and deliberately skipped rows and
keeps the first few error messages for the log. Format converters read
fields with `text_field` / `maybe_json` and raise `MalformedRow` for a row
that lacks what they need.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any, Literal, overload

from orchestra_jax.tasks import Task

# How many error messages a report keeps; the count keeps going past it.
MAX_REPORTED_ERRORS = 5


@dataclasses.dataclass
class ReadReport:
    """What one reader did with one source.

    `rows` = `tasks` + `malformed` + `skipped` always holds.
    """

    source: str
    rows: int = 0
    tasks: int = 0
    malformed: int = 0
    skipped: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)

    def add_task(self) -> None:
        self.rows += 1
        self.tasks += 1

    def add_skipped(self) -> None:
        self.rows += 1
        self.skipped += 1

    def add_malformed(self, where: str, message: str) -> None:
        self.rows += 1
        self.malformed += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(f"{where}: {message}")

    def summary(self) -> str:
        """One line for logs, e.g. `hle.jsonl: 98 tasks, 2 malformed, 0 skipped of 100 rows`."""
        text = (
            f"{self.source}: {self.tasks} tasks, {self.malformed} malformed, "
            f"{self.skipped} skipped of {self.rows} rows"
        )
        if self.errors:
            text += "; first errors: " + " | ".join(self.errors)
        return text


@dataclasses.dataclass(frozen=True)
class RowError:
    """A row that could not be decoded into a dict (bad JSON, not an object)."""

    message: str


def iter_rows(path: str | os.PathLike) -> Iterator[tuple[str, dict | RowError]]:
    """Yields `(where, row)` for every row of a `.jsonl`, `.json` or `.parquet` file.

    `where` names the row for error messages (`file.jsonl:17`). A `.json` file
    holds one list of objects. Missing files and unknown suffixes raise, since
    they are configuration mistakes rather than bad rows.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from _jsonl_rows(path)
    elif suffix == ".json":
        yield from _json_rows(path)
    elif suffix == ".parquet":
        yield from _parquet_rows(path)
    else:
        raise ValueError(
            f"task file {path}: unknown suffix {suffix!r}; expected .jsonl, .json or .parquet"
        )


def _jsonl_rows(path: pathlib.Path) -> Iterator[tuple[str, dict | RowError]]:
    with path.open(encoding="utf-8", errors="replace") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue  # blank lines (often a trailing one) are not rows
            yield f"{path.name}:{line_number}", _decode_object(line)


def _json_rows(path: pathlib.Path) -> Iterator[tuple[str, dict | RowError]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        yield f"{path.name}", RowError(f"invalid JSON file: {e}")
        return
    if not isinstance(data, list):
        yield f"{path.name}", RowError("a .json task file must hold a list of objects")
        return
    for index, row in enumerate(data):
        where = f"{path.name}[{index}]"
        yield where, row if isinstance(row, dict) else RowError(_not_object(row))


def _parquet_rows(path: pathlib.Path) -> Iterator[tuple[str, dict | RowError]]:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

    parquet = pq.ParquetFile(path)
    index = 0
    # Batches keep memory flat for large files; nested structs become dicts.
    for batch in parquet.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield f"{path.name}[{index}]", row
            index += 1


def _decode_object(text: str) -> dict | RowError:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return RowError(f"invalid JSON: {e}")
    return value if isinstance(value, dict) else RowError(_not_object(value))


def _not_object(value) -> str:
    return f"expected a JSON object, got {type(value).__name__}"


# ------------------------------------------------------- reading fields


class MalformedRow(ValueError):
    """A decoded row that lacks what its format needs."""


@overload
def text_field(row: dict, *names: str, required: Literal[True] = True) -> str: ...


@overload
def text_field(row: dict, *names: str, required: bool) -> str | None: ...


def text_field(row: dict, *names: str, required: bool = True) -> str | None:
    """The first of `names` present in `row` with a non-empty value, as a string.

    Numbers are accepted and stringified (ids and numeric answers often are).
    """
    for name in names:
        value = row.get(name)
        if value is None or value == "":
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise MalformedRow(f"field {name!r} must be a string, got {type(value).__name__}")
        return str(value)
    if required:
        raise MalformedRow(f"missing field {' or '.join(repr(n) for n in names)}")
    return None


def maybe_json(value: Any) -> Any:
    """Decodes JSON-encoded nested fields (some parquet exports store them as strings)."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


# A converter turns one row (and where it was, for messages) into a Task, or None to
# skip it on purpose.
RowConverter = Callable[[dict, str], "Task | None"]


def read_file(
    path: str | os.PathLike, convert: RowConverter, *, limit: int | None = None
) -> tuple[list[Task], ReadReport]:
    """Applies `convert` to every row of `path`; bad rows are counted, not raised.

    `limit` stops after that many tasks (handy for smoke runs).
    """
    report = ReadReport(source=os.fspath(path))
    tasks: list[Task] = []
    for where, row in iter_rows(path):
        if limit is not None and len(tasks) >= limit:
            break
        if isinstance(row, RowError):
            report.add_malformed(where, row.message)
            continue
        try:
            task = convert(row, where)
        # Task's own validation raises ValueError/TypeError; all are row problems.
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            report.add_malformed(where, str(e))
            continue
        if task is None:
            report.add_skipped()
        else:
            tasks.append(task)
            report.add_task()
    return tasks, report
