"""Name -> object registries, so configs pick pluggable parts by string.

Every pluggable part of the library (rewards, advantage estimators, policy
losses, KL penalties, rollout engines, sandboxes, task readers, environments,
tools) has one `Registry`, and that registry is the only list of its names:
config checks, error messages and docs read it.

A name is either registered (`@REWARDS.register("preference")`) or an import
path `"package.module:attr"`, which `get` imports. So a researcher adds a part
in a file of their own and names it in one config line, e.g.
`--config.reward.type=my_lab.rewards:brevity`, without editing the library.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def is_import_path(name: str) -> bool:
    """True for "package.module:attr" (a module path, one colon, an attribute path)."""
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr and ":" not in attr and " " not in name)


def import_object(path: str) -> Any:
    """The object at "package.module:attr" (attr may be dotted: "module:Class.method")."""
    if not is_import_path(path):
        raise ValueError(f"{path!r} is not an import path of the form 'package.module:attr'")
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import {module_name!r} (from {path!r}): {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attr!r} (from {path!r})") from None
    return obj


class Registry(Generic[T]):
    """Maps config strings to objects (functions, classes, factories).

    Usage::

        LOSSES = Registry("policy loss")

        @LOSSES.register("ppo_clip")
        def ppo_clip(...): ...

        loss_fn = LOSSES.get(config.rl.loss)  # a name, or "package.module:attr"

    `register_lazy(name, "package.module:attr")` registers a name whose object is
    imported on first `get` (parts with heavy or optional dependencies).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._lazy: dict[str, str] = {}

    def register(self, name: str, obj: T | None = None) -> Any:
        """Registers `obj` under `name`; without `obj`, acts as a decorator."""
        if obj is not None:
            self._add(name, obj)
            return obj

        def decorator(fn: T) -> T:
            self._add(name, fn)
            return fn

        return decorator

    def register_lazy(self, name: str, path: str) -> None:
        """Registers `name` as the object at import path `path`, imported on first `get`."""
        if not is_import_path(path):
            raise ValueError(f"{self.kind} {name!r}: {path!r} is not 'package.module:attr'")
        self._check_free(name)
        self._lazy[name] = path

    def _check_free(self, name: str) -> None:
        if not name or ":" in name:
            raise ValueError(f"{self.kind} name {name!r} must be non-empty and have no ':'")
        if name in self._entries or name in self._lazy:
            raise ValueError(f"{self.kind} {name!r} is already registered")

    def _add(self, name: str, obj: T) -> None:
        self._check_free(name)
        self._entries[name] = obj

    def get(self, name: str) -> T:
        """The object registered as `name`, or imported from "package.module:attr".

        Raises ValueError naming the registered choices when neither works.
        """
        if name in self._entries:
            return self._entries[name]
        if name in self._lazy:
            obj = import_object(self._lazy.pop(name))
            self._entries[name] = obj
            return obj
        if isinstance(name, str) and is_import_path(name):
            try:
                return import_object(name)
            except ValueError as e:
                raise ValueError(f"{self.kind} {name!r}: {e}") from None
        raise ValueError(
            f"unknown {self.kind} {name!r}; choose one of {self.names()} "
            "or give an import path 'package.module:attr'"
        )

    def problem(self, name: str) -> str | None:
        """Why `get(name)` would fail (one line), or None when it works."""
        try:
            self.get(name)
        except ValueError as e:
            return str(e)
        return None

    def names(self) -> list[str]:
        """The registered names, sorted (import paths are not listed)."""
        return sorted([*self._entries, *self._lazy])

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, object) for every registered name, importing lazy entries."""
        for name in self.names():
            yield name, self.get(name)

    def __contains__(self, name: object) -> bool:
        """Registered names only; an import path is checked by `problem` / `get`."""
        return name in self._entries or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries) + len(self._lazy)
