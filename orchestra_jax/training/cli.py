"""Command-line plumbing of the drivers (`experiments/*.py`, `orchestra_jax.serve`):
one-line errors, logging, multi-host.

The project's imports here sit inside the functions that need them: a bad flag or
override is reported before jax and the model code load (seconds)."""

import logging
import sys

from absl import app, flags


def parse_flags_or_exit(argv):
    """absl flag parsing, but a bad config or override exits with one line, not a traceback."""
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:  # an unknown --config.a.b field
        sys.exit(f"error: no config field {str(e).strip(chr(34))} (check the --config.* overrides)")
    except (flags.Error, TypeError, ValueError) as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        # ml_collections embeds get_config()'s traceback; its last line is the reason.
        sys.exit(f"error: {lines[-1] if lines else e}")


def validated(config):
    """The config, or exit with every problem listed (training/experiment_config.py), then
    with what cannot run on this job's devices (parallel/mesh.mesh_errors)."""
    import jax

    from orchestra_jax.config_section import ConfigError
    from orchestra_jax.training.builders import device_errors
    from orchestra_jax.training.experiment_config import validate

    try:
        validate(config)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    errors = device_errors(config, jax.device_count(), jax.process_count())
    if errors:
        sys.exit("error: invalid config for this job's devices:\n  " + "\n  ".join(errors))
    return config


def init_distributed(config=None):
    """Joins a multi-host job configured in `config.distributed` or the environment
    (orchestra_jax/parallel/distributed.py); a bad setting exits with one line."""
    from orchestra_jax.parallel import distributed
    from orchestra_jax.parallel.config import DistributedConfig

    try:
        section = None
        if config is not None and "distributed" in config:
            section = DistributedConfig.from_config(config.distributed)
        distributed.initialize(section)
    except ValueError as e:
        sys.exit(f"error: {e}")


def quiet_libraries():
    """Our progress at INFO; Orbax/absl chatter (one line per file written) at WARNING."""
    logging.getLogger("absl").setLevel(logging.WARNING)
    logging.getLogger().setLevel(logging.INFO)


def run(main):
    flags.mark_flag_as_required("config")

    def wrapped(argv):
        from orchestra_jax.config_section import ConfigError
        from orchestra_jax.io.paths import WorkdirError

        quiet_libraries()
        try:
            return main(argv)
        # Found while building the parts: an endpoint down, a workdir that cannot be written.
        except (ConfigError, WorkdirError) as e:
            sys.exit(f"error: {e}")

    app.run(wrapped, flags_parser=parse_flags_or_exit)
