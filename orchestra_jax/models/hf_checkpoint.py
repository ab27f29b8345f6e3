"""Hugging Face Qwen3 checkpoints <-> Qwen3ForCausalLM, one tensor at a time.

Name mapping: our parameter path with its last part renamed to `weight`
(`kernel`, `scale` and `embedding` all become `weight`); kernels are stored
transposed ([in, out] here, [out, in] in torch). With `scan_layers`, the stacked
parameter `model.layers.X` [L, ...] maps to `model.layers.{i}.X` for each layer i.

Loading keeps host memory near the model plus a couple of tensors: each tensor is
read from its file, transposed/cast, and put straight into its (sharded) place.
Saving produces each tensor only while it is being written.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from orchestra_jax.io import paths
from orchestra_jax.models import safetensors_stream as st
from orchestra_jax.models.lora import LoRAParam, initial_adapters
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.parallel.mesh import state_shardings
from orchestra_jax.parallel.multihost import gather_to_host, is_primary

DEFAULT_MAX_SHARD_SIZE = 5 * 1024**3  # bytes; transformers' default shard size.
# Tensors some checkpoints carry that the model recomputes or shares.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def param_entries(state: nnx.State, scanned: bool) -> Iterator[tuple[tuple, str, int | None, bool]]:
    """(state path, HF name, layer index or None, transpose?) for every parameter tensor."""
    for path, variable in nnx.to_flat_state(state):
        if isinstance(variable, LoRAParam):  # adapters: PEFT's files (models/peft_adapter.py)
            continue
        names = [str(p) for p in path]
        leaf = names[-1]
        transpose = leaf == "kernel"
        if scanned and names[:2] == ["model", "layers"]:
            for i in range(variable.shape[0]):
                hf = ".".join(["model", "layers", str(i), *names[2:-1], "weight"])
                yield path, hf, i, transpose
        else:
            yield path, ".".join([*names[:-1], "weight"]), None, transpose


def _to_ours(tensor: np.ndarray, transpose: bool, dtype) -> np.ndarray:
    tensor = tensor.T if transpose else tensor
    return np.ascontiguousarray(tensor, dtype=jnp.dtype(dtype))


@functools.partial(jax.jit, donate_argnums=0)
def _set_layer(stacked: jax.Array, layer: jax.Array, index) -> jax.Array:
    return stacked.at[index].set(layer)


def load_hf_checkpoint(
    path, *, dtype=jnp.float32, mesh=None, compute_dtype=None, seed: int = 0, **runtime
):
    """(model, config) from a folder with config.json and safetensors (single or sharded).

    `dtype` is the parameter dtype and, unless `compute_dtype` is given, the
    compute dtype; other `runtime` keywords (scan_layers, remat, lora) go to the
    config. With a `mesh`, each parameter is placed directly with its partition
    rule. With `lora`, the adapters start fresh (`lora.initial_adapters(seed)`).
    """
    path = paths.as_path(path)
    if "param_dtype" in runtime:
        raise TypeError("pass the parameter dtype as `dtype`, not `param_dtype`")
    runtime = {**runtime, "dtype": compute_dtype or dtype, "param_dtype": dtype}
    config = Qwen3Config.from_hf(path, **runtime)
    refs = st.index_checkpoint(path)
    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: device, state)
    else:
        shardings = state_shardings(state, mesh)
    sharding_of = dict(nnx.to_flat_state(shardings))
    flat = dict(nnx.to_flat_state(state))
    used = set()
    for key, hf_name, layer, transpose in param_entries(state, config.scan_layers):
        if hf_name not in refs:
            raise KeyError(f"checkpoint {path} lacks tensor {hf_name}")
        used.add(hf_name)
        variable, sharding = flat[key], sharding_of[key].get_value()
        tensor = _to_ours(refs[hf_name].read(), transpose, dtype)
        expected = variable.shape[1:] if layer is not None else variable.shape
        if tensor.shape != tuple(expected):
            raise ValueError(f"{hf_name}: checkpoint shape {tensor.shape}, model needs {expected}")
        if layer is None:
            variable.set_value(jax.device_put(tensor, sharding))
            continue
        if layer == 0:
            zeros = jax.jit(
                functools.partial(jnp.zeros, variable.shape, dtype), out_shardings=sharding
            )
            variable.set_value(zeros())
        variable.set_value(_set_layer(variable.get_value(), tensor, layer))
        del tensor
    unused = {
        name
        for name in refs
        if name not in used
        and not name.endswith(_IGNORED_SUFFIXES)
        and not (config.tie_word_embeddings and name == "lm_head.weight")
    }
    if unused:
        raise ValueError(f"checkpoint {path} has tensors the model does not use: {sorted(unused)}")
    adapter_keys = [k for k, v in flat.items() if isinstance(v, LoRAParam)]
    if adapter_keys:
        abstract_adapters = nnx.from_flat_state([(k, flat[k]) for k in adapter_keys])
        adapter_shardings = nnx.from_flat_state([(k, sharding_of[k]) for k in adapter_keys])
        fresh = jax.jit(
            lambda: initial_adapters(abstract_adapters, seed), out_shardings=adapter_shardings
        )()
        for key, variable in nnx.to_flat_state(fresh):
            flat[key].set_value(variable.get_value())
    return nnx.merge(graphdef, nnx.from_flat_state(flat)), config


def save_hf_checkpoint(
    model: Qwen3ForCausalLM,
    config: Qwen3Config,
    path,
    *,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    dtype=None,
) -> list[epath.Path]:
    """Write config.json and safetensors (sharded + index past `max_shard_size` bytes)
    into `path`, a local folder or a `gs://` URI (`orchestra_jax/io/paths.py`).

    Tensors are written in `dtype` (default: the parameters' dtype,
    `config.param_dtype`; weight syncs to a rollout server pass the compute
    dtype). Returns the safetensors files written. transformers'
    Qwen3ForCausalLM.from_pretrained loads them.

    On several hosts every host must call this: each tensor is gathered whole,
    one at a time (cast on its devices first), by every host together, and
    process 0 alone writes the files (the others return []).
    """
    path = paths.as_path(path)
    if jax.tree.leaves(nnx.state(model, LoRAParam)):
        raise ValueError(
            "the model has LoRA adapters, which a Hugging Face checkpoint has no place for: "
            "save them with peft_adapter.save_adapter, or merge them first "
            "(peft_adapter.merge_adapters)"
        )
    state = nnx.state(model, nnx.Param)
    flat = dict(nnx.to_flat_state(state))
    dtype = jnp.dtype(config.param_dtype if dtype is None else dtype)

    def producer(key, layer, transpose):
        def produce():
            value = flat[key].get_value()
            value = value[layer] if layer is not None else value
            host = gather_to_host(value.astype(dtype))
            return np.ascontiguousarray(host.T if transpose else host)

        return produce

    specs = []
    for key, hf_name, layer, transpose in param_entries(state, config.scan_layers):
        shape = flat[key].shape[1:] if layer is not None else flat[key].shape
        shape = tuple(reversed(shape)) if transpose else tuple(shape)
        specs.append(
            st.TensorSpec(hf_name, shape, np.dtype(dtype), producer(key, layer, transpose))
        )
    specs.sort(key=lambda s: _hf_order(s.name))
    if not is_primary():
        for spec in specs:  # the same gathers, in the same order, as process 0's writer
            spec.produce()
        return []
    path.mkdir(parents=True, exist_ok=True)
    files = st.write_checkpoint(path, specs, max_shard_size)
    hf = config.replace(param_dtype=dtype).to_hf_dict()
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    return files


def prune_versions(folder, keep: int = 2) -> list[epath.Path]:
    """Deletes all but the newest `keep` weight versions `v<N>` under `folder` (local
    or `gs://`; weight syncs write one per step); returns the folders removed."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    folder = paths.as_path(folder)
    versions = sorted(
        (int(p.name[1:]), p) for p in folder.glob("v*") if p.is_dir() and p.name[1:].isdigit()
    )
    removed = [p for _, p in versions[:-keep]]
    for p in removed:
        paths.rmtree(p)
    return removed


def _hf_order(name: str) -> tuple:
    """Sort key placing tensors as transformers does: embeddings, layers in order, norm, head."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return (1, int(parts[2]), name)
    return (0 if "embed_tokens" in name else 2, 0, name)
