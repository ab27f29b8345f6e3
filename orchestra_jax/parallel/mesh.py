"""Device meshes, partition rules for every Qwen3 parameter, and sharded model creation.

Mesh axes: "data" (pure data parallel: replicated weights), "fsdp" (batch and
weights both split: ZeRO-3 style), "tensor" (Megatron-style: attention heads and
MLP columns split, activations all-reduced after o_proj / down_proj).

Rule per parameter (kernels are [in, out]):
    embed_tokens.embedding [V, E]          -> ("tensor", "fsdp")
    {q,k,v,gate,up}_proj.kernel [E, out]   -> ("fsdp", "tensor")   column parallel
    {o,down}_proj.kernel [in, E]           -> ("tensor", "fsdp")   row parallel
    lm_head.kernel [E, V]                  -> ("fsdp", "tensor")
    *.scale (norms)                        -> replicated
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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orchestra_jax.models.qwen3 import Qwen3Config, Qwen3ForCausalLM

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

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


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh; one size may be -1 to take the remaining devices."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(AXES, sizes))}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices are not divisible by {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices, have {len(devices)}"
        )
    return Mesh(np.asarray(devices).reshape(sizes), AXES)


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


def partition_spec(names: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
    """The PartitionSpec of the parameter at `names` (e.g. (..., "q_proj", "kernel"))."""
    if names[-1] == "scale":
        return P()
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


def create_sharded_model(config: Qwen3Config, mesh: Mesh, *, seed: int = 0) -> Qwen3ForCausalLM:
    """Initialise a Qwen3ForCausalLM directly into its shardings.

    The model is traced abstractly (nnx.eval_shape), then the initialiser runs under
    jit with out_shardings, so each device only ever allocates its own shards.
    """
    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed)))
    graphdef, abstract_state = nnx.split(abstract)

    def init():
        return nnx.state(Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed)))

    state = jax.jit(init, out_shardings=state_shardings(abstract_state, mesh))()
    return nnx.merge(graphdef, state)
