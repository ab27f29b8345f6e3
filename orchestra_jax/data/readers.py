"""Task readers: rows of public task files → `orchestra_jax.tasks.Task`, keyed by config strings.

`read_tasks(kind, path, **options) -> (tasks, report)` is the one entry point.
Kinds:

- `"tau2"`: τ²-bench tasks from a tau2 domain folder (option `split`) or a
  file of tau2 task rows; `"toolscale"`: the same reader for ToolScale rows
  (HF `nvidia/ToolScale`, tau2's task schema). The tasks are played and graded
  by the "tau2" environment (`data/tau2_tasks.py`, `envs/tau2/env.py`).
- `"generalthought"`: GeneralThought-style QA (`question`, `reference_answer`
  or `answer`, optional `question_id`, `task`, `question_source`,
  `model_answer`); rows without a gold answer are skipped.
- `"hle"`: Humanity's Last Exam (`id`, `question`, `answer`, `answer_type` in
  `exactMatch` | `multipleChoice`, `category`); image questions are skipped
  (and counted) unless `skip_images=False`. Graded as the reference grades it:
  exact match after normalisation, else the LLM judge (`answer_type="judge"`;
  `answer_type="exact"` compares strings only).
- `"frames"`: FRAMES (`id`, `question`, `answer`), domain `"frames"`.
- `"jsonl"`: any jsonl/json/parquet file with a `FieldMap`.
- `"synthetic"`: `data.synthetic_tasks.SyntheticTasks(seed=...).tasks(split, n)`.

A row that cannot become a Task is counted in the report as malformed, with the
first few reasons kept; it never stops the read.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable

from orchestra_jax.data.rows import MalformedRow, ReadReport, read_file, text_field
from orchestra_jax.data.synthetic_tasks import SyntheticTasks
from orchestra_jax.data.tau2_tasks import read_tau2_tasks
from orchestra_jax.registry import Registry
from orchestra_jax.tasks import ANSWER_TYPES, Task


def _check_answer_type(answer_type: str) -> str:
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"answer_type must be one of {ANSWER_TYPES}, got {answer_type!r}")
    return answer_type


# ---------------------------------------------------------------- formats


def generalthought_task(
    row: dict, where: str, *, answer_type: str = "judge", use_model_answer: bool = False
) -> Task | None:
    """GeneralThought QA → Task; answers are free-form, so a judge grades by default.

    The gold answer is `reference_answer` (or `answer`). Many GeneralThought rows
    have none; they are skipped, unless `use_model_answer` accepts the distilled
    model's `model_answer` instead (recorded as `metadata["answer_from"]`).
    """
    question = text_field(row, "question")
    answer_from = "reference_answer" if row.get("reference_answer") not in (None, "") else "answer"
    answer = text_field(row, "reference_answer", "answer", required=False)
    if answer is None and use_model_answer:
        answer_from, answer = "model_answer", text_field(row, "model_answer", required=False)
    if answer is None:
        return None
    task_id = text_field(row, "question_id", "id", required=False) or where
    return Task(
        id=f"generalthought/{task_id}",
        question=question,
        answer=answer,
        answer_type=answer_type,
        domain="generalthought",
        metadata={
            "source": "generalthought",
            "answer_from": answer_from,
            "task": row.get("task"),
            "question_source": row.get("question_source"),
        },
    )


# HLE's own answer types.
_HLE_ANSWER_TYPES = ("exactMatch", "multipleChoice")


def hle_task(
    row: dict, where: str, *, skip_images: bool = True, answer_type: str = "judge"
) -> Task | None:
    """HLE → Task, graded by `answer_type` ("judge": exact match, then the LLM
    judge, as the reference; "exact": strings only). The original type and the
    category stay in metadata (`category` drives the per-category report)."""
    if skip_images and row.get("image"):
        return None  # text-only orchestrator: image questions are skipped, not malformed
    hle_type = text_field(row, "answer_type")
    if hle_type not in _HLE_ANSWER_TYPES:
        raise MalformedRow(f"answer_type {hle_type!r} is not one of {sorted(_HLE_ANSWER_TYPES)}")
    return Task(
        id=text_field(row, "id"),
        question=text_field(row, "question"),
        answer=text_field(row, "answer"),
        answer_type=answer_type,
        domain="hle",
        metadata={
            "source": "hle",
            "hle_answer_type": hle_type,
            "category": row.get("category"),
            "raw_subject": row.get("raw_subject"),
        },
    )


def frames_task(row: dict, where: str, *, answer_type: str = "judge") -> Task:
    """FRAMES → Task; the `wiki____N` id names the Wikipedia index the release uses."""
    return Task(
        id=text_field(row, "id"),
        question=text_field(row, "question"),
        answer=text_field(row, "answer"),
        answer_type=answer_type,
        domain="frames",
        metadata={"source": "frames"},
    )


@dataclasses.dataclass(frozen=True)
class FieldMap:
    """Which columns of a generic file hold which Task fields.

    `answer_type_field` / `domain_field`, when set and present in a row, override
    the constant `answer_type` / `domain`. Columns not mapped go to metadata.
    """

    id: str = "id"
    question: str = "question"
    answer: str = "answer"
    answer_type: str = "exact"
    answer_type_field: str | None = None
    domain: str = "jsonl"
    domain_field: str | None = None


def mapped_task(row: dict, where: str, *, fields: FieldMap = FieldMap()) -> Task:
    answer_type = fields.answer_type
    if fields.answer_type_field and row.get(fields.answer_type_field):
        answer_type = str(row[fields.answer_type_field])
        if answer_type not in ANSWER_TYPES:
            raise MalformedRow(f"answer_type {answer_type!r} is not one of {ANSWER_TYPES}")
    domain = fields.domain
    if fields.domain_field and row.get(fields.domain_field):
        domain = str(row[fields.domain_field])
    mapped = {
        fields.id,
        fields.question,
        fields.answer,
        fields.answer_type_field,
        fields.domain_field,
    }
    return Task(
        id=text_field(row, fields.id, required=False) or where,
        question=text_field(row, fields.question),
        answer=text_field(row, fields.answer),
        answer_type=answer_type,
        domain=domain,
        metadata={k: v for k, v in row.items() if k not in mapped},
    )


# --------------------------------------------------------------- registry


def _synthetic(
    *, seed: int = 0, split: str = "train", n: int = 256, num_entities: int = 400
) -> tuple[list[Task], ReadReport]:
    tasks = SyntheticTasks(seed=seed, num_entities=num_entities).tasks(split, n)
    return tasks, ReadReport(source=f"synthetic:{split}", rows=len(tasks), tasks=len(tasks))


def _file_reader(convert_fn: Callable[..., Task | None]):
    def read(path: str | os.PathLike, *, limit: int | None = None, **options):
        # Bad options are configuration mistakes: fail here, not once per row.
        try:
            inspect.signature(convert_fn).bind(None, None, **options)
        except TypeError as e:
            raise TypeError(f"{convert_fn.__name__}: {e}") from None
        if "answer_type" in options:
            _check_answer_type(options["answer_type"])
        return read_file(path, lambda row, where: convert_fn(row, where, **options), limit=limit)

    return read


def _jsonl(
    path: str | os.PathLike, *, limit: int | None = None, fields: FieldMap | dict | None = None
):
    fields = fields if isinstance(fields, FieldMap) else FieldMap(**(fields or {}))
    _check_answer_type(fields.answer_type)
    return read_file(path, lambda row, where: mapped_task(row, where, fields=fields), limit=limit)


# `data.sources` names: a reader is `(path, *, limit=None, **options) -> (tasks,
# ReadReport)` ("synthetic" takes no path); "package.module:reader" names one's own.
READERS: Registry[Callable[..., tuple[list[Task], ReadReport]]] = Registry("task source")
READERS.register("tau2", read_tau2_tasks)
READERS.register("toolscale", functools.partial(read_tau2_tasks, source="toolscale"))
READERS.register("generalthought", _file_reader(generalthought_task))
READERS.register("hle", _file_reader(hle_task))
READERS.register("frames", _file_reader(frames_task))
READERS.register("jsonl", _jsonl)
READERS.register("synthetic", _synthetic)


def read_tasks(
    kind: str, path: str | os.PathLike | None = None, **options
) -> tuple[list[Task], ReadReport]:
    """Reads tasks of format `kind` (a `READERS` name or "package.module:reader").

    File kinds need `path`; `"synthetic"` takes `seed`, `split`, `n` instead.
    Options per kind: `limit` (all file kinds), `answer_type` (generalthought,
    frames, hle), `use_model_answer` (generalthought), `skip_images` (hle), `fields`
    (jsonl: `FieldMap` or its kwargs), `domain` and `split` (tau2, toolscale).
    """
    reader = READERS.get(kind)
    if kind == "synthetic":
        if path is not None:
            raise ValueError(
                "the 'synthetic' source takes no path (it generates tasks from a seed)"
            )
        return reader(**options)
    if path is None:
        raise ValueError(f"task source {kind!r} needs a path")
    return reader(path, **options)
