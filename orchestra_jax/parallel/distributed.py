"""Joining a multi-host job: `jax.distributed.initialize` from the config or the environment.

JAX is multi-controller: every host runs the same program, and the processes
meet at a coordinator (process 0's `host:port`) before any computation. Where
the settings come from, first match wins:

1. the config's `distributed` section: `coordinator_address` (with
   `num_processes` and `process_id`, each falling back to the environment);
2. the environment: `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
   `JAX_PROCESS_ID` (what `launch/local_hosts.py` and `launch/slurm_gpu.sbatch`
   set); a count or id left unset is detected by JAX where it can be;
3. `distributed.auto_detect=True`, or `ORCHESTRA_JAX_DISTRIBUTED=1` in the
   environment (what `launch/tpu_pod.sh` sets): JAX's own cluster detection
   (Cloud TPU pods, Slurm, Open MPI, Kubernetes);
4. none of these: a single process, nothing to join.

On CPU the processes exchange data over Gloo (JAX's default CPU collectives).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

from orchestra_jax.parallel.config import DistributedConfig

log = logging.getLogger(__name__)

ENV_ADDRESS = "JAX_COORDINATOR_ADDRESS"
ENV_COUNT = "JAX_NUM_PROCESSES"
ENV_ID = "JAX_PROCESS_ID"
ENV_AUTO = "ORCHESTRA_JAX_DISTRIBUTED"


@dataclasses.dataclass(frozen=True)
class DistributedArgs:
    """Keyword arguments of `jax.distributed.initialize`; None = JAX detects it."""

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def distributed_args(
    section: DistributedConfig | None = None, environ: Mapping[str, str] | None = None
) -> DistributedArgs | None:
    """How this process joins the job (see module docstring); None for a single process.

    `section` is the config's `distributed` section (None: every field unset). Raises
    ValueError naming the field or variable when the settings contradict each other.
    """
    environ = os.environ if environ is None else environ
    section = section or DistributedConfig()
    address = section.coordinator_address or environ.get(ENV_ADDRESS, "")
    count = section.num_processes or _env_int(environ, ENV_COUNT)
    process_id = section.process_id
    if process_id is None or process_id < 0:
        process_id = _env_int(environ, ENV_ID)
    auto = section.auto_detect or environ.get(ENV_AUTO) == "1"
    if not address and not auto:
        if count not in (None, 1) or process_id not in (None, 0):
            raise ValueError(
                f"a process count ({count}) or id ({process_id}) was given without a "
                f"coordinator: set distributed.coordinator_address or {ENV_ADDRESS}, or "
                f"distributed.auto_detect=True on a cluster JAX detects"
            )
        return None
    if count is not None and count < 1:
        raise ValueError(f"distributed.num_processes / {ENV_COUNT} must be >= 1, got {count}")
    if count is not None and process_id is not None and not 0 <= process_id < count:
        raise ValueError(
            f"distributed.process_id / {ENV_ID} = {process_id} is outside [0, {count})"
        )
    return DistributedArgs(address or None, count, process_id)


def initialize(
    section: DistributedConfig | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """Joins the multi-host job if one is configured; returns whether it did.

    Call before anything else touches JAX's devices. Calling it again in a
    process that already joined does nothing.
    """
    import jax  # pylint: disable=g-import-not-at-top

    args = distributed_args(section, environ)
    if args is None:
        return False
    if jax.distributed.is_initialized():
        return True
    jax.distributed.initialize(**args.kwargs())
    log.info(
        "joined the job as process %d of %d (%d local devices of %d)",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True
