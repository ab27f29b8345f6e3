"""Waiting requests, served fairly: one from each submitter in turn.

A rollout engine admits requests as slots free. Served first-come first-served,
one caller's batch of thousands of prompts would hold every later caller behind
it; `FairQueue` keeps one FIFO per submitter (one `generate` call, one HTTP
request) and `pop` takes from them round robin, so a small request waits for at
most one item of each other submitter per free slot, however large their
batches. Items put back with `push_front` (work that must resume before anything
new) are served before all groups.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Per-submitter FIFOs popped round robin, behind a priority FIFO."""

    def __init__(self):
        self._front: collections.deque[T] = collections.deque()
        self._groups: collections.OrderedDict[Hashable, collections.deque[T]] = (
            collections.OrderedDict()
        )

    def push(self, group: Hashable, items: Iterable[T]) -> None:
        """Append `items` to `group`'s FIFO (a new group joins the end of the rotation)."""
        queue = self._groups.setdefault(group, collections.deque())
        queue.extend(items)
        if not queue:
            del self._groups[group]

    def push_front(self, items: Iterable[T]) -> None:
        """Items served before every group, in the order given."""
        self._front.extend(items)

    def pop(self, n: int, *, front_only: bool = False) -> list[T]:
        """Up to `n` items: the priority FIFO first, then one per group in turn."""
        out: list[T] = []
        while len(out) < n and self._front:
            out.append(self._front.popleft())
        while len(out) < n and self._groups and not front_only:
            group, queue = next(iter(self._groups.items()))
            out.append(queue.popleft())
            self._groups.move_to_end(group)  # its next item waits for the others' turns
            if not queue:
                del self._groups[group]
        return out

    def peek_front(self) -> T | None:
        """The next priority item, or None."""
        return self._front[0] if self._front else None

    def remove_if(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return every waiting item for which `predicate` holds."""
        removed = [x for x in self._front if predicate(x)]
        self._front = collections.deque(x for x in self._front if not predicate(x))
        for group in list(self._groups):
            queue = self._groups[group]
            removed += [x for x in queue if predicate(x)]
            kept = collections.deque(x for x in queue if not predicate(x))
            if kept:
                self._groups[group] = kept
            else:
                del self._groups[group]
        return removed

    def clear(self) -> list[T]:
        """Remove and return everything."""
        return self.remove_if(lambda _: True)

    @property
    def front_count(self) -> int:
        return len(self._front)

    def __len__(self) -> int:
        return len(self._front) + sum(len(q) for q in self._groups.values())

    def __iter__(self) -> Iterator[T]:
        yield from self._front
        for queue in self._groups.values():
            yield from queue
