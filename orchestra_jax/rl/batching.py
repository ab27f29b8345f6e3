"""Trajectories -> fixed-shape training arrays, bucketed so few shapes ever compile.

Alignment. A trajectory's arrays index *tokens*: `loss_mask[i]` and
`rollout_logprobs[i]` describe `token_ids[i]`. The model's logits at position t
predict the token at t + 1, so a sequence of L tokens becomes L − 1 positions:

    input_ids[t]    = token_ids[t]              t = 0 … L − 2
    target_ids[t]   = token_ids[t + 1]
    loss_mask[t]    = loss_mask[t + 1]          (was token t + 1 sampled?)
    old_logprobs[t] = rollout_logprobs[t + 1]   (its rollout log-prob)
    advantages[t]   = the trajectory's advantage where loss_mask[t] = 1, else 0

so `token_logprobs(logits, target_ids)` lines up with `old_logprobs` index by
index. The last token is never an input (nothing follows it).

Shapes. Rows are padded to a sequence-length bucket (the smallest configured
bucket that fits the longest sequence) and the row count to
`row_multiple · 2^k`, so a run compiles at most #buckets × log2(#rows) shapes.
Padding has segment id 0 and loss mask 0.

Packing (`pack=True`, `pack_batch`). Several sequences share a row (first-fit
decreasing); segment ids 1, 2, … keep them apart (every attention kernel sees
them: `models/attention_kernels.py`) and positions restart at 0 for each. The
row length T is the bucket, among those that hold the longest sequence, that
leaves the fewest padded positions (ties: the shorter, as attention costs grow
with T), and the row count is rounded up to a multiple of `row_multiple` (not
to a power of two: a packed batch is already dense, doubling its rows would
undo that). The compiled shapes are then at most #buckets × (most rows /
row_multiple), and in a run with steady sample counts a handful: a step's
token count, and so its row count, varies little. Mini-batches pack
separately (`pack_batch(..., minibatches=...)`), each into the same number of
rows, laid out strided as `place_minibatches` lays them out.

Loss positions. `loss_index[b]` lists the positions t of row b with
loss_mask 1, padded with −1 to K (a power of two, at least 8, at most T): the
learner computes the LM head and log-softmax only there. Agent episodes are
mostly prompt and tool results (mask 0), so this skips most of the [B, T, V]
head. Packed rows list their loss positions the same way (the learner
renumbers segment ids at the gathered positions: `objectives.at_loss_positions`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

DEFAULT_SEQ_BUCKETS = tuple(2**k for k in range(7, 16))  # 128 … 32768


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """Fixed-shape [B, T] arrays for one learner step (see the module docstring)."""

    input_ids: Any  # int32, token fed at position t
    positions: Any  # int32, position within its sequence
    segment_ids: Any  # int32, 1, 2, … per sequence in the row; 0 = padding
    target_ids: Any  # int32, token predicted at position t
    loss_mask: Any  # float32, 1 where target_ids[t] was sampled by the policy
    advantages: Any  # float32, the sequence's advantage on loss tokens, else 0
    old_logprobs: Any  # float32, rollout log-prob of target_ids[t] (0 off the mask)
    loss_index: Any  # int32 [B, K], positions t with loss_mask 1, then -1 (see below)
    # int32 [B, T] or None: the segment of a shared prefix position t also sees, 0 for
    # none (rows of `rl/prefix_packing.py`); None: no row shares a prefix.
    prefix_segment_ids: Any = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    def num_loss_tokens(self) -> int:
        return int(np.asarray(self.loss_mask).sum())


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
    """seq_buckets: allowed padded lengths T (ascending); row_multiple: rows are
    row_multiple · 2^k (use micro_batch_size × batch shards); pack: share rows."""

    seq_buckets: tuple[int, ...] = DEFAULT_SEQ_BUCKETS
    row_multiple: int = 1
    pack: bool = False

    def __post_init__(self):
        if not self.seq_buckets or list(self.seq_buckets) != sorted(set(self.seq_buckets)):
            raise ValueError(f"seq_buckets must be ascending and distinct, got {self.seq_buckets}")
        if self.seq_buckets[0] < 1 or self.row_multiple < 1:
            raise ValueError("seq_buckets and row_multiple must be positive")


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= length; a clear error when none is big enough."""
    for bucket in buckets:
        if bucket >= length:
            return bucket
    raise ValueError(
        f"a sequence of {length} positions exceeds the largest bucket "
        f"{buckets[-1]}; add a bigger bucket or cap the episode length"
    )


def bucket_rows(num_rows: int, multiple: int) -> int:
    """multiple · 2^k, the smallest such number >= num_rows."""
    blocks = -(-num_rows // multiple)
    return multiple * (1 << max(blocks - 1, 0).bit_length())


def _shifted(traj: Any, advantage: float, index: int) -> dict[str, np.ndarray]:
    ids = np.asarray(traj.token_ids, np.int32)
    mask = np.asarray(traj.loss_mask, np.float32)
    logprobs = np.asarray(traj.rollout_logprobs, np.float32)
    if not len(ids) == len(mask) == len(logprobs):
        raise ValueError(
            f"trajectory {index}: token_ids, loss_mask and rollout_logprobs differ "
            f"in length ({len(ids)}, {len(mask)}, {len(logprobs)})"
        )
    if len(ids) < 2:
        raise ValueError(f"trajectory {index} has {len(ids)} tokens; training needs at least 2")
    if not np.isfinite(advantage):
        raise ValueError(f"trajectory {index} has a non-finite advantage {advantage}")
    target_mask = mask[1:]
    return {
        "input_ids": ids[:-1],
        "target_ids": ids[1:],
        "loss_mask": target_mask,
        "old_logprobs": logprobs[1:] * target_mask,
        "advantages": np.float32(advantage) * target_mask,
    }


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: lists of sequence indices whose lengths fit in `capacity`."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, space in enumerate(free):
            if lengths[i] <= space:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(capacity - lengths[i])
    return rows


def shifted_sequences(
    trajectories: Sequence[Any], advantages: Sequence[float] | None = None
) -> list[dict[str, np.ndarray]]:
    """Each trajectory's shifted arrays (module docstring), its advantage on its loss tokens.

    `advantages` defaults to each trajectory's own `advantage`.
    """
    if not trajectories:
        raise ValueError("cannot build a training batch from zero trajectories")
    if advantages is None:
        advantages = [t.advantage for t in trajectories]
        if any(a is None for a in advantages):
            raise ValueError(
                "trajectories carry no advantage; compute advantages first or pass them explicitly"
            )
    if len(advantages) != len(trajectories):
        raise ValueError(f"{len(advantages)} advantages for {len(trajectories)} trajectories")
    return [_shifted(t, float(a), i) for i, (t, a) in enumerate(zip(trajectories, advantages))]


def empty_rows(num_rows: int, seq_len: int) -> dict[str, np.ndarray]:
    ints = ("input_ids", "positions", "segment_ids", "target_ids")
    floats = ("loss_mask", "advantages", "old_logprobs")
    return {
        name: np.zeros((num_rows, seq_len), np.int32 if name in ints else np.float32)
        for name in ints + floats
    }


def _write_row(out: dict[str, np.ndarray], row: int, seqs: list[dict[str, np.ndarray]]) -> None:
    """Row `row` := `seqs` end to end, segments 1, 2, …, positions from 0 in each."""
    start = 0
    for segment, seq in enumerate(seqs, start=1):
        end = start + len(seq["input_ids"])
        for name, values in seq.items():
            out[name][row, start:end] = values
        out["positions"][row, start:end] = np.arange(end - start)
        out["segment_ids"][row, start:end] = segment
        start = end


def build_train_batch(
    trajectories: Sequence[Any],
    advantages: Sequence[float] | None = None,
    config: BatchingConfig = BatchingConfig(),
) -> TrainBatch:
    """Packs trajectories (anything with `token_ids`, `loss_mask`, `rollout_logprobs`,
    and `advantage` unless `advantages` is given) into one bucketed `TrainBatch`:
    one a row, or with `config.pack` several a row (`pack_batch`)."""
    if config.pack:
        return pack_batch(trajectories, advantages, config)
    seqs = shifted_sequences(trajectories, advantages)
    seq_len = bucket_length(max(len(s["input_ids"]) for s in seqs), config.seq_buckets)
    out = empty_rows(bucket_rows(len(seqs), config.row_multiple), seq_len)
    for r, seq in enumerate(seqs):
        _write_row(out, r, [seq])
    out["loss_index"] = loss_positions(out["loss_mask"])
    return TrainBatch(**out)


def packed_shape(
    lengths: Sequence[Sequence[int]], buckets: Sequence[int], row_multiple: int = 1
) -> tuple[int, int]:
    """(row length T, rows per mini-batch R) for mini-batches of sequences of `lengths`,
    each packed first-fit decreasing into R rows of T: among the buckets that hold the
    longest sequence, the T with the fewest positions n · R · T (R the most rows a
    mini-batch needs, rounded up to a multiple of `row_multiple`), the shorter on a tie."""
    longest = max(max(group, default=0) for group in lengths)
    return best_row_shape(
        longest,
        buckets,
        row_multiple,
        lambda seq_len: max(len(first_fit_decreasing(group, seq_len)) for group in lengths),
    )


def best_row_shape(
    longest: int, buckets: Sequence[int], row_multiple: int, rows_at: Callable[[int], int]
) -> tuple[int, int]:
    """(T, R): among the buckets T >= `longest`, the one whose R = `rows_at(T)` (the
    most rows a mini-batch needs), rounded up to a multiple of `row_multiple`, gives
    the fewest positions R · T; the shorter on a tie."""
    best: tuple[int, int, int] | None = None
    for seq_len in buckets:
        if seq_len < longest:
            continue
        rows = -(-rows_at(seq_len) // row_multiple) * row_multiple
        if best is None or rows * seq_len < best[0]:
            best = (rows * seq_len, seq_len, rows)
    if best is None:
        bucket_length(longest, buckets)  # raises: no bucket holds the longest sequence
        raise AssertionError("unreachable")
    return best[1], best[2]


def pack_batch(
    trajectories: Sequence[Any],
    advantages: Sequence[float] | None = None,
    config: BatchingConfig = BatchingConfig(pack=True),
    *,
    minibatches: Sequence[Sequence[int]] | None = None,
) -> TrainBatch:
    """Trajectories packed several a row (module docstring, "Packing").

    `minibatches` (default: one holding every trajectory) lists the trajectory
    indices of each of n mini-batches, each index once; mini-batch i is packed
    into R rows (`packed_shape`) placed at rows i, n + i, 2n + i, …, as
    `place_minibatches` places them, its rows beyond its own (all R of an empty
    mini-batch) placeholders (segment id 0, loss mask 0, no loss position)."""
    seqs = shifted_sequences(trajectories, advantages)
    groups = [list(range(len(seqs)))] if minibatches is None else [list(m) for m in minibatches]
    members = sorted(i for group in groups for i in group)
    if members != list(range(len(seqs))):
        raise ValueError(
            f"mini-batches {groups} must hold each of the {len(seqs)} trajectories once"
        )
    lengths = [len(s["input_ids"]) for s in seqs]
    seq_len, rows = packed_shape(
        [[lengths[i] for i in group] for group in groups], config.seq_buckets, config.row_multiple
    )
    n = len(groups)
    out = empty_rows(n * rows, seq_len)
    for i, group in enumerate(groups):
        for r, packed in enumerate(first_fit_decreasing([lengths[j] for j in group], seq_len)):
            _write_row(out, i + n * r, [seqs[group[k]] for k in packed])
    out["loss_index"] = loss_positions(out["loss_mask"])
    return TrainBatch(**out)


def loss_positions(loss_mask: np.ndarray) -> np.ndarray:
    """[B, K] int32: each row's loss positions, ascending, then −1 (see the module
    docstring)."""
    rows, length = loss_mask.shape
    counts = (loss_mask > 0).sum(axis=1)
    k = 8
    while k < counts.max(initial=0):
        k *= 2
    out = np.full((rows, min(k, length)), -1, np.int32)
    for r in range(rows):
        where = np.flatnonzero(loss_mask[r] > 0)
        out[r, : len(where)] = where
    return out


def place_minibatches(
    batch: TrainBatch, sizes: Sequence[int], rows_per_minibatch: int
) -> TrainBatch:
    """`batch`'s first Σ sizes rows (one sample each, in order) laid out as
    len(sizes) = n strided mini-batches of `rows_per_minibatch` = R rows: mini-batch
    i (rows i, n + i, 2n + i, …) holds samples s_i … s_i + sizes[i] − 1, s_i =
    Σ_{j<i} sizes[j], then R − sizes[i] placeholder rows (segment id 0, loss mask 0,
    no loss position), which add nothing to any loss, denominator or gradient.
    Every mini-batch has R rows, whatever it holds: one compiled shape."""
    n, total = len(sizes), int(sum(sizes))
    if not n or min(sizes) < 1 or max(sizes) > rows_per_minibatch:
        raise ValueError(
            f"mini-batch sizes {list(sizes)} must be >= 1 and fit {rows_per_minibatch} rows"
        )
    if total > batch.shape[0]:
        raise ValueError(f"{total} samples, but the batch has {batch.shape[0]} rows")
    source = np.full(n * rows_per_minibatch, -1, np.int64)  # -1: a placeholder row
    start = 0
    for i, size in enumerate(sizes):
        source[i + n * np.arange(size)] = np.arange(start, start + size)
        start += size
    real = source >= 0

    def place(x: Any, fill: int | float) -> np.ndarray:
        x = np.asarray(x)
        out = np.full((n * rows_per_minibatch, *x.shape[1:]), fill, x.dtype)
        out[real] = x[source[real]]
        return out

    fields = {
        f.name: place(getattr(batch, f.name), 0)
        for f in dataclasses.fields(batch)
        if getattr(batch, f.name) is not None
    }
    fields["loss_index"] = place(batch.loss_index, -1)
    return TrainBatch(**fields)
