"""Config → weighted task sources: the bridge from a run config to the pipeline.

A config lists sources as mappings (dicts or ml_collections ConfigDicts):

    {"kind": "hle", "path": "/data/hle.parquet", "weight": 2.0}
    {"kind": "synthetic", "seed": 0, "split": "train", "n": 512, "name": "synth"}

`kind` picks the reader (`readers.READERS`), `name` (default: `kind`) labels
the source in the mixture and in logs, `weight` (default 1) is its mixing
share, and every other key is passed to the reader (`path`, `limit`,
`answer_type`, `fields`, `skip_images`, `seed`, `split`, `n`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra_jax.data.pipeline import WeightedSource
from orchestra_jax.data.readers import read_tasks
from orchestra_jax.data.rows import ReadReport

log = logging.getLogger(__name__)


def load_sources(
    specs: Sequence[Mapping[str, Any]],
) -> tuple[list[WeightedSource], list[ReadReport]]:
    """Reads every source of `specs`; logs and returns one `ReadReport` each.

    Raises ValueError when a source yields no tasks at all (every row bad, or an
    empty file): a run must not silently train on fewer sources than configured.
    """
    if not specs:
        raise ValueError("data config lists no task sources")
    sources, reports = [], []
    for index, spec in enumerate(specs):
        to_dict = getattr(spec, "to_dict", None)  # a ConfigDict
        options = dict(to_dict() if to_dict is not None else spec)
        if "kind" not in options:
            raise ValueError(f"task source #{index} has no 'kind' (one of the reader names)")
        kind = options.pop("kind")
        name = options.pop("name", kind)
        weight = float(options.pop("weight", 1.0))
        path = options.pop("path", None)
        tasks, report = read_tasks(kind, path, **options)
        log.info("task source %r: %s", name, report.summary())
        if not tasks:
            raise ValueError(f"task source {name!r} produced no tasks: {report.summary()}")
        sources.append(WeightedSource(name=name, tasks=tasks, weight=weight))
        reports.append(report)
    return sources, reports
