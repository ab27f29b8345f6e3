"""Start-up validation of an experiment config: every mistake named, in one go.

`validate(config)` runs the check of every config section (`builders.SECTION_CHECKS`:
each builder checks the section it reads, its choices taken from the part's
registry) and raises `ConfigError` listing every problem, one per line, so a
researcher fixes a config in one round instead of one crash per field. The
drivers catch `ConfigError` and exit with its message. Also here: parsers of
the config's comma-separated fields.
"""

from __future__ import annotations

from typing import Any, TypeAlias

# An experiment config: the ml_collections ConfigDict of experiments/configs/grpo_hle.py.
# (Any: ConfigDict types its fields as a union a type checker cannot narrow.)
ExperimentConfig: TypeAlias = Any


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem, one per line."""


def parse_weighted(spec: str, field: str, *, import_paths: bool = False) -> list[tuple[str, float]]:
    """ "synthetic:3,frames:1" -> [("synthetic", 3.0), ("frames", 1.0)]; weight defaults to 1.

    `field` is the config field the spec came from, named in the error. With
    `import_paths`, a name may be "package.module:attr" (weighted as
    "package.module:attr:2").
    """
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, _, weight = item.rpartition(":") if import_paths else item.partition(":")
        if import_paths and (not name or not _is_number(weight)):
            name, weight = item, ""  # no weight: the whole item is a name or an import path
        try:
            out.append((name.strip(), float(weight) if weight else 1.0))
        except ValueError:
            raise ConfigError(f"{field}: bad weight in {item!r} (want name:weight)") from None
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_sources(spec: str) -> list[tuple[str, float]]:
    """`data.sources`, e.g. "synthetic:3,frames:1" or "my_lab.data:reader:2"
    (see `parse_weighted`)."""
    return parse_weighted(spec, "data.sources", import_paths=True)


def stratum_weights(config: Any) -> dict[str, float]:
    """`data.stratum_weights` ("logic:2") as {value: weight}."""
    return dict(parse_weighted(config.data.stratum_weights, "data.stratum_weights"))


def split_list(spec: str) -> list[str]:
    """ "a, b,,c" -> ["a", "b", "c"]."""
    return [s.strip() for s in spec.split(",") if s.strip()]


def validate(config: Any) -> None:
    """Raises ConfigError listing every problem of `config` (see module docstring)."""
    from orchestra_jax.training.builders import SECTION_CHECKS

    errors = [message for check in SECTION_CHECKS for message in check(config)]
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
