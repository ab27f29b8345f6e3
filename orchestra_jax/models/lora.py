"""LoRA adapters on Qwen3's projections, as PEFT defines them.

A targeted projection y = x · W (W [in, out], frozen) becomes

    y = x · W + s · (x · A) · B        A [in, r], B [r, out], s = alpha / r

with A and B `LoRAParam`s (a subclass of `nnx.Param`): `nnx.split(model,
LoRAParam, nnx.Param, ...)` separates the adapters (trained) from the base
(frozen). A starts Kaiming-uniform, U(-1/√in, 1/√in) (PEFT's
`kaiming_uniform_(a=√5)`), B at 0, so a fresh adapter leaves the model
unchanged. Adapters are stored in float32 whatever the base's dtype and
multiplied in the model's compute dtype with float32 accumulation.

Targets are named as PEFT's `target_modules` less the `_proj` suffix: q, k, v,
o (attention), gate, up, down (MLP). Adapter dropout is never applied: an
adapter's `dropout` (PEFT's `lora_dropout`) is the setting it was trained
with, kept so that an adapter folder reads back as written. Dropout is
irrelevant to evaluating, serving and merging an adapter (PEFT's eval mode runs
without it too), so those accept any; training refuses dropout > 0 (the
`Learner`, and `lora.dropout` at start-up), since GRPO's ratio compares the
learner's log-probabilities with the rollout engine's for one network, and
training here never applies it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from orchestra_jax.models.matmul import dense

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
ATTENTION_TARGETS = ("q", "k", "v", "o")


class LoRAParam(nnx.Param):
    """An adapter matrix (A or B); the learner trains these and leaves other Params alone."""


@dataclasses.dataclass(frozen=True)
class LoRASpec:
    """Rank, scale and targets of the adapters (a Qwen3Config runtime field), and the
    dropout they were trained with (recorded, never applied: see the module docstring)."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = LORA_TARGETS
    dropout: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))
        if self.rank < 1:
            raise ValueError(f"lora rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"lora alpha must be > 0, got {self.alpha}")
        unknown = [t for t in self.targets if t not in LORA_TARGETS]
        if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(
                f"lora targets must be distinct names among {LORA_TARGETS}, got {self.targets}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")

    @property
    def scaling(self) -> float:
        """s = alpha / r (PEFT's default, without rsLoRA)."""
        return self.alpha / self.rank


def kaiming_uniform_a(key: jax.Array, in_features: int, rank: int) -> jax.Array:
    """A [in, r] ~ U(-1/√in, 1/√in): torch's kaiming_uniform_(a=√5) on lora_A.weight [r, in]."""
    bound = 1.0 / math.sqrt(in_features)
    return jax.random.uniform(key, (in_features, rank), jnp.float32, -bound, bound)


def has_adapters(model: nnx.Module) -> bool:
    """Whether `model` carries LoRA adapters."""
    return bool(jax.tree.leaves(nnx.state(model, LoRAParam)))


def adapters_off(adapters: Any) -> Any:
    """Adapters with every matrix 0: the model computes its base (s · x · 0 · 0 = 0 exactly)."""
    return jax.tree.map(jnp.zeros_like, adapters)


def initial_adapters(abstract_adapters: Any, seed: int) -> Any:
    """Fresh adapters for an abstract adapter state (e.g. a loaded base's): each A
    Kaiming-uniform from its own key (`seed` folded with the leaf's index), each B 0."""
    flat = nnx.to_flat_state(abstract_adapters)
    values = []
    for i, (path, variable) in enumerate(flat):
        shape = variable.shape
        if str(path[-1]) == "lora_a":
            key = jax.random.fold_in(jax.random.key(seed), i)
            if len(shape) == 3:  # stacked layers [L, in, r]
                keys = jax.random.split(key, shape[0])
                value = jnp.stack([kaiming_uniform_a(k, shape[1], shape[2]) for k in keys])
            else:
                value = kaiming_uniform_a(key, shape[0], shape[1])
        else:
            value = jnp.zeros(shape, jnp.float32)
        values.append((path, variable.replace(value)))
    return nnx.from_flat_state(values)


def lora_delta(x: jax.Array, a: jax.Array, b: jax.Array, scaling: float, dtype) -> jax.Array:
    """s · (x · A) · B in `dtype`, each matmul accumulated in float32."""
    return dense(dense(x, a, dtype), b, dtype) * jnp.asarray(scaling, dtype)


def merged_kernel(kernel: jax.Array, a: jax.Array, b: jax.Array, scaling: float) -> jax.Array:
    """W + s · A · B in float32, returned in W's dtype (stacked layers: leading axes kept)."""
    delta = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32)) * scaling
    return (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)
