"""Packed rows in which samples that begin alike keep one copy of their common start.

A step's learner samples often begin with the same tokens: the turns of one
episode under the reference's rebuilt prompts (`agent.context="rebuild"`) all
start with the system message, the tool schemas, the problem and the documents
read so far; the episodes of a GRPO group start with the same prompt. Packing
(`rl/batching.pack_batch`) writes each sample whole. Here a *family* of samples
with a common prefix of P positions is written once as

    [prefix: P positions][rest of sample 1][rest of sample 2] ...

the prefix its own segment, each sample's rest a segment whose tokens also see
the prefix's segment (`TrainBatch.prefix_segment_ids`, `AttentionMask.causal`).
A sample's rest keeps its positions P, P + 1, ..., so each of its tokens sees
the same keys, at the same positions, as in the sample written whole: the
log-probs, the loss and its gradients are those of the packed (or unpacked)
batch, to float round-off, for every aggregation (the prefix carries no loss
token: P is at most each member's first loss position, leaving each at least one
position; aggregations count sequences by segment, and the prefix's has no loss
token). A family of one is the sample itself.

Families. Within a mini-batch the samples are ordered by their shifted tokens
(`batching.shifted_sequences`), so samples with a long common start are
neighbours, and taken in that order: a sample joins the current family when the
family's common prefix with it, P', keeps the family's saving from shrinking
(k · P' >= (k - 1) · P with k members before it and prefix P) and the family
still fits in a row; else it starts the next family. Families are packed into
rows first-fit decreasing, as samples are by `pack_batch`.

Row length and rows are chosen as in `batching.packed_shape`: among the buckets
that hold the longest sample, the length T whose rows (the most a mini-batch
needs, rounded up to a multiple of `row_multiple`) hold the fewest positions.

Attention: the "flash" kernel reads, for each query block, the key blocks of
the prefix it sees and those of its own sample, skipping the family's other
samples between them (`flash_attention.py`). "cudnn" and "splash" run "flash"
on such rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from orchestra_jax.rl.batching import (
    BatchingConfig,
    TrainBatch,
    best_row_shape,
    empty_rows,
    first_fit_decreasing,
    loss_positions,
    shifted_sequences,
)


def shareable_length(seq: dict[str, np.ndarray]) -> int:
    """Positions of a shifted sequence a family may share: those before its first
    loss position, leaving it at least one."""
    loss = np.flatnonzero(seq["loss_mask"] > 0)
    last = len(seq["input_ids"]) - 1
    return min(int(loss[0]), last) if len(loss) else last


def common_length(a: dict[str, np.ndarray], b: dict[str, np.ndarray], limit: int) -> int:
    """The number of leading positions (at most `limit`) where both sequences feed and
    predict the same tokens."""
    n = min(limit, len(a["input_ids"]), len(b["input_ids"]))
    same = (a["input_ids"][:n] == b["input_ids"][:n]) & (a["target_ids"][:n] == b["target_ids"][:n])
    differ = np.flatnonzero(~same)
    return int(differ[0]) if len(differ) else n


class Family:
    """Samples (indices into the sequences) sharing their first `prefix` positions."""

    def __init__(self, member: int, length: int, shareable: int):
        self.members = [member]
        self.lengths = [length]
        self.prefix = shareable

    @property
    def length(self) -> int:
        """Positions the family takes in a row: its prefix once, then each member's rest
        (a family of one: its sample)."""
        return self.prefix + sum(n - self.prefix for n in self.lengths)

    def joined_length(self, length: int, prefix: int) -> int:
        return prefix + sum(n - prefix for n in self.lengths) + length - prefix

    def worth_joining(self, common: int, length: int, capacity: int) -> bool:
        """Whether a sample sharing `common` positions with the family should join it."""
        prefix = min(self.prefix, common)
        k = len(self.members)
        saving_kept = k * prefix >= (k - 1) * self.prefix
        return prefix > 0 and saving_kept and self.joined_length(length, prefix) <= capacity

    def join(self, member: int, length: int, common: int) -> None:
        self.prefix = min(self.prefix, common)
        self.members.append(member)
        self.lengths.append(length)


def by_tokens(seqs: Sequence[dict[str, np.ndarray]], group: Sequence[int]) -> list[int]:
    """The indices `group` ordered by their sequences' tokens (module docstring,
    "Families"): samples with a long common start become neighbours."""
    return sorted(group, key=lambda i: (seqs[i]["input_ids"].tolist(), i))


def families(seqs: Sequence[dict[str, np.ndarray]], order: Sequence[int], capacity: int):
    """The families of the sequences `order` (indices, ordered by `by_tokens`), each at
    most `capacity` long (module docstring, "Families")."""
    out: list[Family] = []
    for i in order:
        n, shareable = len(seqs[i]["input_ids"]), shareable_length(seqs[i])
        if out:
            last = out[-1]
            previous = seqs[last.members[-1]]
            common = common_length(previous, seqs[i], min(last.prefix, shareable))
            if last.worth_joining(common, n, capacity):
                last.join(i, n, common)
                continue
        out.append(Family(i, n, shareable))
    return out


def _pack_families(fams: Sequence[Family], capacity: int) -> list[list[Family]]:
    """The families in rows of `capacity`, first-fit decreasing by length."""
    rows = first_fit_decreasing([f.length for f in fams], capacity)
    return [[fams[i] for i in row] for row in rows]


def _write_row(
    out: dict[str, np.ndarray], row: int, fams: Sequence[Family], seqs: Sequence[dict]
) -> None:
    """Row `row` := the families end to end: a shared prefix (when the family has
    several members), then each member's rest; segments 1, 2, … in that order."""
    start, segment = 0, 0

    def write(seq: dict, first: int, last: int, prefix_segment: int) -> None:
        nonlocal start, segment
        segment += 1
        end = start + last - first
        for name, values in seq.items():
            out[name][row, start:end] = values[first:last]
        out["positions"][row, start:end] = np.arange(first, last)
        out["segment_ids"][row, start:end] = segment
        out["prefix_segment_ids"][row, start:end] = prefix_segment
        start = end

    for fam in fams:
        if len(fam.members) == 1:
            seq = seqs[fam.members[0]]
            write(seq, 0, len(seq["input_ids"]), 0)
            continue
        # The shared prefix, from its first member: no loss token (every member's
        # loss starts at or after it, so its loss mask, advantages and log-probs are 0).
        write(seqs[fam.members[0]], 0, fam.prefix, 0)
        prefix_segment = segment
        for m in fam.members:
            seq = seqs[m]
            write(seq, fam.prefix, len(seq["input_ids"]), prefix_segment)


def shared_prefix_shape(
    seqs: Sequence[dict[str, np.ndarray]],
    orders: Sequence[Sequence[int]],
    buckets: Sequence[int],
    row_multiple: int = 1,
) -> tuple[int, int]:
    """(row length T, rows per mini-batch R) for mini-batches of `seqs` (their indices
    ordered by `by_tokens`) packed as families (module docstring)."""
    longest = max(len(seqs[i]["input_ids"]) for order in orders for i in order)
    return best_row_shape(
        longest,
        buckets,
        row_multiple,
        lambda seq_len: max(
            len(_pack_families(families(seqs, order, seq_len), seq_len)) for order in orders
        ),
    )


def pack_shared_prefixes(
    trajectories: Sequence[Any],
    advantages: Sequence[float] | None = None,
    config: BatchingConfig | None = None,
    *,
    minibatches: Sequence[Sequence[int]] | None = None,
) -> TrainBatch:
    """Trajectories packed as families sharing their common prefix (module docstring);
    arguments and the mini-batches' strided layout as `batching.pack_batch`."""
    config = config or BatchingConfig(pack=True)
    seqs = shifted_sequences(trajectories, advantages)
    groups = [list(range(len(seqs)))] if minibatches is None else [list(m) for m in minibatches]
    if sorted(i for g in groups for i in g) != list(range(len(seqs))):
        raise ValueError(
            f"mini-batches {groups} must hold each of the {len(seqs)} trajectories once"
        )
    orders = [by_tokens(seqs, group) for group in groups]
    seq_len, rows = shared_prefix_shape(seqs, orders, config.seq_buckets, config.row_multiple)
    n = len(groups)
    out = empty_rows(n * rows, seq_len)
    out["prefix_segment_ids"] = np.zeros_like(out["segment_ids"])
    for i, order in enumerate(orders):
        for r, fams in enumerate(_pack_families(families(seqs, order, seq_len), seq_len)):
            _write_row(out, i + n * r, fams, seqs)
    out["loss_index"] = loss_positions(out["loss_mask"])
    return TrainBatch(**out)
