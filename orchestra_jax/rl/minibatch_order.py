"""The order samples enter mini-batches: the reference release's `_balance_batch`.

With `rl.balance_partitions` P > 0 (`qwen3_8b`: 16, the release's GPUs) a step's
samples are reordered before mini-batches of `rl.minibatch_size` M are cut, so that
each mini-batch holds the samples the release's would:

  1. `_balance_batch` (training/verl/trainer/ppo/ray_trainer.py 906-917, called by
     recipe/algo/grpo_ray_trainer_quick3.py 415) splits the samples into P
     partitions of equal count with balanced token sums (Karmarkar-Karp,
     training/verl/utils/seqlen_balancing.py `get_seqlen_balanced_partitions`,
     ported below; each partition's indices sorted) and concatenates them;
  2. verl hands partition r to GPU r; the `rl.balance_group_size` G GPUs of a
     sequence-parallel group (Ulysses, 2 in the release) gather theirs, so data-
     parallel group d holds partitions G·d … G·d + G − 1 in that order;
  3. each group cuts its samples into local mini-batches of M / (P / G) in order
     (`dp_actor.update_policy`), and update j trains every group's j-th.

So the order here is: for each update j, for each group d, group d's j-th local
mini-batch. A sample's length is its token count (the release's attention-mask
sum). The release trims a step's samples to a multiple of its GPUs; here the last
N mod P samples are not balanced and keep their rollout order, at the end.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def karmarkar_karp(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """verl's `karmarkar_karp` (largest differencing), ported."""

    class Set:
        def __init__(self) -> None:
            self.sum = 0
            self.items: list[tuple[int, int]] = []

        def add(self, idx: int, val: int):
            self.items.append((idx, val))
            self.sum += val

        def merge(self, other):
            for idx, val in other.items:
                self.items.append((idx, val))
                self.sum += val

        def __lt__(self, other):
            if self.sum != other.sum:
                return self.sum < other.sum
            if len(self.items) != len(other.items):
                return len(self.items) < len(other.items)
            return self.items < other.items

    class State:
        def __init__(self, items: list[tuple[int, int]], k: int) -> None:
            self.k = k
            self.sets = [Set() for _ in range(k)]
            assert len(items) in [1, k], f"{len(items)} not in [1, {k}]"
            for i, (idx, seqlen) in enumerate(items):
                self.sets[i].add(idx=idx, val=seqlen)
            self.sets = sorted(self.sets, reverse=True)

        def get_partitions(self):
            return [[idx for idx, _ in s.items] for s in self.sets]

        def merge(self, other):
            for i in range(self.k):
                self.sets[i].merge(other.sets[self.k - 1 - i])
            self.sets = sorted(self.sets, reverse=True)

        @property
        def spread(self) -> int:
            return self.sets[0].sum - self.sets[-1].sum

        def __lt__(self, other):
            if self.spread != other.spread:
                return self.spread > other.spread
            return self.sets[0] > other.sets[0]

    sorted_seqlen_list = sorted([(seqlen, i) for i, seqlen in enumerate(seqlen_list)])
    states_pq: list[State] = []
    if equal_size:
        assert len(seqlen_list) % k_partitions == 0, f"{len(seqlen_list)} % {k_partitions} != 0"
        for offset in range(0, len(sorted_seqlen_list), k_partitions):
            items = []
            for i in range(k_partitions):
                seqlen, idx = sorted_seqlen_list[offset + i]
                items.append((idx, seqlen))
            heapq.heappush(states_pq, State(items=items, k=k_partitions))
    else:
        for seqlen, idx in sorted_seqlen_list:
            heapq.heappush(states_pq, State(items=[(idx, seqlen)], k=k_partitions))
    while len(states_pq) > 1:
        state0 = heapq.heappop(states_pq)
        state1 = heapq.heappop(states_pq)
        state0.merge(state1)
        heapq.heappush(states_pq, state0)
    return states_pq[0].get_partitions()


def balanced_partitions(lengths: Sequence[int], k_partitions: int) -> list[list[int]]:
    """verl's `get_seqlen_balanced_partitions(..., equal_size=True)`: k partitions of
    equal count, balanced sums, each one's indices sorted."""
    if len(lengths) < k_partitions or len(lengths) % k_partitions:
        raise ValueError(f"{len(lengths)} samples do not split into {k_partitions} equal parts")
    partitions = karmarkar_karp(list(lengths), k_partitions, equal_size=True)
    return [sorted(p) for p in partitions]


def release_order(
    lengths: Sequence[int], partitions: int, group_size: int, minibatch_size: int
) -> list[int]:
    """The indices of samples of `lengths` tokens in the order their mini-batches
    take them (module docstring)."""
    if partitions < 1 or group_size < 1 or partitions % group_size:
        raise ValueError(f"{partitions} partitions do not form groups of {group_size}")
    groups = partitions // group_size
    if minibatch_size % groups:
        raise ValueError(f"a mini-batch of {minibatch_size} does not split over {groups} groups")
    n = len(lengths) - len(lengths) % partitions
    if n == 0:
        return list(range(len(lengths)))
    parts = balanced_partitions(lengths[:n], partitions)
    held = [
        [i for r in range(group_size) for i in parts[d * group_size + r]] for d in range(groups)
    ]
    local = minibatch_size // groups
    order = [
        i
        for j in range(0, len(held[0]), local)
        for d in range(groups)
        for i in held[d][j : j + local]
    ]
    return order + list(range(n, len(lengths)))


def reorder_samples(
    samples: Sequence[T], partitions: int, group_size: int, minibatch_size: int
) -> list[T]:
    """`samples` in `release_order` by their token counts; as they are when
    `partitions` is 0."""
    if partitions == 0:
        return list(samples)
    lengths = [len(_ids(s)) for s in samples]
    return [samples[i] for i in release_order(lengths, partitions, group_size, minibatch_size)]


def _ids(sample: Any) -> Sequence[int]:
    return sample.token_ids
