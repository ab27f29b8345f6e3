"""Device meshes and the partition rules for every Qwen3 parameter.

Mesh axes: "data" (pure data parallel: replicated weights), "fsdp" (batch and
weights both split: ZeRO-3 style), "tensor" (Megatron-style: attention heads and
MLP columns split, activations all-reduced after o_proj / down_proj).

Rule per parameter (kernels are [in, out]):
    embed_tokens.embedding [V, E]          -> ("tensor", "fsdp")
    {q,k,v,gate,up}_proj.kernel [E, out]   -> ("fsdp", "tensor")   column parallel
    {o,down}_proj.kernel [in, E]           -> ("tensor", "fsdp")   row parallel
    lm_head.kernel [E, V]                  -> ("fsdp", "tensor")
    *.scale (norms)                        -> replicated
    LoRA lora_a [in, r] / lora_b [r, out]  -> the kernel's in / out axis, rank unsplit
Scanned layers add a leading, unsplit layer axis. A mesh axis that does not divide
its dimension is left out of that dimension (the dimension is replicated instead),
so small test shapes run on any mesh.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orchestra_jax.parallel.axes import AXES, BATCH_AXES
from orchestra_jax.parallel.config import MeshConfig

_RULES: dict[tuple[str, ...], tuple[Any, ...]] = {  # (module, parameter) names
    ("embed_tokens", "embedding"): ("tensor", "fsdp"),
    ("q_proj", "kernel"): ("fsdp", "tensor"),
    ("k_proj", "kernel"): ("fsdp", "tensor"),
    ("v_proj", "kernel"): ("fsdp", "tensor"),
    ("gate_proj", "kernel"): ("fsdp", "tensor"),
    ("up_proj", "kernel"): ("fsdp", "tensor"),
    ("o_proj", "kernel"): ("tensor", "fsdp"),
    ("down_proj", "kernel"): ("tensor", "fsdp"),
    ("lm_head", "kernel"): ("fsdp", "tensor"),
}

# LoRA A [in, r] splits its input axis as the kernel does, B [r, out] its output axis;
# the rank axis is never split.
_ADAPTER_AXES = {
    "lora_a": lambda kernel_rule: (kernel_rule[0], None),
    "lora_b": lambda kernel_rule: (None, kernel_rule[1]),
}


def resolve_axes(data: int, fsdp: int, tensor: int, num_devices: int) -> dict[str, int]:
    """The mesh's axis sizes with a -1 resolved to the devices left over.

    Raises ValueError naming the `mesh.*` config fields when the sizes cannot
    cover exactly `num_devices` devices.
    """
    sizes: dict[str, int] = dict(zip(AXES, (data, fsdp, tensor)))
    bad = [f"mesh.{a}={s}" for a, s in sizes.items() if s == 0 or s < -1]
    if bad:
        raise ValueError(f"{', '.join(bad)}: each mesh axis is >= 1, or -1 for the rest")
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
        raise ValueError(
            f"mesh.{' and mesh.'.join(free)} are both -1: at most one mesh axis may take the rest"
        )
    known = math.prod(s for s in sizes.values() if s != -1)
    if free:
        if num_devices % known:
            fixed = " x ".join(f"mesh.{a}={s}" for a, s in sizes.items() if s != -1)
            raise ValueError(
                f"{num_devices} devices do not split into {fixed} x the rest (mesh.{free[0]}=-1): "
                f"choose sizes whose product divides {num_devices}"
            )
        sizes[free[0]] = num_devices // known
    if math.prod(sizes.values()) != num_devices:
        product = " x ".join(f"mesh.{a}={s}" for a, s in sizes.items())
        raise ValueError(
            f"{product} needs {math.prod(sizes.values())} devices, this job has {num_devices}: "
            f"change mesh.data, mesh.fsdp and mesh.tensor so their product is {num_devices} "
            "(or set one of them to -1, the rest)"
        )
    return sizes


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh; one size may be -1 to take the remaining devices.

    Devices are laid out with "tensor" varying fastest, so a tensor group stays
    within a host where it fits (jax.devices() lists each process's devices
    together). On TPU, JAX's `mesh_utils.create_device_mesh` orders them along
    the chips' physical links.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = list(resolve_axes(data, fsdp, tensor, len(devices)).values())
    if devices[0].platform == "tpu":
        from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top

        return Mesh(mesh_utils.create_device_mesh(sizes, devices), AXES)
    return Mesh(np.asarray(devices).reshape(sizes), AXES)


def num_batch_shards(mesh: Mesh) -> int:
    """Devices the batch is split over: mesh.data × mesh.fsdp."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def mesh_errors(
    mesh: MeshConfig,
    *,
    tasks_per_step: int,
    rollout_engine: str,
    num_devices: int,
    num_processes: int = 1,
) -> list[str]:
    """Start-up errors of the `mesh` section, with `rl.tasks_per_step` and
    `rollout.engine`, on a job of `num_devices` devices over `num_processes` hosts
    (empty: it can run).

    Each message names the config fields to change. Checked: the mesh covers the
    devices exactly; every host plays an equal share of a step's tasks
    (`rl.tasks_per_step` a multiple of the hosts); with the in-process JAX
    rollout engine on several hosts, each host runs its own copy of the policy
    on its own devices, so `mesh.tensor` must divide a host's device count.
    Micro-batches cannot mismatch the mesh: `rl.micro_batch_size` counts rows
    per batch shard.
    """
    errors: list[str] = []
    try:
        sizes = resolve_axes(mesh.data, mesh.fsdp, mesh.tensor, num_devices)
    except ValueError as e:
        errors.append(f"mesh: {e}")
        sizes = None
    if num_processes > 1:
        if num_devices % num_processes:
            errors.append(f"{num_devices} devices are not spread evenly over {num_processes} hosts")
        tasks = tasks_per_step
        if tasks % num_processes:
            errors.append(
                f"rl.tasks_per_step={tasks} is not a multiple of the {num_processes} hosts: "
                f"each host plays an equal share of a step's tasks; set it to a multiple of "
                f"{num_processes}"
            )
        local = num_devices // num_processes
        if sizes is not None and rollout_engine == "jax" and local % sizes["tensor"]:
            errors.append(
                f"mesh.tensor={sizes['tensor']} does not divide a host's {local} devices: "
                "rollout.engine='jax' runs a copy of the policy on each host's own devices; "
                f"set mesh.tensor to a divisor of {local}, or rollout.engine='sglang'"
            )
    return errors


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding for [B, T] inputs: batch split over ("data", "fsdp"), time replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, None))


def _path_names(path) -> tuple[str, ...]:
    """Module/attribute names of a state path, dropping list indices and the `.value` leaf."""
    names = []
    for key in path:
        name = getattr(key, "key", getattr(key, "name", None))
        if isinstance(name, str) and name != "value":
            names.append(name)
    return tuple(names)


def partition_spec(names: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh | AbstractMesh) -> P:
    """The PartitionSpec of the parameter at `names` (e.g. (..., "q_proj", "kernel"))."""
    if names[-1] == "scale":
        return P()
    if names[-1] in _ADAPTER_AXES:  # a LoRA matrix follows its projection's kernel
        kernel_rule = _RULES.get((names[-2], "kernel"))
        rule = None if kernel_rule is None else _ADAPTER_AXES[names[-1]](kernel_rule)
    else:
        rule = _RULES.get(tuple(names[-2:]))
    if rule is None:
        raise ValueError(f"no partition rule for parameter {'.'.join(names)}")
    rule = (None,) * (len(shape) - len(rule)) + rule  # leading layer axis when scanned.
    fitted = [
        axis if axis is None or dim % mesh.shape[axis] == 0 else None
        for axis, dim in zip(rule, shape)
    ]
    return P(*fitted)


def state_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """A NamedSharding for every array of `state` (concrete or abstract), same structure."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, partition_spec(_path_names(path), x.shape, mesh)),
        state,
    )


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Move every parameter of `model` to its sharding on `mesh` (in place); returns the model."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, state_shardings(state, mesh)))
    return model
