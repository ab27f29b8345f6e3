"""A tiny name -> object registry, so configs pick pluggable parts by string."""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps config strings to objects (functions, classes, factories).

    Usage::

        losses = Registry("policy loss")

        @losses.register("ppo_clip")
        def ppo_clip_loss(...): ...

        loss_fn = losses.get(config.loss)   # clear error for unknown names
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None):
        """Registers `obj` under `name`; without `obj`, acts as a decorator."""
        if obj is not None:
            self._add(name, obj)
            return obj

        def decorator(fn: T) -> T:
            self._add(name, fn)
            return fn

        return decorator

    def _add(self, name: str, obj: T) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; known: {sorted(self._entries)}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))
