"""LoRA adapters in PEFT's format: save, load, and merge into a Hugging Face folder.

A PEFT LoRA folder holds `adapter_config.json` (peft_type "LORA", r,
lora_alpha, target_modules, …) and `adapter_model.safetensors`, one pair of
tensors per adapted projection, named after the PEFT-wrapped model:

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]

(torch's [out, in] layout: our A [in, r] and B [r, out] transposed). PEFT's
`PeftModel.from_pretrained`, vLLM's and SGLang's LoRA loaders read this. What
this module does not compute is refused on load (rsLoRA, DoRA, per-module
ranks or alphas, biases, modules_to_save, a subset of layers).

    python -m orchestra_jax.models.peft_adapter --base=<hf folder> \\
        --adapter=<peft folder> --out=<hf folder>      # W + s·A·B, a plain checkpoint
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from orchestra_jax.io import paths
from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint, save_hf_checkpoint
from orchestra_jax.models.lora import LoRAParam, LoRASpec, merged_kernel
from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM
from orchestra_jax.parallel.multihost import gather_to_host, is_primary

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model"
_PEFT_NAME = {"lora_a": "lora_A", "lora_b": "lora_B"}
# adapter_config.json settings this module's LoRA does not compute, and the value
# each must have (absent is fine).
_MUST_BE = {
    "use_rslora": False,
    "use_dora": False,
    "fan_in_fan_out": False,
    "bias": "none",
    "modules_to_save": None,
    "layers_to_transform": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "lora_bias": False,
}


def module_name(target: str) -> str:
    """PEFT's target_modules entry of a target: "q" -> "q_proj"."""
    return f"{target}_proj"


def adapter_config(spec: LoRASpec, base_model_name_or_path: str | None = None) -> dict[str, Any]:
    """The adapter_config.json of `spec` (fields PEFT and vLLM read)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(module_name(t) for t in spec.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def read_spec(folder) -> LoRASpec:
    """The LoRASpec of a PEFT adapter folder; ValueError naming what is not supported."""
    path = paths.as_path(folder) / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: not a PEFT adapter folder")
    config = json.loads(path.read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{path}: peft_type {config.get('peft_type')!r}, expected 'LORA'")
    wrong = {
        k: config[k]
        for k, v in _MUST_BE.items()
        if k in config and (config[k] or None) != (v or None)
    }
    if wrong:
        raise ValueError(f"{path}: unsupported LoRA settings {wrong} (supported: {_MUST_BE})")
    modules = config.get("target_modules")
    if isinstance(modules, str) or not modules:
        raise ValueError(f"{path}: target_modules must be a list of names, got {modules!r}")
    targets = []
    for name in modules:
        if not name.endswith("_proj"):
            raise ValueError(f"{path}: target module {name!r} is not a Qwen3 projection")
        targets.append(name.removesuffix("_proj"))
    order = [t for t in ("q", "k", "v", "o", "gate", "up", "down") if t in targets]
    return LoRASpec(
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        targets=tuple(order) + tuple(t for t in targets if t not in order),
        dropout=float(config.get("lora_dropout", 0.0)),
    )


def _entries(state: nnx.State, scanned: bool) -> Iterator[tuple[tuple, str, int | None]]:
    """(state path, PEFT tensor name, layer index or None) for every adapter matrix."""
    for path, variable in nnx.to_flat_state(state):
        names = [str(p) for p in path]
        leaf = _PEFT_NAME[names[-1]]
        if scanned and names[:2] == ["model", "layers"]:
            for i in range(variable.shape[0]):
                parts = ["model", "layers", str(i), *names[2:-1], leaf, "weight"]
                yield path, ".".join([_PREFIX, *parts]), i
        else:
            yield path, ".".join([_PREFIX, *names[:-1], leaf, "weight"]), None


def adapter_tensors(model: Qwen3ForCausalLM) -> dict[str, np.ndarray]:
    """Every adapter matrix of `model` by its PEFT name, in torch's layout, float32.

    On several hosts every host must call this (each matrix is gathered whole)."""
    state = nnx.state(model, LoRAParam)
    flat = dict(nnx.to_flat_state(state))
    if not flat:
        raise ValueError("the model has no LoRA adapters (model config's lora is None)")
    out = {}
    for key, name, layer in _entries(state, model.config.scan_layers):
        value = flat[key].get_value()
        value = value[layer] if layer is not None else value
        out[name] = np.ascontiguousarray(gather_to_host(value.astype(jnp.float32)).T)
    return out


def save_adapter(model: Qwen3ForCausalLM, folder, *, base_model_name_or_path=None) -> None:
    """Writes `model`'s adapters as a PEFT folder (local or `gs://`); on several hosts
    every host calls it and process 0 writes."""
    spec = model.config.lora
    if spec is None:
        raise ValueError("the model has no LoRA adapters (model config's lora is None)")
    tensors = adapter_tensors(model)
    if not is_primary():
        return
    folder = paths.as_path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / WEIGHTS_FILE).write_bytes(save_safetensors(tensors, metadata={"format": "pt"}))
    config = adapter_config(spec, base_model_name_or_path)
    paths.write_text_atomic(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")


def read_adapter_tensors(folder) -> dict[str, np.ndarray]:
    """The tensors of a PEFT adapter folder, by name (float32)."""
    path = paths.as_path(folder) / WEIGHTS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: not a PEFT adapter folder")
    return {k: np.asarray(v, np.float32) for k, v in load_safetensors(path.read_bytes()).items()}


def adapter_state(model: Qwen3ForCausalLM, folder) -> nnx.State:
    """The adapter state of the folder's adapter, shaped and placed as `model`'s.

    The folder's LoRA settings must be the model's (rank, alpha, targets); every
    tensor must be there with its shape, and none besides."""
    spec = model.config.lora
    if spec is None:
        raise ValueError("the model has no LoRA adapters to load into (model config's lora)")
    theirs = read_spec(folder)
    if (theirs.rank, theirs.alpha, set(theirs.targets)) != (
        spec.rank,
        spec.alpha,
        set(spec.targets),
    ):
        raise ValueError(
            f"adapter {folder} has r={theirs.rank}, alpha={theirs.alpha}, targets "
            f"{sorted(theirs.targets)}; the model's lora is r={spec.rank}, alpha={spec.alpha}, "
            f"targets {sorted(spec.targets)}"
        )
    tensors = read_adapter_tensors(folder)
    state = nnx.state(model, LoRAParam)
    flat = dict(nnx.to_flat_state(state))
    values: dict[tuple, Any] = {}
    used = set()
    for key, name, layer in _entries(state, model.config.scan_layers):
        if name not in tensors:
            raise KeyError(f"adapter {folder} lacks tensor {name}")
        used.add(name)
        tensor = tensors[name].T
        variable = flat[key]
        expected = variable.shape[1:] if layer is not None else variable.shape
        if tensor.shape != tuple(expected):
            raise ValueError(
                f"{name}: adapter shape {tensor.shape[::-1]}, model needs {expected[::-1]}"
            )
        if layer is None:
            values[key] = tensor
        else:
            values.setdefault(key, np.zeros(variable.shape, np.float32))[layer] = tensor
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"adapter {folder} has tensors the model does not use: {unused}")
    return nnx.from_flat_state(
        [
            (
                k,
                flat[k].replace(
                    jax.device_put(values[k].astype(flat[k].dtype), flat[k].get_value().sharding)
                ),
            )
            for k in flat
        ]
    )


def load_adapter(model: Qwen3ForCausalLM, folder) -> None:
    """Sets `model`'s adapters to the PEFT folder's (see `adapter_state`)."""
    nnx.update(model, adapter_state(model, folder))


def merge_adapters(model: Qwen3ForCausalLM) -> Qwen3ForCausalLM:
    """A model without adapters whose kernels are W + s · A · B (in the base's dtype)."""
    spec = model.config.lora
    if spec is None:
        raise ValueError("the model has no LoRA adapters to merge")
    config = model.config.replace(lora=None)
    graphdef, base = nnx.split(nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))))
    ours = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    merged = []
    for key, variable in nnx.to_flat_state(base):
        value = ours[key].get_value()
        if key[-1] == "kernel" and key[:-1] + ("lora_a",) in ours:
            a, b = (
                ours[key[:-1] + ("lora_a",)].get_value(),
                ours[key[:-1] + ("lora_b",)].get_value(),
            )
            value = jax.jit(merged_kernel, static_argnums=3)(value, a, b, spec.scaling)
        merged.append((key, variable.replace(value)))
    return nnx.merge(graphdef, nnx.from_flat_state(merged))


def merge_to_hf(base, adapter, out, *, dtype=None) -> None:
    """Writes the Hugging Face checkpoint of base + adapter merged (`merge_adapters`)
    into `out`; `dtype` (a name) defaults to the base's stored dtype."""
    config = json.loads((paths.as_path(base) / "config.json").read_text())
    stored = jnp.dtype(dtype or config.get("torch_dtype") or config.get("dtype") or "float32")
    model, _ = load_hf_checkpoint(base, dtype=jnp.float32, lora=read_spec(adapter))
    load_adapter(model, adapter)
    merged = merge_adapters(model)
    save_hf_checkpoint(merged, merged.config, out, dtype=stored)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description="Merge a PEFT LoRA adapter into a Qwen3 checkpoint."
    )
    parser.add_argument("--base", required=True, help="Hugging Face Qwen3 folder")
    parser.add_argument("--adapter", required=True, help="PEFT LoRA folder")
    parser.add_argument("--out", required=True, help="folder for the merged checkpoint")
    parser.add_argument("--dtype", default=None, help="stored dtype (default: the base's)")
    args = parser.parse_args(argv)
    merge_to_hf(args.base, args.adapter, args.out, dtype=args.dtype)


__all__ = [
    "adapter_config",
    "adapter_state",
    "load_adapter",
    "merge_adapters",
    "merge_to_hf",
    "read_spec",
    "save_adapter",
]

if __name__ == "__main__":
    main()
