"""Per-device memory of a GRPO learner step on a mesh, before renting the hardware.

Everything comes from abstract shapes (`nnx.eval_shape`, `jax.eval_shape`):
nothing is allocated, so an 8B model on a 64-device mesh plans on a laptop.
Per device, with S = data × fsdp batch shards and t = the tensor axis:

    parameters        each parameter's shard under parallel/mesh.py's rules,
                      in the parameter dtype
    master weights    the learner's trained copy in `master_dtype` (float32),
                      when the model stores its weights in another dtype
                      (else the masters are the parameters themselves)
    gradients         the float32 accumulator in the parameters' layout, plus
                      one micro-batch's gradient in the master dtype
    optimizer state   optax's state (AdamW: two moments) of the masters, laid
                      out like the parameters
    KL reference      a frozen copy of the masters in `reference_dtype` (when
                      rl.kl_coef > 0)
    gathered weights  FSDP all-gathers one unit at a time (a decoder layer, the
                      embedding, the LM head), split only by t: the largest
                      unit, for the policy and the reference, plus its
                      full-size gradient before the reduce-scatter
    activations       what the backward pass keeps from the forward, under the
                      model's remat policy: the residuals of `hidden_states`
                      traced at one device's micro-batch (rows × T) on the
                      per-device slice of the model (heads, MLP columns and
                      vocabulary divided by t where t divides them)
    layer recompute   remat "full"/"dots" recomputes one layer at a time in the
                      backward pass: that layer's residuals without remat
    logits            the residuals of the LM head and loss at the K loss
                      positions (the objective's minus the transformer's); a
                      packed row (rl.pack) holds several samples' loss
                      positions, so `launch/plan.py` plans it at K = T
    batch             the step's batch arrays, split over S
    rollout KV cache  the in-process engine's cache when it shares the devices
                      (rollout.engine="jax"): max_batch_size × max_seq_len ×
                      layers × 2 × kv_heads × head_dim in the compute dtype,
                      split over t where t divides the KV heads (replicated
                      over S, as XLA lays it out for the engine today)
    rollout weights   with several hosts, each host's engine holds its own
                      copy of the weights in the compute dtype, split over the
                      host's devices

With LoRA (`config.lora`), only the adapters train: "parameters" are the
frozen base in its dtype plus the float32 adapters; gradients, optimizer
state and the KL reference (base + reference adapters) are the adapters'
alone; the gathered weights are the base's units without their full-size
gradient (the base gets none); activations are traced as before.

The total is compared with the device's usable memory. Checked against
`compiled.memory_analysis()` of the real jitted train step on fake CPU devices
(tests/test_parallel_memory_plan.py); XLA's own buffer reuse on TPU and GPU
differs from the CPU backend's, so keep a margin.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh

from orchestra_jax.models.lora import LoRAParam
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.parallel.axes import AXES, BATCH_AXES
from orchestra_jax.parallel.mesh import _path_names, partition_spec
from orchestra_jax.rl.batching import TrainBatch
from orchestra_jax.rl.learner import make_optimizer
from orchestra_jax.rl.objectives import OBJECTIVES

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class DeviceKind:
    """An accelerator: memory per device, devices per host, share JAX may use."""

    name: str
    memory_bytes: int
    devices_per_host: int
    usable_fraction: float  # GPUs: XLA_PYTHON_CLIENT_MEM_FRACTION (launch/gpu_node.sh: 0.9)

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * self.usable_fraction)


# HBM per chip as Google documents it (decimal GB); GPU memory as nvidia-smi reports it.
DEVICE_KINDS: dict[str, DeviceKind] = {
    k.name: k
    for k in (
        DeviceKind("tpu-v5e", 16 * 10**9, 4, 1.0),
        DeviceKind("tpu-v5p", 95 * 10**9, 4, 1.0),
        DeviceKind("tpu-v6e", 32 * 10**9, 4, 1.0),
        # The single-host 8-chip machines (v5e-8, v6e-8): slices of more chips have 4 a host.
        DeviceKind("tpu-v5e-8", 16 * 10**9, 8, 1.0),
        DeviceKind("tpu-v6e-8", 32 * 10**9, 8, 1.0),
        DeviceKind("h100-80gb", 81559 * 2**20, 8, 0.9),
        DeviceKind("h200", 143771 * 2**20, 8, 0.9),
        DeviceKind("a100-80gb", 81920 * 2**20, 8, 0.9),
    )
}


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What one learner step holds per device (see module docstring)."""

    rows: int  # rows per device per micro-batch (rl.micro_batch_size)
    seq_len: int  # T, the largest sequence bucket
    loss_tokens: int  # K, loss positions per row
    step_rows: int  # rows of the whole step (all devices)
    kl_reference: bool = True
    rollout_kv: tuple[int, int] | None = None  # (max_batch_size, max_seq_len) when colocated
    hosts: int = 1  # >1 with a colocated engine: a host-local copy of the weights


@dataclasses.dataclass
class MemoryPlan:
    """Bytes per device by item, and how they compare with a device's memory."""

    items: dict[str, int]
    device: DeviceKind | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.items.values())

    @property
    def margin(self) -> int | None:
        """Usable bytes left (negative: short by that much); None without a device."""
        return None if self.device is None else self.device.usable_bytes - self.total

    @property
    def fits(self) -> bool:
        return self.margin is None or self.margin >= 0

    def report(self) -> str:
        width = max(len(k) for k in self.items)
        lines = [f"  {name:<{width}}  {_gib(b):>10}" for name, b in self.items.items()]
        lines.append(f"  {'total':<{width}}  {_gib(self.total):>10}")
        if self.device is not None:
            d = self.device
            lines.append(
                f"  {d.name}: {_gib(d.memory_bytes)} per device, "
                f"{_gib(d.usable_bytes)} usable ({d.usable_fraction:.0%})"
            )
            margin = d.usable_bytes - self.total
            verdict = "fits" if margin >= 0 else "does NOT fit"
            share = margin / d.usable_bytes
            lines.append(f"  {verdict}: margin {_gib(margin)} ({share:+.0%} of usable)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _gib(n: int) -> str:
    """Bytes as GiB, or MiB below one GiB (negative for a shortfall)."""
    if abs(n) < GIB:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / GIB:.2f} GiB"


def _nbytes(x) -> int:
    return int(math.prod(x.shape)) * jnp.dtype(x.dtype).itemsize


def shard_shape(shape, spec, mesh_sizes: Mapping[str, int]) -> tuple[int, ...]:
    """A global shape's per-device shape under PartitionSpec `spec` on axes `mesh_sizes`."""
    out = []
    for i, dim in enumerate(shape):
        axes = spec[i] if i < len(spec) else None
        axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        out.append(-(-dim // math.prod(mesh_sizes[a] for a in axes)))
    return tuple(out)


def _param_specs(state, mesh_sizes):
    sizes = AbstractMesh(tuple(mesh_sizes[a] for a in AXES), AXES)  # shapes only, no devices
    return jax.tree_util.tree_map_with_path(
        lambda path, x: partition_spec(_path_names(path), x.shape, sizes), state
    )


def _sharded_bytes(state, specs, mesh_sizes, dtype=None) -> int:
    total = 0
    for x, spec in zip(jax.tree.leaves(state), jax.tree.leaves(specs, is_leaf=_is_spec)):
        item = jnp.dtype(x.dtype if dtype is None else dtype).itemsize
        total += math.prod(shard_shape(x.shape, spec, mesh_sizes)) * item
    return total


def _is_spec(x) -> bool:
    return isinstance(x, jax.sharding.PartitionSpec)


def device_slice(config: Qwen3Config, tensor: int) -> Qwen3Config:
    """The per-device share of the model's activations under tensor parallelism t:
    heads, MLP columns and vocabulary divided by t where t divides them (the
    partition rules replicate a dimension t does not divide)."""

    def split(n):
        return n // tensor if n % tensor == 0 else n

    return config.replace(
        num_attention_heads=split(config.num_attention_heads),
        num_key_value_heads=split(config.num_key_value_heads)
        if config.num_attention_heads % tensor == 0
        else config.num_key_value_heads,
        intermediate_size=split(config.intermediate_size),
        vocab_size=split(config.vocab_size),
    )


def _residual_bytes(fn, *args) -> int:
    """Bytes the backward pass of `fn` keeps from its forward, its arguments excluded."""
    from jax._src.ad_checkpoint import saved_residuals  # pylint: disable=g-import-not-at-top

    return sum(
        _nbytes(aval)
        for aval, where in saved_residuals(fn, *args)
        if not where.startswith("from the argument")
    )


def _abstract_batch(rows: int, seq_len: int, loss_tokens: int):
    ints = jax.ShapeDtypeStruct((rows, seq_len), jnp.int32)
    floats = jax.ShapeDtypeStruct((rows, seq_len), jnp.float32)
    index = jax.ShapeDtypeStruct((rows, loss_tokens), jnp.int32)
    return TrainBatch(ints, ints, ints, ints, floats, floats, floats, index)


def activation_bytes(
    config: Qwen3Config, learner_config: Any, rows: int, seq_len: int, loss_tokens: int
) -> dict[str, int]:
    """{"activations", "layer recompute", "logits"} for one device's micro-batch of
    `config` (already the per-device slice), from traced residuals."""

    def split(c):
        abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(c, rngs=nnx.Rngs(0)))
        return nnx.split(abstract, nnx.Param, ...)

    graphdef, params, rest = split(config)
    batch = _abstract_batch(rows, seq_len, loss_tokens)
    objective = OBJECTIVES.get("grpo")
    use_ref = bool(learner_config.kl_coef)

    def loss(p, ref, b):
        model = nnx.merge(graphdef, p, rest)
        ref_model = nnx.merge(graphdef, ref, rest) if use_ref else None
        return objective(model, ref_model, b, jnp.float32(1.0), learner_config)[0]

    def transformer(gd, rst):
        def fn(p, b):
            h = nnx.merge(gd, p, rst).hidden_states(
                b.input_ids, b.positions, segment_ids=b.segment_ids
            )
            return jnp.sum(h.astype(jnp.float32))

        return fn

    total = _residual_bytes(loss, params, params, batch)
    body = _residual_bytes(transformer(graphdef, rest), params, batch)
    out = {"activations": body, "layer recompute": 0, "logits": max(total - body, 0)}
    if config.remat != "none":

        def one_layer(remat):
            gd, p, rst = split(config.replace(num_hidden_layers=1, scan_layers=False, remat=remat))
            return _residual_bytes(transformer(gd, rst), p, batch)

        out["layer recompute"] = max(one_layer("none") - one_layer(config.remat), 0)
    return out


def plan_memory(
    config: Qwen3Config,
    mesh_sizes: Mapping[str, int],
    learner_config: Any,
    shape: StepShape,
    *,
    device: DeviceKind | None = None,
) -> MemoryPlan:
    """The per-device memory plan of one GRPO learner step (see module docstring)."""
    sizes = {a: int(mesh_sizes.get(a, 1)) for a in AXES}
    shards = math.prod(sizes[a] for a in BATCH_AXES)
    tensor = sizes["tensor"]
    num_devices = math.prod(sizes.values())
    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    specs = _param_specs(params, sizes)
    lora = config.lora is not None
    # What the optimizer updates: every parameter, or the LoRA adapters alone.
    trained = nnx.state(abstract, LoRAParam) if lora else params
    trained_specs = _param_specs(trained, sizes)
    param_bytes = _sharded_bytes(params, specs, sizes)
    grads_f32 = _sharded_bytes(trained, trained_specs, sizes, jnp.float32)
    # The learner trains master weights in `master_dtype` (None: as stored); where the
    # model stores its weights in another dtype it keeps them beside the masters.
    master_dtype = getattr(learner_config, "master_dtype", "float32")
    trained_leaves = jax.tree.leaves(trained)
    master = jnp.dtype(master_dtype) if master_dtype else None
    master_bytes = _sharded_bytes(trained, trained_specs, sizes, master)
    separate_masters = master is not None and any(x.dtype != master for x in trained_leaves)
    reference_dtype = getattr(learner_config, "reference_dtype", None) or master_dtype
    reference_bytes = _sharded_bytes(
        trained, trained_specs, sizes, jnp.dtype(reference_dtype) if reference_dtype else None
    )

    tx = make_optimizer(learner_config)
    masters = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, master or x.dtype), trained)
    opt = jax.eval_shape(tx.init, masters)
    import optax  # pylint: disable=g-import-not-at-top

    opt_specs = optax.tree_map_params(
        tx,
        lambda _, spec: spec,
        opt,
        trained_specs,
        transform_non_params=lambda _: jax.sharding.PartitionSpec(),
        is_leaf=_is_spec,
    )
    opt_bytes = _sharded_bytes(opt, opt_specs, sizes)

    # FSDP gathers a unit's weights whole along data/fsdp, still split by tensor.
    unit_sizes = {**sizes, "data": 1, "fsdp": 1}
    flat = dict(nnx.to_flat_state(params))
    units: dict[str, int] = {}
    for path, var in flat.items():
        names = [str(p) for p in path]
        spec = dict(nnx.to_flat_state(specs))[path]
        full = math.prod(shard_shape(var.shape, spec, unit_sizes))
        if config.scan_layers and names[:2] == ["model", "layers"]:
            full //= config.num_hidden_layers
            unit = "layer"
        elif names[:2] == ["model", "layers"]:
            unit = f"layer{names[2]}"
        else:
            unit = ".".join(names[:-1])
        units[unit] = units.get(unit, 0) + full
    largest = max(units.values()) * jnp.dtype(config.param_dtype).itemsize
    copies = 2 if shape.kl_reference else 1
    gathered = largest * copies + (0 if lora else max(units.values()) * 4)

    items = {
        "parameters": param_bytes,
        "master weights": master_bytes if separate_masters else 0,
        "gradients": grads_f32 + master_bytes,
        "optimizer state": opt_bytes,
        "KL reference": reference_bytes if shape.kl_reference else 0,
        "gathered weights": gathered if shards > 1 else 0,
    }
    items.update(
        activation_bytes(
            device_slice(config, tensor),
            learner_config,
            shape.rows,
            shape.seq_len,
            min(shape.loss_tokens, shape.seq_len),
        )
    )
    rows_per_device = -(-shape.step_rows // shards)
    items["batch"] = rows_per_device * (7 * shape.seq_len + shape.loss_tokens) * 4
    notes = []
    if shape.rollout_kv is not None:
        batch, length = shape.rollout_kv
        kv = config.num_key_value_heads
        split = tensor if kv % tensor == 0 else 1
        per_layer = 2 * batch * kv * config.head_dim * length * jnp.dtype(config.dtype).itemsize
        items["rollout KV cache"] = config.num_hidden_layers * per_layer // split
        if shape.hosts > 1:
            local = max(num_devices // shape.hosts, 1)
            count = sum(math.prod(v.shape) for v in flat.values())
            items["rollout weights"] = count * jnp.dtype(config.dtype).itemsize // local
            notes.append(
                f"each of the {shape.hosts} hosts runs its own engine on its {local} devices"
            )
    return MemoryPlan(items, device, notes)
