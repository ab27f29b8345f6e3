"""The run's own fields of an experiment config, typed: the top-level values as
`RunConfig` (seed, steps, tokenizer, variant, workdir), and the `checkpoint` and
`log` sections, each checked once (`problems`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from orchestra_jax.config_section import Section


@dataclasses.dataclass(frozen=True)
class RunConfig(Section):
    """The config's top-level values, named as in the config file."""

    seed: int = 0
    num_steps: int = 100
    tokenizer: str = "demo"
    variant: str = ""
    workdir: str = ""

    def problems(self) -> list[str]:
        errors = self.positive("num_steps") + self.positive("seed", allow_zero=True)
        if self.tokenizer != "demo" and not os.path.exists(
            os.path.join(self.tokenizer, "tokenizer.json")
        ):
            errors.append(
                f"tokenizer: 'demo' or a folder with tokenizer.json, got {self.tokenizer!r}"
            )
        return errors

    @staticmethod
    def top_level(config: Mapping[str, Any]) -> dict[str, Any]:
        """The config's top-level values this class holds (sections left out)."""
        names = [f.name for f in dataclasses.fields(RunConfig)]
        return {name: config[name] for name in names if name in config}

    def run_dir(self) -> str:
        """The run's folder: `workdir` (a local path or a `gs://` URI, see
        `orchestra_jax/io/paths.py`), by default `runs/<variant>`."""
        return self.workdir or os.path.join("runs", self.variant or "run")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(Section):
    """`checkpoint.*`: every how many steps a checkpoint is saved (0: the final step
    only), and how many are kept."""

    SECTION = "checkpoint"

    every_steps: int = 10
    keep: int = 3

    def problems(self) -> list[str]:
        return self.positive("keep") + self.positive("every_steps", allow_zero=True)


@dataclasses.dataclass(frozen=True)
class LogConfig(Section):
    """`log.*`: every how many steps trajectories are written (0: never), and
    whether metrics also go to TensorBoard."""

    SECTION = "log"

    trajectories_every: int = 1
    tensorboard: bool = True
