"""A GRPO step's episodes split over the hosts of a multi-host job.

Each host reads its share of the step's tasks from the data pipeline (host h of
H holds the tasks at positions h, h + H, … of the step: `data/pipeline.py`),
plays their G episodes each, and the hosts exchange the graded trajectories,
so that every host then scores the same groups and builds the same global
batch (the learner's step is one computation over every host's devices).
Seeds follow each task's position in the step, so a run on H hosts plays the
episodes a single host would.

With the in-process JAX engine, each host samples from its own copy of the
policy on its own devices (`host_local_engine_model`, refreshed after every
update by `engine_weights`): hosts play their episodes independently, with no
collective per decode step. SGLang servers are shared by all hosts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from orchestra_jax.data.pipeline import global_positions
from orchestra_jax.parallel import multihost
from orchestra_jax.parallel.mesh import make_mesh, state_shardings


def task_positions(tasks_per_step: int) -> list[int]:
    """This host's tasks' positions in the step (0, 1, … on a single host)."""
    return global_positions(jax.process_index(), jax.process_count(), tasks_per_step)


def interleave_hosts(parts: Sequence[Sequence[Any]], group_size: int) -> list[Any]:
    """Every host's episodes (`parts[h]`: G per task, its tasks in order) in the
    step's order: host h's k-th group is the step's group h + H·k."""
    hosts = len(parts)
    groups: dict[int, list[Any]] = {}
    for h, part in enumerate(parts):
        if len(part) % group_size:
            raise ValueError(f"host {h} sent {len(part)} episodes, not groups of {group_size}")
        for k in range(len(part) // group_size):
            groups[h + hosts * k] = list(part[k * group_size : (k + 1) * group_size])
    if sorted(groups) != list(range(len(groups))):
        raise ValueError(f"hosts sent uneven shares of the step: groups {sorted(groups)}")
    return [episode for position in sorted(groups) for episode in groups[position]]


def gather_step(trajectories: Sequence[Any], group_size: int) -> list[Any]:
    """The whole step's trajectories, in step order, on every host (a collective)."""
    if jax.process_count() == 1:
        return list(trajectories)
    return interleave_hosts(multihost.exchange(trajectories), group_size)


def host_local_engine_model(model: nnx.Module, tensor: int) -> tuple[nnx.Module, Any]:
    """A copy of `model` on this host's devices for the rollout engine, and its
    shardings (the mesh's rules on a local (1, devices / tensor, tensor) mesh)."""
    mesh = make_mesh(1, -1, tensor, devices=jax.local_devices())
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    shardings = state_shardings(params, mesh)
    local = multihost.host_local_copy(params, shardings)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rest = multihost.host_local_copy(rest, jax.tree.map(lambda _: replicated, rest))
    return nnx.merge(graphdef, local, rest), shardings


def engine_weights(params: Any, local_shardings: Any | None) -> Any:
    """What the rollout engine is given after an update: the learner's parameters,
    or, for a host-local engine, their copy on this host's devices."""
    if local_shardings is None:
        return params
    return multihost.host_local_copy(params, local_shardings)
