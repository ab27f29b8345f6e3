"""The `data` section of an experiment config as `DataConfig`: which task sources a
run trains on and in what mix, their files and held-out splits, and the synthetic
world's size and seed, checked once (`problems`). That every file source has a
held-out split when the run is evaluated is a rule between `data` and `eval`
(training/experiment_config.py)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from orchestra_jax.config_section import (
    ConfigError,
    Section,
    choice,
    parse_sources,
    parse_weighted,
)
from orchestra_jax.data.pipeline import STRATIFY_FIELDS
from orchestra_jax.data.readers import READERS
from orchestra_jax.registry import is_import_path


def source_path_key(source: str) -> str:
    """The `data.paths` key of a source: its name, or an import path's attribute name."""
    return source.rpartition(":")[2] if is_import_path(source) else source


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
    """`data.*`, named as in the config file (experiments/configs/grpo_hle.py says
    what each field does); `paths` and `eval_paths` map a file source's key
    (`source_path_key`) to its file."""

    SECTION = "data"

    sources: str = "synthetic"
    paths: dict[str, str] = dataclasses.field(default_factory=dict)
    eval_paths: dict[str, str] = dataclasses.field(default_factory=dict)
    eval_fraction: float = 0.0
    eval_split: str = "heldout"
    split_seed: int = 0
    num_train_tasks: int = 4096
    search_whitelist: str = ""
    stratify_by: str = ""
    stratum_weights: str = ""
    synthetic_num_entities: int = 400
    synthetic_seed: int = 0

    def problems(self) -> list[str]:
        errors = self._source_problems() + self._split_problems()
        if self.stratify_by:
            errors += choice("data.stratify_by", self.stratify_by, STRATIFY_FIELDS)
        try:
            weights = dict(parse_weighted(self.stratum_weights, "data.stratum_weights"))
            if weights and not self.stratify_by:
                errors.append(
                    "data.stratum_weights needs data.stratify_by (the field whose values it weighs)"
                )
            for value, weight in weights.items():
                if weight <= 0:
                    errors.append(f"data.stratum_weights: weight of {value!r} must be > 0")
        except ConfigError as e:
            errors.append(str(e))
        errors += self.positive("synthetic_seed", allow_zero=True)
        return errors

    def _source_problems(self) -> list[str]:
        errors = []
        try:
            sources = parse_sources(self.sources)
            if not sources:
                errors.append("data.sources is empty")
            for name, weight in sources:
                problem = READERS.problem(name)
                key = source_path_key(name)
                if problem is not None:
                    errors.append(f"data.sources: {problem}")
                elif name != "synthetic" and not self.paths.get(key):
                    errors.append(f"data.sources: {name!r} needs a file in data.paths.{key}")
                if weight <= 0:
                    errors.append(f"data.sources: weight of {name!r} must be > 0")
        except ConfigError as e:
            errors.append(str(e))
        return errors

    def _split_problems(self) -> list[str]:
        """data.eval_paths, data.eval_fraction, data.search_whitelist: a held-out file
        is a file source's, exists, and is not its training file."""
        errors = []
        if not 0 <= self.eval_fraction <= 1:
            errors.append(f"data.eval_fraction must be in [0, 1], got {self.eval_fraction}")
        keys = self.file_source_keys()
        for key, path in self.held_out_paths().items():
            if key not in keys:
                errors.append(f"data.eval_paths.{key}: no such file source in data.sources")
            elif not os.path.isfile(path):
                errors.append(f"data.eval_paths.{key}: no file {path!r}")
            elif self.paths.get(key) and os.path.abspath(path) == os.path.abspath(self.paths[key]):
                errors.append(
                    f"data.eval_paths.{key} is data.paths.{key}: the held-out split would "
                    "overlap training (give another file, or data.eval_fraction)"
                )
        if self.search_whitelist and not os.path.isfile(self.search_whitelist):
            errors.append(f"data.search_whitelist: no file {self.search_whitelist!r}")
        return errors

    def file_sources(self) -> list[str]:
        """The `sources` names other than "synthetic" (an unparsable list gives [])."""
        try:
            return [name for name, _ in parse_sources(self.sources) if name != "synthetic"]
        except ConfigError:
            return []

    def file_source_keys(self) -> set[str]:
        """The `paths` keys of the file sources."""
        return {source_path_key(name) for name in self.file_sources()}

    def held_out_paths(self) -> dict[str, Any]:
        """The `eval_paths` that are set: {key: file}."""
        return {key: path for key, path in self.eval_paths.items() if path}
