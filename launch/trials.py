"""From a sweep file to trials: override flags, short names, workdirs, command lines.

Trial `i` of sweep `<name>` runs

    python -m experiments.grpo_hle --config=<config> --config.a.b=<value> ... \
        --config.workdir=<root>/<name>/<i>_<short override string>

The short override string names each override by the last part of its path
(`config.rl.lr=1e-06` → `lr=1e-06`), using more parts only where two keys
would otherwise read the same, so folders stay readable and distinct.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import numbers
import pathlib
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from launch import hyper

DEFAULT_MODULE = "experiments.grpo_hle"
# The launcher owns the workdir; a sweep that set it would put every trial in one folder.
RESERVED_KEYS = ("config.workdir",)
MAX_NAME_CHARS = 96  # well under common 255-byte file-name limits, readable in `ls`


@dataclasses.dataclass(frozen=True)
class Trial:
    """One run of a sweep: its overrides, folder and full command line."""

    index: int
    overrides: dict[str, Any]
    name: str  # `<index>_<short override string>`, the workdir's base name
    workdir: str
    argv: tuple[str, ...]

    @property
    def command(self) -> str:
        """The command line, shell-quoted, ready to paste."""
        return shlex.join(self.argv)


def format_value(value: Any) -> str:
    """Renders a value as `--config.a.b=<value>` expects it (ml_collections config_flags).

    Booleans become `true`/`false`, floats their shortest round-trip repr
    (`1e-06`), tuples and lists a Python tuple literal, strings pass unchanged.
    """
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):  # also NumPy integers
        return str(int(value))
    if isinstance(value, numbers.Real):  # also NumPy floats
        return repr(float(value))
    if isinstance(value, (tuple, list)):
        return repr(tuple(value))
    raise TypeError(
        f"cannot pass a {type(value).__name__} ({value!r:.80}) as a command-line override; "
        "use bool, int, float, str or a tuple of those"
    )


def short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Shortest distinct path suffix for each key: `config.rl.lr` → `lr`.

    Keys sharing a last part get longer suffixes (`rl.seed`, `data.seed`) until
    they differ; the leading `config.` is always dropped.
    """
    parts = {key: key.split(".")[1:] for key in keys}
    depth = {key: 1 for key in keys}
    while True:
        names = {key: ".".join(parts[key][-depth[key] :]) for key in keys}
        clashes = [k for k in keys if list(names.values()).count(names[k]) > 1]
        growable = [k for k in clashes if depth[k] < len(parts[k])]
        if not growable:
            return names
        for key in growable:
            depth[key] += 1


def _safe(text: str) -> str:
    """Keeps file-name-safe characters; anything else (`/`, spaces, quotes) becomes `-`."""
    return re.sub(r"[^A-Za-z0-9._=,+-]", "-", text)


def override_string(overrides: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    """`{"config.rl.lr": 1e-6, "config.seed": 0}` → `lr=1e-06,seed=0` (file-name safe).

    Strings longer than `MAX_NAME_CHARS` are cut and end in a hash of the whole,
    so two long names still differ.
    """
    names = names or short_keys(list(overrides))
    text = _safe(",".join(f"{names[k]}={format_value(v)}" for k, v in overrides.items()))
    if len(text) > MAX_NAME_CHARS:
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        text = f"{text[: MAX_NAME_CHARS - 9]}~{digest}"
    return text


def trial_name(
    index: int,
    num_trials: int,
    overrides: Mapping[str, Any],
    names: Mapping[str, str] | None = None,
) -> str:
    """`<index>_<override string>`, the index zero-padded so folders sort in trial order."""
    width = len(str(max(num_trials - 1, 0)))
    text = override_string(overrides, names)
    return f"{index:0{width}d}_{text}" if text else f"{index:0{width}d}"


def command_line(
    config: str,
    overrides: Mapping[str, Any],
    workdir: str,
    *,
    python: str = "python",
    module: str = DEFAULT_MODULE,
) -> tuple[str, ...]:
    """`python -m <module> --config=<config> --<key>=<value>... --config.workdir=<workdir>`."""
    flags = [f"--{key}={format_value(value)}" for key, value in overrides.items()]
    return (python, "-m", module, f"--config={config}", *flags, f"--config.workdir={workdir}")


def import_file(path: str | pathlib.Path, function: str, what: str):
    """Imports a Python file (any path) as a module that must define `function`."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"_{what.split()[0]}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, function, None)):
        raise ValueError(f"{what} {path} must define {function}()")
    return module


def load_sweep_file(path: str | pathlib.Path):
    """Imports a sweep file (any path) as a module; it must define `get_sweep(hyper)`."""
    return import_file(path, "get_sweep", "sweep file")


def expand(
    config: str,
    sweep: Sequence[Mapping[str, Any]],
    *,
    sweep_name: str,
    workdir_root: str,
    python: str = "python",
    module: str = DEFAULT_MODULE,
) -> list[Trial]:
    """Turns a list of override dicts into `Trial`s with workdirs and command lines."""
    sweep = hyper.check_sweep(list(sweep))
    for overrides in sweep:
        for key in RESERVED_KEYS:
            if key in overrides:
                raise ValueError(
                    f"sweeps may not set {key!r}: the launcher gives each trial its own"
                )
    all_keys = list(dict.fromkeys(k for overrides in sweep for k in overrides))
    names = short_keys(all_keys)  # one naming for the whole sweep, so trials read alike
    root = workdir_root.rstrip("/")
    trials = []
    for index, overrides in enumerate(sweep):
        name = trial_name(index, len(sweep), overrides, names)
        workdir = f"{root}/{_safe(sweep_name)}/{name}"
        argv = command_line(config, overrides, workdir, python=python, module=module)
        trials.append(Trial(index, dict(overrides), name, workdir, argv))
    seen: dict[str, int] = {}
    for trial in trials:
        key = repr(sorted((k, format_value(v)) for k, v in trial.overrides.items()))
        if key in seen:
            raise ValueError(
                f"trials {seen[key]} and {trial.index} of the sweep have the same overrides"
            )
        seen[key] = trial.index
    return trials
