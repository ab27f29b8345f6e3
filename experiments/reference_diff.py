r"""Every setting of a config that differs from the reference release's recipe, and why.

    python -m experiments.reference_diff --config=experiments/configs/grpo_hle.py:qwen3_8b \
        [--config.a.b=value ...]

prints one line per setting (`training/reference_recipe.REFERENCE_SETTINGS`) the
config does not share with the release: the field, its value here, the release's
value and file, and what the difference does. Nothing is printed for the
release's recipe (`qwen3_8b`); a changed field makes the run no longer the
reference, and the line names it. Exit status 0 either way.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import app
from ml_collections import config_flags

from orchestra_jax.training.cli import parse_flags_or_exit
from orchestra_jax.training.reference_recipe import report

_CONFIG = config_flags.DEFINE_config_file("config", None, "An experiment config file:variant.")


def main(argv: Sequence[str]) -> None:
    del argv
    for line in report(_CONFIG.value):
        print(line)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags_or_exit)
