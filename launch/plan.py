r"""Will a config's learner step fit a mesh of a given accelerator? Ask before renting it.

    python -m launch.plan --config=experiments/configs/grpo_hle.py:qwen3_8b \
        --mesh=data=1,fsdp=64,tensor=1 --device=tpu-v5p [--config.rl.micro_batch_size=2 ...]

Prints the config's start-up errors for that mesh (parallel/mesh.mesh_errors),
then bytes per device for each item of the learner step (parameters,
gradients, optimizer state, KL reference, gathered weights, activations at the
largest sequence bucket and the micro-batch under the remat setting, logits,
and the rollout engine when it shares the devices), the total, and whether it
fits the device with what margin (orchestra_jax/rl/memory_plan.py). Exit
status: 0 it fits, 1 it does not, 2 the config cannot run on that mesh at all.

Devices: tpu-v5e, tpu-v5p, tpu-v6e (4 chips a host), tpu-v5e-8, tpu-v6e-8 (one
8-chip host), h100-80gb, h200, a100-80gb. The model's
shape comes from `model.preset` (with `model.overrides`) or `model.hf_path`'s
config.json; where that folder is not on this machine, a Qwen3 folder name it
ends in (Qwen3-8B, Qwen3-0.6B) or `--preset` names the shape.
"""

from __future__ import annotations

import math
import os
import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags


def _define_flags():
    """The command line (defined when run as a program: importing this module for
    `plan` defines no flags, so it sits beside the experiment drivers' own)."""
    return (
        config_flags.DEFINE_config_file("config", None, "Experiment config: path.py:variant."),
        flags.DEFINE_string("mesh", None, "Mesh sizes, e.g. data=1,fsdp=64,tensor=1."),
        flags.DEFINE_string("device", None, "Accelerator kind, e.g. tpu-v5p or h100-80gb."),
        flags.DEFINE_string(
            "preset", "", "Qwen3 preset for the shape when model.hf_path is not on this machine."
        ),
    )


# Hugging Face folder names of the presets, for configs whose hf_path is elsewhere.
HF_NAMES = {"qwen3-8b": "qwen3_8b", "qwen3-0.6b": "qwen3_0p6b"}
DTYPES = ("float32", "bfloat16")


def parse_mesh(text: str) -> dict[str, int]:
    """ "data=1,fsdp=64,tensor=1" -> {"data": 1, "fsdp": 64, "tensor": 1} (missing axes: 1)."""
    from orchestra_jax.parallel.axes import AXES

    sizes = dict.fromkeys(AXES, 1)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in AXES or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--mesh: bad item {item!r}; want axis=size with axes {AXES}")
        sizes[name] = int(value)
    return sizes


def model_config(config, preset: str = ""):
    """The policy's Qwen3Config (shape and runtime fields) from the experiment config."""
    import jax.numpy as jnp

    from orchestra_jax.models.qwen3.config import Qwen3Config
    from orchestra_jax.training.builders import lora_spec

    m = config.model
    runtime = dict(
        param_dtype=jnp.dtype(m.param_dtype),
        dtype=jnp.dtype(m.dtype),
        scan_layers=m.scan_layers,
        remat=m.remat,
        lora=lora_spec(config),
    )
    if preset or m.preset:
        overrides = {} if preset else dict(m.get("overrides", {}))
        return Qwen3Config.preset(preset or m.preset, **overrides, **runtime)
    path = pathlib.Path(m.hf_path)
    if (path / "config.json").is_file():
        return Qwen3Config.from_hf(path, **runtime)
    name = HF_NAMES.get(path.name.lower())
    if name is None:
        raise ValueError(
            f"model.hf_path {m.hf_path!r} is not on this machine: pass --preset "
            "(qwen3_8b, qwen3_0p6b, ...) for its shape"
        )
    return Qwen3Config.preset(name, **runtime)


def step_shape(config, mesh_sizes, device_kind):
    """The learner step's StepShape for `config` on the mesh (see memory_plan.StepShape)."""
    from orchestra_jax.rl.batching import bucket_rows
    from orchestra_jax.rl.memory_plan import StepShape

    shards = mesh_sizes["data"] * mesh_sizes["fsdp"]
    rows = config.rl.tasks_per_step * (1 if config.rl.share_prompts else config.rl.group_size)
    micro = config.rl.micro_batch_size
    seq_len = max(config.rl.seq_buckets)
    generated = config.agent.max_turns * config.agent.max_new_tokens_per_turn
    if config.rl.sample_unit == "turn":  # a sample per turn: one turn's tokens are trained
        rows *= config.agent.max_turns
        generated = config.agent.max_new_tokens_per_turn
    loss_tokens = 8
    while loss_tokens < generated and loss_tokens < seq_len:
        loss_tokens *= 2
    if config.rl.pack:  # a packed row's samples can put loss positions all along it
        loss_tokens = seq_len
    num_devices = math.prod(mesh_sizes.values())
    colocated = config.rollout.engine == "jax"
    return StepShape(
        rows=micro,
        seq_len=seq_len,
        loss_tokens=min(loss_tokens, seq_len),
        step_rows=bucket_rows(rows, micro * shards),
        kl_reference=config.rl.kl_coef > 0,
        rollout_kv=(config.rollout.max_batch_size, config.rollout.max_seq_len)
        if colocated
        else None,
        hosts=max(num_devices // device_kind.devices_per_host, 1),
    )


def plan(config, mesh_sizes, device_kind, preset: str = ""):
    """(mesh errors, MemoryPlan or None, header lines) for `config` on the mesh."""
    from orchestra_jax.rl.memory_plan import plan_memory
    from orchestra_jax.training import builders

    num_devices = math.prod(mesh_sizes.values())
    hosts = max(num_devices // device_kind.devices_per_host, 1)
    errors = builders.device_errors(config, num_devices, hosts)
    shape = step_shape(config, mesh_sizes, device_kind)
    mc = model_config(config, preset)
    learner = builders.build_learner_config(config, total_steps=config.num_steps)
    memory = plan_memory(mc, mesh_sizes, learner, shape, device=device_kind)
    if config.rl.share_prompts:
        memory.notes.append("rl.share_prompts: planned as whole episodes (an upper bound)")
    if config.rl.pack:
        memory.notes.append(
            "rl.pack: packed rows planned at the largest bucket with every position a loss "
            "position, and as many rows as samples (upper bounds: packing needs fewer)"
        )
    if config.rl.sample_unit == "turn":
        memory.notes.append(
            "rl.sample_unit=turn: every episode planned at agent.max_turns samples (an upper bound)"
        )
    if config.rollout.engine != "jax":
        memory.notes.append(f"rollouts on {config.rollout.engine} servers, not on these devices")
    mesh_text = " ".join(f"{a}={s}" for a, s in mesh_sizes.items())
    count = _param_count(mc)
    header = [
        f"mesh {mesh_text}: {num_devices} x {device_kind.name} on {hosts} host(s)",
        f"model: {count / 1e6:,.1f}M parameters, params {mc.param_dtype.name}, compute "
        f"{mc.dtype.name}, remat {mc.remat}, scan_layers {mc.scan_layers}",
        f"step: {shape.step_rows} rows, micro-batch {shape.rows} row(s) per device x "
        f"{shape.seq_len} tokens, {shape.loss_tokens} loss positions per row",
    ]
    if mc.lora is not None:
        header.append(
            f"LoRA: rank {mc.lora.rank}, alpha {mc.lora.alpha:g} on {','.join(mc.lora.targets)}: "
            f"{_param_count(mc, adapters=True) / 1e6:,.1f}M adapter parameters train"
        )
    return errors, memory, header


def _param_count(mc, *, adapters: bool = False) -> int:
    """Parameters of the model (base and adapters), or its LoRA adapters alone."""
    import jax
    from flax import nnx

    from orchestra_jax.models.lora import LoRAParam
    from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM

    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(mc, rngs=nnx.Rngs(0)))
    kind = LoRAParam if adapters else nnx.Param
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, kind)))


def main(argv, config_flag, mesh_flag, device_flag, preset_flag) -> int:
    del argv
    from orchestra_jax.rl.memory_plan import DEVICE_KINDS

    if device_flag.value not in DEVICE_KINDS:
        print(f"error: --device must be one of {', '.join(DEVICE_KINDS)}", file=sys.stderr)
        return 2
    try:
        mesh_sizes = parse_mesh(mesh_flag.value or "")
        errors, memory, header = plan(
            config_flag.value, mesh_sizes, DEVICE_KINDS[device_flag.value], preset_flag.value
        )
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(header))
    print("per device:")
    print(memory.report())
    if errors:
        print("the config cannot run on this mesh:\n  " + "\n  ".join(errors))
        return 2
    return 0 if memory.fits else 1


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # shapes only: no accelerator needed
    command_line = _define_flags()
    flags.mark_flags_as_required(["config", "mesh", "device"])
    app.run(lambda argv: sys.exit(main(argv, *command_line)))
