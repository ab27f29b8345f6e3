"""The `mesh` section of an experiment config as `MeshConfig`: the device mesh's axis
sizes (parallel/axes.py), -1 for the devices left over; and the `distributed` section
as `DistributedConfig`: how a process joins a multi-host job (parallel/distributed.py)."""

from __future__ import annotations

import dataclasses

from orchestra_jax.config_section import Section


@dataclasses.dataclass(frozen=True)
class MeshConfig(Section):
    """`mesh.data`, `mesh.fsdp`, `mesh.tensor`: each >= 1, or -1 (every remaining device)."""

    SECTION = "mesh"

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def problems(self) -> list[str]:
        errors = []
        for axis in ("data", "fsdp", "tensor"):
            size = getattr(self, axis)
            if size == 0 or size < -1:
                errors.append(f"mesh.{axis} must be >= 1 or -1 (the rest), got {size}")
        return errors


@dataclasses.dataclass(frozen=True)
class DistributedConfig(Section):
    """`distributed.*`: the job's coordinator ("host:port" of process 0), process count
    and this process's id, each unset (""/0/-1) to take it from the environment or
    JAX's detection, and whether to use JAX's cluster detection. Checked when the
    process joins (`distributed.distributed_args`), against the environment's values."""

    SECTION = "distributed"

    coordinator_address: str = ""
    num_processes: int = 0
    process_id: int = -1
    auto_detect: bool = False
