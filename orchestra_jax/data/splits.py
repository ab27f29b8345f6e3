"""Training and held-out splits of task files: never a question in both.

A file source (`data.sources` entry other than "synthetic") is split one of two ways:

  data.eval_paths.<source>   a second file holds the held-out questions; the two
                             files must share no question id and no question text
                             (`check_disjoint`, a start-up error naming both)
  data.eval_fraction = f     one file, split by a seeded hash of each question's
                             family id: a task is held out iff
                             u(split_seed, family_id(id)) < f, where
                             u = first 8 bytes of sha256("<seed>/<id>") / 2**64.
                             The split of an id never depends on the other rows,
                             so a file that grows keeps every old question's side;
                             a training row repeating a held-out question under
                             another id is dropped.

A task and every task derived from it share a side: the family id of a task is
its id less the suffixes of derived tasks (`DERIVED_SUFFIXES`: "-evolved", the
harder variant `synthesis/stages.evolve_stage` makes of a task), so
`school-001-0-evolved` goes where `school-001-0` goes, and two split files in
which a task and its derived task are on different sides are refused as sharing
a question (`check_disjoint`).

f = 1 holds every question out (an evaluation-only config); f = 0 with no eval
file leaves a source without a held-out split, which evaluation refuses.
The synthetic source has its own splits (`data.eval_split`).

`data.search_whitelist`, a JSON file `{question id: [document id, …]}`, restricts
each listed question's searches to those documents (`Task.metadata
["allowed_doc_ids"]`, as the reference does for HLE).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra_jax.config_section import parse_sources
from orchestra_jax.data.config import DataConfig, source_path_key
from orchestra_jax.data.pipeline import WeightedSource
from orchestra_jax.data.readers import read_tasks
from orchestra_jax.data.sources import load_sources
from orchestra_jax.tasks import Task

TRAIN = "train"
DERIVED_SUFFIXES = ("-evolved",)  # what synthesis appends to the id of a derived task


class SplitError(ValueError):
    """A split that would leak held-out questions into training, or has none."""


def heldout_share(task_id: str, seed: int) -> float:
    """u(seed, id) in [0, 1): the first 8 bytes of sha256(f"{seed}/{id}") / 2**64."""
    digest = hashlib.sha256(f"{seed}/{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def family_id(task_id: str) -> str:
    """The id of the task `task_id` derives from (itself when it is no derived task):
    the id less every trailing suffix of `DERIVED_SUFFIXES` ("a-evolved-evolved" -> "a")."""
    family = task_id
    while derived := next((s for s in DERIVED_SUFFIXES if family.endswith(s)), None):
        if family == derived:  # nothing left to derive from: the id is its own
            break
        family = family.removesuffix(derived)
    return family


def hash_split(tasks: Sequence[Task], fraction: float, seed: int) -> tuple[list[Task], list[Task]]:
    """(training, held-out): a task is held out iff heldout_share(family_id(id), seed)
    < fraction, so a task and those derived from it share a side; training rows that
    repeat a held-out question (another id, same text) are dropped."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    train, heldout = [], []
    for task in tasks:
        (heldout if heldout_share(family_id(task.id), seed) < fraction else train).append(task)
    dropped = set(shared_questions(heldout, train))
    return [t for t in train if t.id not in dropped], heldout


def _question_key(text: str) -> str:
    return " ".join(text.lower().split())


def shared_questions(a: Sequence[Task], b: Sequence[Task]) -> list[str]:
    """Ids of tasks of `b` whose family id (`family_id`: a task, or one derived from it)
    or (whitespace- and case-normalised) question is in `a`."""
    families = {family_id(t.id) for t in a}
    questions = {_question_key(t.question) for t in a}
    return [
        t.id for t in b if family_id(t.id) in families or _question_key(t.question) in questions
    ]


def check_disjoint(train: Sequence[Task], heldout: Sequence[Task], what: str) -> None:
    """Raises SplitError (one line, naming `what`) when the splits share a question."""
    shared = shared_questions(train, heldout)
    if shared:
        raise SplitError(
            f"{what}: the held-out split shares {len(shared)} question(s) with training, "
            f"e.g. {shared[:3]}"
        )


def read_whitelist(path: str | os.PathLike) -> dict[str, list[str]]:
    """`{question id: [document id, …]}` from a JSON file (ValueError when malformed)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not all(
        isinstance(v, list) and all(isinstance(d, (str, int)) for d in v) for v in data.values()
    ):
        raise ValueError(f"{os.fspath(path)}: want a JSON object {{question id: [document ids]}}")
    return {str(k): [str(d) for d in v] for k, v in data.items()}


def attach_whitelist(tasks: Sequence[Task], whitelist: Mapping[str, Sequence[str]]) -> list[Task]:
    """Tasks whose id the whitelist lists get `metadata["allowed_doc_ids"]`; others unchanged."""
    return [
        dataclasses.replace(t, metadata={**t.metadata, "allowed_doc_ids": list(whitelist[t.id])})
        if t.id in whitelist
        else t
        for t in tasks
    ]


def _report(name: str, report: Any, split_tasks: int) -> dict[str, Any]:
    """A `ReadReport` as a JSON-ready dict, with the source's name and its split's size."""
    fields = dataclasses.asdict(report)
    return {
        "source": name,
        "source_file": fields.pop("source"),
        **fields,
        "split_tasks": split_tasks,
    }


def load_split(
    data: DataConfig, split: str, num_eval_tasks: int
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The tasks of `split` ("train", or the held-out split) of every source of the
    `data` section; the synthetic world gives `data.num_train_tasks` training tasks
    and `num_eval_tasks` (`eval.num_tasks`) held-out ones.

    Returns (`pipeline.WeightedSource` per source, one report dict per source:
    its file, rows read, tasks, rows skipped on purpose (e.g. HLE image
    questions) and malformed, and the tasks that fell in this split).
    """
    heldout = split != TRAIN
    whitelist = read_whitelist(data.search_whitelist) if data.search_whitelist else {}
    sources, reports = [], []
    for name, weight in parse_sources(data.sources):
        if name == "synthetic":
            spec = {
                "kind": "synthetic",
                "weight": weight,
                "seed": data.synthetic_seed,
                "split": data.eval_split if heldout else TRAIN,
                "n": num_eval_tasks if heldout else data.num_train_tasks,
                "num_entities": data.synthetic_num_entities,
            }
            [source], [report] = load_sources([spec])
            sources.append(source)
            reports.append(_report(name, report, len(source.tasks)))
            continue
        key = source_path_key(name)
        tasks, report = read_tasks(name, data.paths[key])
        eval_path = data.eval_paths.get(key)  # "": none
        if eval_path:
            eval_tasks, eval_report = read_tasks(name, eval_path)
            check_disjoint(
                tasks, eval_tasks, f"data.eval_paths.{key} ({eval_path}) and data.paths.{key}"
            )
            train_tasks = tasks
            if heldout:
                report = eval_report
        else:
            train_tasks, eval_tasks = hash_split(tasks, data.eval_fraction, data.split_seed)
        chosen = eval_tasks if heldout else train_tasks
        if not chosen:
            if heldout and not eval_path and data.eval_fraction == 0:
                raise SplitError(
                    f"data source {name!r} has no held-out split: set data.eval_paths.{key} "
                    "or data.eval_fraction > 0"
                )
            raise SplitError(
                f"data source {name!r}: no {'held-out' if heldout else 'training'} tasks "
                f"({report.summary()}; data.eval_fraction={data.eval_fraction})"
            )
        chosen = attach_whitelist(chosen, whitelist)
        sources.append(WeightedSource(name=name, tasks=chosen, weight=weight))
        reports.append(_report(name, report, len(chosen)))
    return sources, reports
