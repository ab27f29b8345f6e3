"""Qwen3 configuration: Hugging Face `config.json` fields plus runtime (non-HF) settings."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from orchestra_jax.models.attention_kernels import check_attention
from orchestra_jax.models.lora import LoRASpec

REMAT_POLICIES = ("none", "full", "dots")

# Runtime fields: how to run the model here; never written to config.json.
_RUNTIME_FIELDS = (
    "param_dtype",
    "dtype",
    "scan_layers",
    "remat",
    "attention",
    "attention_block_size",
    "lora",
)

_PRESETS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-0.6B config.json.
    "qwen3_0p6b": dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    # Qwen/Qwen3-8B config.json.
    "qwen3_8b": dict(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    # A few-layer test shape; head_dim (16) != hidden / heads (64 / 8) on purpose.
    "tiny": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    ),
    # The CPU demo model (also the learner_step / decode benchmark shape).
    "demo": dict(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
}


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Qwen3 shape (Hugging Face field names) and how to run it.

    `param_dtype` is the storage dtype of weights, `dtype` the compute dtype of
    matmuls and activations; every matmul accumulates in float32, and norms'
    statistics, softmax, RoPE and logits are float32. `scan_layers` stacks
    the layers' weights on a leading axis and runs them with `lax.scan` (fast
    compiles for deep models); `remat` picks what the backward pass recomputes:
    "none", "full" (everything in a layer) or "dots" (keep matmul outputs).
    `attention` names the attention implementation (`attention_kernels.py`:
    "auto", "flash", "xla", "cudnn", "splash" or "module:function") and
    `attention_block_size` the query/key block of the blocked ones. `lora`
    adds LoRA adapters to the projections it names (`models/lora.py`).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    initializer_range: float = 0.02
    # Runtime fields.
    param_dtype: Any = jnp.float32
    dtype: Any = jnp.float32
    scan_layers: bool = False
    remat: str = "none"
    attention: str = "auto"
    attention_block_size: int = 256  # tokens per query / key block (flash attention)
    lora: LoRASpec | None = None  # adapters on the projections it targets (models/lora.py)

    def __post_init__(self):
        if isinstance(self.eos_token_id, list):  # hashable, so jit can key on the config.
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        check_attention(self.attention)
        if self.attention_block_size < 1:
            raise ValueError(f"attention_block_size must be >= 1, got {self.attention_block_size}")

    @property
    def num_kv_groups(self) -> int:
        """Query heads per key/value head (GQA group size)."""
        return self.num_attention_heads // self.num_key_value_heads

    def replace(self, **changes) -> Qwen3Config:
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides) -> Qwen3Config:
        """A named shape ("qwen3_0p6b", "qwen3_8b", "tiny", "demo"), optionally overridden."""
        if name not in _PRESETS:
            raise ValueError(f"unknown Qwen3 preset {name!r}; choose from {sorted(_PRESETS)}")
        return cls(**{**_PRESETS[name], **overrides})

    @classmethod
    def from_hf(cls, config: Mapping[str, Any] | str | os.PathLike, **runtime) -> Qwen3Config:
        """From a `config.json` dict, file, or checkpoint folder (local or `gs://`);
        `runtime` sets dtype etc."""
        if not isinstance(config, Mapping):
            from orchestra_jax.io import paths  # pylint: disable=g-import-not-at-top

            path = paths.as_path(config)
            if path.is_dir():
                path = path / "config.json"
            loaded: Mapping[str, Any] = json.loads(path.read_text())
            config = loaded
        _check_supported(config)
        names = {f.name for f in dataclasses.fields(cls)} - set(_RUNTIME_FIELDS)
        values = {k: v for k, v in config.items() if k in names}
        rope = config.get("rope_parameters") or {}
        if "rope_theta" not in values and "rope_theta" in rope:  # transformers >= 5 layout.
            values["rope_theta"] = rope["rope_theta"]
        if values.get("head_dim") is None:
            values["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
        values.setdefault("num_key_value_heads", config["num_attention_heads"])
        return cls(**values, **runtime)

    def to_hf_dict(self) -> dict[str, Any]:
        """The `config.json` content transformers' Qwen3ForCausalLM loads."""
        values = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in _RUNTIME_FIELDS
        }
        if isinstance(values["eos_token_id"], tuple):
            values["eos_token_id"] = list(values["eos_token_id"])
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **values,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "rope_scaling": None,
            # transformers >= 5 reads rope_parameters; older readers (SGLang) rope_theta.
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.num_hidden_layers,
            "use_cache": True,
            "torch_dtype": jnp.dtype(self.param_dtype).name,
            "dtype": jnp.dtype(self.param_dtype).name,
        }


def _check_supported(config: Mapping[str, Any]) -> None:
    """Reject config.json features this implementation does not compute."""
    model_type = config.get("model_type", "qwen3")
    if model_type != "qwen3":
        raise ValueError(f"expected a qwen3 config, got model_type={model_type!r}")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"only hidden_act='silu' is supported, got {config['hidden_act']!r}")
    if config.get("attention_bias", False):
        raise ValueError("attention_bias=True is not supported (Qwen3 has no biases)")
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if rope and rope.get("rope_type", rope.get("type")) not in (None, "default"):
            raise ValueError(f"{key} {rope!r} is not supported (only default RoPE)")
    if config.get("use_sliding_window", False):
        raise ValueError("use_sliding_window=True is not supported")
