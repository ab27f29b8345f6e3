"""Prefix-cache planning for JaxEngine: which cached prefix each new prompt continues.

A pure bookkeeping class, no device arrays: the engine owns the KV cache and
runs the calls; `PrefixCachePlanner` decides, for one admission of prompts,

  * which cache row (live, or *parked*: a finished row kept for its keys and
    values) or which earlier prompt of the same admission (its *leader*) shares
    the longest common prefix L with each prompt, and how many tokens
    `reused = min(L, n - 1)` it copies (one token is always computed, so the
    first sampled token has logits);
  * which slot each prompt takes: the parked row it continues when the prompt
    extends all of that row (nothing is lost), else a free slot, else the least
    recently used parked row, preferring rows no prompt of this admission copies
    from.

A cached prefix is used only when it covers at least `min_cached_prefix` tokens
and `min_cached_fraction` of the prompt: prompts sharing just a head (tasks whose
system prompts differ after the first lines) are cheaper prefilled side by side
than one after another. Levels order the work: level 0 prompts copy from the
cache or start from scratch; a prompt of level k + 1 continues a level-k leader
once the leader's row holds its whole prompt (a GRPO group's first turn: the
first copy prefills the prompt, the others one token each).

The table is flat, one entry per slot, not SGLang's radix tree: with one row per
slot the longest-prefix search is a numpy comparison against at most
`num_slots` rows, and parked rows cost no memory beyond the slots they occupy.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Collection, Mapping, Sequence

import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


@dataclasses.dataclass
class Parked:
    """A finished row kept for its keys/values (slots 0 .. len(ids) - 1)."""

    ids: np.ndarray
    last_used: int


@dataclasses.dataclass(eq=False)  # compared by identity
class Admission:
    """One admitted prompt's plan: where it goes and which cached prefix it continues."""

    ids: np.ndarray
    slot: int = -1
    source: int | None = None  # the cache row whose first `reused` slots it continues
    leader: Admission | None = None  # or: the prompt of this admission it continues
    match: int = 0  # common prefix with the source's tokens
    reused: int = 0
    level: int = 0  # 0: no leader; else the leader's level + 1


class PrefixCachePlanner:
    """The parked-row table and the admission plan (see the module docstring).

    `enabled=False` plans every prompt from scratch and parks nothing. `stats`
    counts requests, prompt tokens computed and reused, and parked rows dropped
    by `flush`.
    """

    def __init__(
        self,
        num_slots: int,
        *,
        enabled: bool = True,
        min_cached_prefix: int = 16,
        min_cached_fraction: float = 0.25,
    ):
        self.num_slots = num_slots
        self.enabled = enabled
        # Shorter shared prefixes are prefilled from scratch: too little to save.
        self.min_cached_prefix = max(1, min_cached_prefix)
        self.min_cached_fraction = min_cached_fraction
        self.parked: dict[int, Parked] = {}
        self.stats: collections.Counter[str] = collections.Counter()
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def park(self, slot: int, ids: np.ndarray) -> None:
        """Keep a finished row's keys/values (of `ids`) in `slot` for later prompts."""
        if self.enabled:
            self.parked[slot] = Parked(np.asarray(ids, np.int32), self._tick())

    def flush(self) -> int:
        """Drop every parked row (new weights, or a lost cache); returns how many."""
        dropped = len(self.parked)
        self.stats["parked_invalidated"] += dropped
        self.parked = {}
        return dropped

    def truncate(self, length: int) -> None:
        """The cache now holds `length` slots per row: parked rows keep what fits."""
        for p in self.parked.values():
            p.ids = p.ids[:length]

    def plan(
        self,
        prompts: Sequence[np.ndarray],
        live: Mapping[int, np.ndarray],
        busy: Collection[int],
    ) -> list[Admission]:
        """Plans for `prompts`, in order.

        live: slot -> tokens whose keys/values that live row holds (usable as sources).
        busy: every slot holding a live row (none of them is a target).
        """
        held: dict[int, np.ndarray] = {}  # cache row -> the tokens it holds
        if self.enabled:
            held = dict(live)
            held.update((i, p.ids) for i, p in self.parked.items())
        plans: list[Admission] = []
        for ids in prompts:
            plan = Admission(np.asarray(ids, np.int32))
            for row, row_ids in held.items():
                match = common_prefix(row_ids, plan.ids)
                if match > plan.match:
                    plan.source, plan.match = row, match
            for earlier in plans if self.enabled else ():
                match = common_prefix(earlier.ids, plan.ids)
                if match > plan.match:  # its prefill writes its whole prompt
                    plan.source, plan.leader, plan.match = None, earlier, match
                    plan.level = earlier.level + 1
            plan.reused = min(plan.match, len(plan.ids) - 1)
            if plan.reused < max(self.min_cached_prefix, self.min_cached_fraction * len(plan.ids)):
                plan.source, plan.leader, plan.reused, plan.level = None, None, 0, 0
            plans.append(plan)
        self._assign_slots(plans, busy)
        for p in plans:
            self.stats["requests"] += 1
            self.stats["prompt_tokens_reused"] += p.reused
            self.stats["prompt_tokens_computed"] += len(p.ids) - p.reused
            self.stats["requests_reusing"] += p.reused > 0
        return plans

    def _assign_slots(self, plans: list[Admission], busy: Collection[int]) -> None:
        sources = {p.source for p in plans if p.source is not None}
        for row in sources & self.parked.keys():
            self.parked[row].last_used = self._tick()
        taken: set[int] = set()
        for p in plans:  # continue a parked row in place when the prompt extends all of it
            if (
                p.source in self.parked
                and p.source not in taken
                and p.match == len(self.parked[p.source].ids)
            ):
                p.slot = p.source
                taken.add(p.slot)
        free = [
            i
            for i in range(self.num_slots)
            if i not in busy and i not in self.parked and i not in taken
        ]
        for p in plans:
            if p.slot >= 0:
                continue
            if free:
                p.slot = free.pop(0)
            else:  # evict: least recently used, rows nobody here copies from first
                candidates = [i for i in self.parked if i not in taken]
                if not candidates:
                    raise ValueError(f"{len(plans)} prompts but no free slot for all of them")
                p.slot = min(candidates, key=lambda i: (i in sources, self.parked[i].last_used))
            taken.add(p.slot)
        # The targets' old rows are overwritten (sources are read before that).
        for row in taken & self.parked.keys():
            del self.parked[row]
