"""Checks, before anything launches, that every swept key exists in the config.

A misspelt key (`config.rl.learning_rate` for `config.rl.lr`) would otherwise
surface only when each trial starts, possibly hours later on a busy cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def load_config(config_arg: str) -> Any:
    """Loads `path.py[:variant]` the way ml_collections config_flags does: `get_config(variant)`."""
    from launch.trials import import_file

    path, _, variant = config_arg.partition(":")
    module = import_file(path, "get_config", "config file")
    return module.get_config(variant) if variant else module.get_config()


def _children(node: Any) -> list[str] | None:
    """Field names of a config node, or None when it is a leaf value."""
    if isinstance(node, Mapping) or hasattr(node, "keys") and hasattr(node, "__getitem__"):
        return [str(k) for k in node.keys()]
    return None


def missing_keys(config: Any, keys: Iterable[str]) -> list[str]:
    """Messages for the dotted keys (`config.rl.lr`) that do not name a field of `config`."""
    problems = []
    for key in keys:
        node = config
        parts = key.split(".")[1:]
        for depth, part in enumerate(parts):
            fields = _children(node)
            if fields is None or part not in fields:
                where = ".".join(["config", *parts[:depth]])
                known = ", ".join(sorted(fields)) if fields else "none: it is a value"
                problems.append(f"{key}: {where} has no field {part!r} (fields: {known})")
                break
            node = node[part]
    return problems


def check_overrides(config_arg: str, keys: Iterable[str]) -> None:
    """Raises one ValueError listing every swept key the config lacks."""
    problems = missing_keys(load_config(config_arg), list(dict.fromkeys(keys)))
    if problems:
        raise ValueError(
            f"the sweep sets keys that {config_arg} lacks:\n  " + "\n  ".join(problems)
        )
