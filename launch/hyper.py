"""Building sweeps: lists of config-override dicts, combined by product, zip or chain.

A sweep is a list of trials; a trial is a dict mapping a dotted config path to
a value, e.g. `{"config.rl.lr": 1e-6, "config.rl.group_size": 8}`. Sweep files
receive this module as `hyper` and combine small sweeps into the full one:

    def get_sweep(hyper):
        return hyper.product([
            hyper.sweep("config.seed", [0, 1, 2]),
            hyper.zipit([
                hyper.sweep("config.rl.lr", [1e-6, 3e-6]),
                hyper.sweep("config.rl.warmup_steps", [10, 30]),
            ]),
        ])

That is 3 × 2 = 6 trials. `product` is the Cartesian product (the last factor
varies fastest), `zipit` pairs trials position by position, `chain` lists one
sweep after another. Combining two trials that set the same key is an error,
so a typo cannot silently overwrite a value.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from typing import Any

Trial = dict[str, Any]
Sweep = list[Trial]

# `config.` then identifiers: the syntax `--config.a.b=value` accepts.
_KEY = re.compile(r"^config(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def check_key(key: str) -> str:
    """Returns `key` if it is a dotted config path such as `config.rl.lr`, else raises."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise ValueError(
            f"sweep key {key!r} is not a dotted config path like 'config.rl.lr' "
            "(it must start with 'config.' and name fields with identifiers)"
        )
    return key


def sweep(key: str, values: Iterable[Any]) -> Sweep:
    """One trial per value: `sweep("config.seed", [0, 1])` → `[{"config.seed": 0}, {"config.seed": 1}]`."""
    check_key(key)
    if isinstance(values, (str, bytes, dict)):
        raise TypeError(f"values for {key!r} must be a list of values, got {type(values).__name__}")
    trials = [{key: value} for value in values]
    if not trials:
        raise ValueError(f"sweep over {key!r} has no values")
    return trials


def fixed(key: str, value: Any) -> Sweep:
    """A single trial setting one key; `product` it in to set a value in every trial."""
    return sweep(key, [value])


def _merge(trials: Sequence[Trial]) -> Trial:
    merged: Trial = {}
    for trial in trials:
        for key, value in trial.items():
            if key in merged:
                raise ValueError(f"two sweeps being combined both set {key!r}")
            merged[key] = value
    return merged


def product(sweeps: Sequence[Sweep]) -> Sweep:
    """Cartesian product: every combination of one trial from each sweep, merged.

    `len(product([a, b])) == len(a) * len(b)`; the last sweep varies fastest.
    """
    sweeps = list(sweeps)
    if not sweeps:
        raise ValueError("product needs at least one sweep")
    return [_merge(combo) for combo in itertools.product(*sweeps)]


def zipit(sweeps: Sequence[Sweep]) -> Sweep:
    """Position-wise merge of sweeps of equal length: trial i takes trial i of each."""
    sweeps = list(sweeps)
    if not sweeps:
        raise ValueError("zipit needs at least one sweep")
    lengths = [len(s) for s in sweeps]
    if len(set(lengths)) != 1:
        raise ValueError(f"zipit needs sweeps of equal length, got lengths {lengths}")
    return [_merge(combo) for combo in zip(*sweeps)]


def chain(sweeps: Sequence[Sweep]) -> Sweep:
    """The trials of each sweep one after another (e.g. two separate grids)."""
    return [dict(trial) for s in sweeps for trial in s]


def check_sweep(trials: Any) -> Sweep:
    """Validates what a sweep file returned: a non-empty list of dicts of dotted keys."""
    if not isinstance(trials, (list, tuple)) or not trials:
        raise ValueError(f"get_sweep must return a non-empty list of dicts, got {trials!r:.200}")
    checked = []
    for i, trial in enumerate(trials):
        if not isinstance(trial, dict):
            raise ValueError(f"trial {i} of the sweep is a {type(trial).__name__}, not a dict")
        for key in trial:
            check_key(key)
        checked.append(dict(trial))
    return checked
