"""Grain pipelines from task sources to batches of tasks, with exact resume.

Tasks travel through Grain as the Python `Task` objects themselves (no
conversion to dicts or arrays): every stage here is an in-memory `MapDataset`
read with zero worker threads, so nothing is pickled. Each element the
iterator yields is this host's `list[Task]` of one GRPO step: `tasks_per_step`
tasks on a single host, `tasks_per_step / H` on each of H hosts.

Pipeline, per source i with weight w_i:

    tasks_i ─ shuffle(seed_i) ─ repeat(num_epochs)
    mix(sources, proportions w) ─ shard (host h of H takes positions h, h+H, …)
                                ─ batch(tasks_per_step / H, drop remainder) ─ iterator

- Sharding comes last, over the job's one task stream: step s holds that
  stream's tasks s·T … s·T + T − 1 (T = tasks_per_step) whatever the number of
  hosts, and host h holds those at positions h, h + H, … of the step
  (`global_positions`). So a run on H hosts trains on the tasks a single host
  would, hosts see disjoint tasks, and the iterator state is the same on every
  host.
- Shuffling is a seeded index permutation that changes every epoch
  (Grain folds the epoch into the seed), derived per source from `seed`.
- Mixing is Grain's deterministic proportional interleave: of every
  Σ_i p_i consecutive tasks (p = weights scaled to small integers), exactly
  p_i come from source i. With finite `num_epochs` the stream ends when the
  first source (or stratum, below) runs out.
- Stratifying (`stratify_by="domain"`) splits every source into one stratum
  per value of that task field and mixes the strata in proportion to their
  sizes (times the source's weight). The mixture is unchanged, but each step's
  composition no longer varies by chance: with 3 equal domains every run of 3
  consecutive tasks holds one of each. The point: every policy update sees
  each domain's groups, so no step of one domain alone pulls the parameters
  the domains share its way. `stratum_weights` ({value: w}, 1 where absent)
  scales a stratum's share: {"logic": 2} trains on twice as many logic tasks
  as the sources hold, relative to the other domains (per-domain mixture
  weights, as in domain-reweighted pretraining).
- The iterator's `get_state()` is a small JSON-able dict (`{"next_index": k}`);
  `set_state` on a fresh iterator of the same pipeline continues exactly after
  the last batch served.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np


@dataclasses.dataclass(frozen=True)
class WeightedSource:
    """Tasks from one reader and their share of the mixture (weight > 0)."""

    name: str
    tasks: Sequence[Any]
    weight: float = 1.0


STRATIFY_FIELDS = ("domain", "answer_type")


def source_seed(seed: int, source_index: int, stratum_index: int | None = None) -> int:
    """Independent 32-bit shuffle seed for source `source_index` (and one of its
    strata), derived from `seed`."""
    entropy = [seed, source_index] + ([] if stratum_index is None else [stratum_index])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def stratify(
    sources: Sequence[WeightedSource], field: str, weights: Mapping[str, float] | None = None
) -> list[tuple[WeightedSource, int, int | None]]:
    """Each source split by `field` into strata weighted by their share of it,
    times `weights[value]` (1 for values not named).

    Returns `(stratum, source_index, stratum_index)` in source order, strata in
    order of first appearance (so the split is a function of the task order).
    A weight for a value no source holds is an error (a typo would otherwise
    change nothing).
    """
    if field not in STRATIFY_FIELDS:
        raise ValueError(f"stratify_by must be one of {STRATIFY_FIELDS}, got {field!r}")
    weights = dict(weights or {})
    for value, w in weights.items():
        if not w > 0:
            raise ValueError(f"stratum weight of {value!r} must be > 0, got {w}")
    out, seen = [], set()
    for i, source in enumerate(sources):
        groups: dict[str, list[Any]] = {}
        for task in source.tasks:
            groups.setdefault(str(getattr(task, field)), []).append(task)
        for j, (value, tasks) in enumerate(groups.items()):
            share = source.weight * len(tasks) / len(source.tasks) * weights.get(value, 1.0)
            out.append((WeightedSource(f"{source.name}/{value}", tasks, share), i, j))
        seen.update(groups)
    unknown = sorted(set(weights) - seen)
    if unknown:
        raise ValueError(
            f"stratum weights for {unknown}: no task has that {field} (values: {sorted(seen)})"
        )
    return out


def host_shard() -> tuple[int, int]:
    """`(jax.process_index(), jax.process_count())`: this host's data shard."""
    import jax  # pylint: disable=g-import-not-at-top

    return jax.process_index(), jax.process_count()


def task_batches(
    sources: Sequence[WeightedSource],
    *,
    tasks_per_step: int,
    seed: int,
    num_epochs: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    stratify_by: str | None = None,
    stratum_weights: Mapping[str, float] | None = None,
) -> grain.MapDataset:
    """The batched, mixed, sharded dataset of `list[Task]` (see module docstring).

    `num_epochs=None` repeats forever. `shard_index`/`shard_count` default to
    this JAX process's index and the process count; `tasks_per_step` (the whole
    step's) must be a multiple of `shard_count`. `stratify_by` (a task field
    of `STRATIFY_FIELDS`, or None) fixes each step's composition by that field;
    `stratum_weights` reweights its values (see `stratify`).
    """
    _validate(sources, tasks_per_step, num_epochs)
    if (shard_index is None) != (shard_count is None):
        raise ValueError("give both shard_index and shard_count, or neither")
    if shard_index is None or shard_count is None:
        shard_index, shard_count = host_shard()
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} is outside [0, {shard_count})")
    if tasks_per_step % shard_count:
        raise ValueError(
            f"tasks_per_step {tasks_per_step} is not a multiple of the {shard_count} hosts: "
            "each host plays an equal share of a step's tasks"
        )

    if stratify_by:
        parts = stratify(sources, stratify_by, stratum_weights)
    elif stratum_weights:
        raise ValueError("stratum_weights needs stratify_by")
    else:
        parts = [(source, i, None) for i, source in enumerate(sources)]
    per_source = []
    for source, i, j in parts:
        ds = grain.MapDataset.source(list(source.tasks))
        ds = ds.shuffle(seed=source_seed(seed, i, j)).repeat(num_epochs)
        per_source.append(ds)
    if len(per_source) == 1:
        mixed = per_source[0]
    else:
        mixed = grain.MapDataset.mix(per_source, weights=[s.weight for s, _, _ in parts])
    local = mixed[shard_index::shard_count] if shard_count > 1 else mixed
    return local.batch(tasks_per_step // shard_count, drop_remainder=True, batch_fn=list)


def global_positions(shard_index: int, shard_count: int, tasks_per_step: int) -> list[int]:
    """Positions within the whole step of host `shard_index`'s tasks: h, h + H, …"""
    return list(range(shard_index, tasks_per_step, shard_count))


def task_iterator(
    sources: Sequence[WeightedSource],
    *,
    tasks_per_step: int,
    seed: int,
    num_epochs: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    stratify_by: str | None = None,
    stratum_weights: Mapping[str, float] | None = None,
) -> grain.DatasetIterator:
    """A checkpointable iterator over `list[Task]` batches (`get_state`/`set_state`).

    Reads in the calling thread: tasks are already in memory, and prefetch
    threads would only contend for the GIL with the rollout loop.
    """
    dataset = task_batches(
        sources,
        tasks_per_step=tasks_per_step,
        seed=seed,
        num_epochs=num_epochs,
        shard_index=shard_index,
        shard_count=shard_count,
        stratify_by=stratify_by,
        stratum_weights=stratum_weights,
    )
    read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    return iter(dataset.to_iter_dataset(read_options))


def _validate(
    sources: Sequence[WeightedSource], tasks_per_step: int, num_epochs: int | None
) -> None:
    if not sources:
        raise ValueError("need at least one task source")
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"task source names must be unique, got {names}")
    for s in sources:
        if not s.weight > 0:
            raise ValueError(f"source {s.name!r}: weight must be > 0, got {s.weight}")
        if not s.tasks:
            raise ValueError(f"source {s.name!r} has no tasks")
    if tasks_per_step < 1:
        raise ValueError(f"tasks_per_step must be >= 1, got {tasks_per_step}")
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1 or None (forever), got {num_epochs}")
