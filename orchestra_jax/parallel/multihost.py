"""What the hosts of a multi-host job share: who writes, exchanged objects, local copies.

JAX is multi-controller: every host runs the same program, and any computation
on arrays that span hosts (a collective) must be entered by every host in the
same order. The helpers here are such collectives; on a single process they
reduce to plain local operations.

- `is_primary()`: process 0, the only host that writes files meant to exist
  once (metrics, trajectories, reports, exported weights). Orbax checkpoints
  are written by every host together.
- `exchange(objects)`: every host passes a list of picklable objects and gets
  back every host's list, in process order (rollouts: each host plays its share
  of a step's episodes, then every host builds the same global batch).
- `gather_to_host(array)`: the whole value of an array that spans hosts, as a
  NumPy array on every host (one tensor at a time: exported weights, a
  host-local copy of the policy for in-process rollouts).
- `host_local_copy(state, mesh)`: a tree of global arrays re-placed on a mesh
  of this host's own devices.
- `barrier(name)`: every host waits here until all have arrived.
- `global_batch(batch, sharding)`: the learner's batch, the same on every host,
  as global arrays.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np


def is_primary() -> bool:
    """True on process 0 (and in a single-process job)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Blocks until every host has reached the barrier of the same `name`."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

        multihost_utils.sync_global_devices(name)


def _allgather(x: np.ndarray) -> np.ndarray:
    """[process_count, *x.shape]: every host's `x` (same shape and dtype on every host)."""
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return np.asarray(multihost_utils.process_allgather(x, tiled=False))


def exchange(objects: Sequence[Any]) -> list[list[Any]]:
    """Every host's list of objects, in process order (pickled and all-gathered)."""
    if jax.process_count() == 1:
        return [list(objects)]
    payload = np.frombuffer(pickle.dumps(list(objects)), dtype=np.uint8)
    sizes = _allgather(np.asarray([payload.size], np.int64))[:, 0]
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: payload.size] = payload
    gathered = _allgather(padded)
    return [pickle.loads(gathered[i, : int(n)].tobytes()) for i, n in enumerate(sizes)]


def gather_to_host(x: Any) -> np.ndarray:
    """The whole value of `x` as a NumPy array on this host (a collective when `x`
    spans hosts: every host must call it for the same array)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def host_local_copy(state: Any, shardings: Any) -> Any:
    """`state` (global arrays) placed on `shardings` over this host's devices, one
    leaf at a time; every host must call it with the same tree."""
    return jax.tree.map(lambda x, s: jax.device_put(gather_to_host(x), s), state, shardings)


def global_batch(batch: Any, sharding: Any) -> Any:
    """A batch (a tree of host arrays, the whole step's, the same on every host) as
    global arrays split by `sharding`.

    Every host passes the whole batch; `jax.make_array_from_process_local_data`
    with the global shape gives each device its rows, so the shapes are the same on
    every host by construction. On several hosts the batch's checksum is compared
    first: hosts that built different batches are an error, not a silent mix.
    """
    host = jax.tree.map(np.asarray, batch)
    if jax.process_count() > 1:
        crc = 0
        for x in jax.tree.leaves(host):
            crc = zlib.crc32(np.ascontiguousarray(x).tobytes(), crc)
        sums = _allgather(np.asarray([crc], np.int64))[:, 0]
        if len(set(sums.tolist())) > 1:
            raise RuntimeError(
                f"hosts built different batches for the same step (checksums {sums.tolist()}): "
                "their rollouts or data diverged"
            )
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, x, x.shape), host
    )
