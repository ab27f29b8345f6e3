"""Config sections: the typed, frozen form of one section of an experiment config.

Each package owns the section it reads (`rl/config.py` `RLConfig`, ...): a frozen
dataclass whose field names are the config file's (`--config.rl.lr` is `RLConfig.lr`)
and whose `problems()` is the section's only check, run by `__post_init__`, which
raises `SectionError` listing every problem, one message each. `from_config` builds
a section from its part of the ml-collections file. The rules that span sections
live in `training/experiment_config.py`, which builds every section once and
reports all problems together as a `ConfigError`. Also here: the parsers of the
config's comma-separated fields and the helpers the checks share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, TypeAlias, TypeVar

from orchestra_jax.registry import Registry, is_import_path

# A whole experiment config: the ml_collections ConfigDict of
# experiments/configs/grpo_hle.py, which only the top (training/) holds; every other
# package gets its section. (Any: ConfigDict types its fields as a union a type
# checker cannot narrow.)
ExperimentConfig: TypeAlias = Any

S = TypeVar("S", bound="Section")


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem, one per line."""


class SectionError(ConfigError):
    """The problems of one config section, one message each (`problems`)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclasses.dataclass(frozen=True)
class Section:
    """Base of a config section's dataclass.

    `SECTION` is the section's path in the config ("rl", "rollout.server_pool"),
    used in messages; `NESTED` maps a field holding a sub-section to its class.
    """

    SECTION: ClassVar[str] = ""
    NESTED: ClassVar[dict[str, type[Section]]] = {}

    def problems(self) -> list[str]:
        """Every problem of this section's values, one message each (empty: none)."""
        return []

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise SectionError(problems)

    @classmethod
    def from_config(cls: type[S], values: Mapping[str, Any] | None) -> S:
        """The section from its part of the config (a ConfigDict or a dict). A field
        the config leaves out keeps its default; a key that names no field, or a
        sub-section's problems, is a `SectionError`."""
        values = dict(_plain(values) if values is not None else {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise SectionError([f"{cls._path(k)}: no such field" for k in unknown])
        problems = []
        for name, section in cls.NESTED.items():
            if name in values:
                try:
                    values[name] = section.from_config(values[name])
                except SectionError as e:
                    problems += e.problems
                    values[name] = section.unchecked(values[name])
        if problems:  # this section's own problems too, so every mistake is listed
            try:
                cls(**values)
            except SectionError as e:
                problems += e.problems
            raise SectionError(problems)
        return cls(**values)

    @classmethod
    def unchecked(cls: type[S], values: Mapping[str, Any] | None) -> S:
        """The section with the config's values as they are, unchecked (keys that name
        no field left out): what the rules between sections read of a section whose own
        check failed, so that every mistake is reported in one go."""
        values = _plain(values) if values is not None else {}
        obj = cls.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.name in values:
                value = values[f.name]
                if f.name in cls.NESTED:
                    value = cls.NESTED[f.name].unchecked(value)
            elif f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = None
            object.__setattr__(obj, f.name, value)
        return obj

    @classmethod
    def _path(cls, name: str) -> str:
        return f"{cls.SECTION}.{name}" if cls.SECTION else name

    # --- helpers of `problems` ---------------------------------------------------------

    def positive(self, *names: str, allow_zero: bool = False) -> list[str]:
        """One message per field of `names` that is not > 0 (>= 0 with `allow_zero`)."""
        return positive({self._path(n): getattr(self, n) for n in names}, allow_zero=allow_zero)

    def choice(self, name: str, choices: Any) -> list[str]:
        """A message when field `name` is not among `choices` (a `Registry` or a sequence)."""
        return choice(self._path(name), getattr(self, name), choices)


def _plain(values: Any) -> dict[str, Any]:
    """A ConfigDict or a mapping as a dict, its references resolved; values that are
    ConfigDicts become plain dicts too."""
    return {k: plain(values[k]) for k in values.keys()}


def plain(value: Any) -> Any:
    """A config value as plain Python: ConfigDicts and mappings become dicts, all levels."""
    to_dict = getattr(value, "to_dict", None)
    if to_dict is not None:
        return to_dict()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


def positive(values: Mapping[str, Any], *, allow_zero: bool = False) -> list[str]:
    """One message per {field: value} whose value is not > 0 (>= 0 with `allow_zero`)."""
    errors = []
    for name, value in values.items():
        if not (value >= 0 if allow_zero else value > 0):
            errors.append(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return errors


def choice(field: str, value: str, choices: Any) -> list[str]:
    """A message when `value` is not among `choices` (a `Registry`, or a sequence)."""
    if isinstance(choices, Registry):
        problem = choices.problem(value)
        if problem is None:
            return []
        if is_import_path(value):  # say why the import failed
            return [f"{field}: {problem}"]
        names = choices.names()
        return [f"{field} must be one of {names} or 'package.module:attr', got {value!r}"]
    return [] if value in choices else [f"{field} must be one of {tuple(choices)}, got {value!r}"]


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


def split_list(spec: str) -> list[str]:
    """ "a, b,,c" -> ["a", "b", "c"]."""
    return [s.strip() for s in spec.split(",") if s.strip()]
