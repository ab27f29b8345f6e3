"""The policy's config sections: `model` as `ModelConfig` (a Qwen3 preset or a
Hugging Face folder, dtypes, attention) and `lora` as `LoRAConfig`, each checked once."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax.numpy as jnp

from orchestra_jax.config_section import Section, split_list
from orchestra_jax.models.attention_kernels import ATTENTION
from orchestra_jax.models.lora import LORA_TARGETS, LoRASpec
from orchestra_jax.models.qwen3.config import Qwen3Config

# The dtype names a config may give (model.param_dtype, model.dtype, rl.reference_dtype).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """`model.*`: exactly one of `preset` and `hf_path`; `overrides` are Qwen3Config
    fields over the preset."""

    SECTION = "model"

    preset: str = ""
    hf_path: str = ""
    param_dtype: str = "float32"
    dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"
    attention: str = "auto"
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    def problems(self) -> list[str]:
        errors = []
        if bool(self.preset) == bool(self.hf_path):
            errors.append(
                "model: set exactly one of model.preset and model.hf_path "
                f"(got preset={self.preset!r}, hf_path={self.hf_path!r})"
            )
        if self.preset:
            try:
                Qwen3Config.preset(self.preset)
            except (KeyError, ValueError) as e:
                errors.append(f"model.preset: {e}")
        if self.hf_path and not os.path.isfile(os.path.join(self.hf_path, "config.json")):
            errors.append(f"model.hf_path: no config.json in {self.hf_path!r}")
        errors += self.choice("param_dtype", DTYPES)
        errors += self.choice("dtype", DTYPES)
        errors += self.choice("attention", ATTENTION)
        return errors


@dataclasses.dataclass(frozen=True)
class LoRAConfig(Section):
    """`lora.*`: rank 0 trains every weight; rank > 0 trains adapters of that rank on
    the projections `targets` names (models/lora.py)."""

    SECTION = "lora"

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: str = "q,k,v,o,gate,up,down"

    def problems(self) -> list[str]:
        if self.rank < 0:
            return [f"lora.rank must be >= 0 (0: full fine-tuning), got {self.rank}"]
        if not self.rank:
            return []
        errors = []
        if self.alpha <= 0:
            errors.append(f"lora.alpha must be > 0, got {self.alpha}")
        targets = split_list(self.targets)
        unknown = [t for t in targets if t not in LORA_TARGETS]
        if unknown or not targets or len(set(targets)) != len(targets):
            errors.append(
                f"lora.targets must be distinct names among {','.join(LORA_TARGETS)}, "
                f"got {self.targets!r}"
            )
        if self.dropout != 0:
            errors.append(
                f"lora.dropout={self.dropout}: adapters run without dropout here (GRPO's "
                "ratio compares the learner's and the engine's log-probabilities of one "
                "network); set lora.dropout=0"
            )
        return errors

    def spec(self) -> LoRASpec | None:
        """The adapters' spec, or None when `rank` is 0."""
        if not self.rank:
            return None
        return LoRASpec(
            rank=self.rank,
            alpha=float(self.alpha),
            targets=tuple(split_list(self.targets)),
            dropout=float(self.dropout),
        )
