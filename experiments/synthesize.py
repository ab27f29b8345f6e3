r"""Synthesize ToolScale-style domains and tasks (orchestra_jax/synthesis/).

  python -m experiments.synthesize --config=experiments/configs/synthesize.py:demo
  python -m experiments.synthesize --config=experiments/configs/synthesize.py:toolscale_tasks \
      --config.domain.folder=railway --config.out_dir=/data/toolscale_railway

Writes `<out_dir>/tasks.json` (train on it with data.sources=toolscale,
data.paths.toolscale=<that file>) and `<out_dir>/report.md` / `report.json`;
started again over the same out_dir, a killed run continues where it stopped.
"""

import logging
import os
import sys

from ml_collections import config_flags

from orchestra_jax.training import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Synthesis config: path/to/synthesize.py:variant.", lock_config=True
)


def main(argv):
    del argv
    from orchestra_jax.synthesis.pipeline import synthesize
    from orchestra_jax.synthesis.stages import StageFailed

    config = _CONFIG.value
    if not config.out_dir:
        with config.unlocked():
            config.out_dir = os.path.join("runs", f"synthesize_{config.variant}")
    try:
        result = synthesize(config)
    except (StageFailed, ValueError) as e:
        sys.exit(f"error: {e} (see {config.out_dir}/report.md)")
    logging.info(
        "%d tasks in %s; report: %s",
        len(result.tasks),
        result.tasks_file,
        os.path.join(config.out_dir, "report.md"),
    )


if __name__ == "__main__":
    cli.run(main)
