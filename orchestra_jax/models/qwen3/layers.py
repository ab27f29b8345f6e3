"""Qwen3 building blocks: Linear (no bias), Embed, RMSNorm, RoPE and the SwiGLU MLP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from orchestra_jax.models.lora import LoRAParam, kaiming_uniform_a, lora_delta
from orchestra_jax.models.matmul import dense
from orchestra_jax.models.qwen3.config import Qwen3Config


def as_bits(x: jax.Array) -> jax.Array:
    """A 16-bit float array viewed as uint16 (other dtypes unchanged); see `from_bits`.

    XLA's CPU backend has no bfloat16 gather or scatter: it converts the whole
    operand to float32 and back around each one (for a decode step's KV-cache
    writes, every layer's cache, every step). Moving 16-bit floats as uint16 bit
    patterns is exact and keeps them 16-bit.
    """
    if x.dtype.itemsize == 2 and jnp.issubdtype(x.dtype, jnp.floating):
        return jax.lax.bitcast_convert_type(x, jnp.uint16)
    return x


def from_bits(x: jax.Array, dtype) -> jax.Array:
    """The inverse of `as_bits` for an array meant to have `dtype`."""
    if x.dtype == jnp.uint16 and jnp.dtype(dtype) != jnp.uint16:
        return jax.lax.bitcast_convert_type(x, dtype)
    return x


# The most ids `Embed` looks up with one dynamic slice each (a decode step's few
# tokens), and the most rows whose tied-head logits it computes as table · xᵀ,
# for a 16-bit table on XLA's CPU backend (the layouts measured there; elsewhere
# the gather and x · tableᵀ stay).
MAX_SLICED_LOOKUP = 64
MAX_STORED_LAYOUT_HEAD_ROWS = 64


def _cpu_16bit(table: jax.Array) -> bool:
    return table.dtype.itemsize == 2 and jax.default_backend() == "cpu"


def lookup_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """table[ids] ([*ids.shape, E]) as one dynamic slice of the table per id.

    For a 16-bit table and a few ids (a decode step). The `as_bits` gather views
    the whole table as uint16, and XLA hoists that view out of a decode loop: a
    copy of the table once per call (151,936 × 1,024 for Qwen3-0.6B). A bfloat16
    dynamic slice runs in float32 on XLA's CPU backend, which hoists the table's
    conversion the same way; passing the table through an optimization barrier
    with the ids (which change every step) keeps the conversion in the loop, where
    it fuses into each slice and reads only that row. Same values bit for bit;
    negative ids count from the end as in `jnp.take`, ids past the end clamp to
    the last row (`jnp.take` fills those with NaN).
    """
    flat = ids.reshape(-1)
    flat = jnp.where(flat < 0, flat + table.shape[0], flat)
    table, flat = jax.lax.optimization_barrier((table, flat))
    rows = [
        jax.lax.dynamic_index_in_dim(table, flat[i], 0, keepdims=False) for i in range(flat.size)
    ]
    return jnp.stack(rows).reshape(*ids.shape, table.shape[1])


def normal_init(stddev: float):
    """Hugging Face's `_init_weights` for Linear / Embedding: N(0, initializer_range)."""
    return jax.nn.initializers.normal(stddev)


class Linear(nnx.Module):
    """y = x @ kernel, kernel [in, out] (the transpose of torch's `weight`), no bias.

    Computed in `config.dtype` with float32 accumulation (`matmul.dense`), result in
    `config.dtype`. A projection named `target` ("q", …, "down") that `config.lora`
    targets also holds LoRA adapters `lora_a` [in, r], `lora_b` [r, out] and adds
    s · x · A · B (`models/lora.py`).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        config: Qwen3Config,
        *,
        rngs: nnx.Rngs,
        target: str | None = None,
    ):
        init = normal_init(config.initializer_range)
        key = rngs.params()
        self.kernel = nnx.Param(init(key, (in_features, out_features), config.param_dtype))
        self.dtype = config.dtype
        self.lora_scaling: float | None = None
        spec = config.lora
        if spec is not None and target in spec.targets:
            # A's key derives from the kernel's: the base draws what a model without adapters does.
            a = kaiming_uniform_a(jax.random.fold_in(key, 1), in_features, spec.rank)
            self.lora_a = LoRAParam(a)
            self.lora_b = LoRAParam(jnp.zeros((spec.rank, out_features), jnp.float32))
            self.lora_scaling = spec.scaling

    def __call__(self, x: jax.Array) -> jax.Array:
        y = dense(x, self.kernel[...], self.dtype)
        if self.lora_scaling is None:
            return y
        return y + lora_delta(x, self.lora_a[...], self.lora_b[...], self.lora_scaling, self.dtype)


class Embed(nnx.Module):
    """Token embedding table [vocab, hidden]; `attend` gives tied-head logits x @ table^T."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        init = normal_init(config.initializer_range)
        shape = (config.vocab_size, config.hidden_size)
        self.embedding = nnx.Param(init(rngs.params(), shape, config.param_dtype))
        self.dtype = config.dtype

    def __call__(self, ids: jax.Array) -> jax.Array:
        table = self.embedding[...]
        if ids.size <= MAX_SLICED_LOOKUP and _cpu_16bit(table):
            rows = lookup_rows(table, ids)
        else:
            rows = from_bits(jnp.take(as_bits(table), ids, axis=0), table.dtype)  # see as_bits
        return rows.astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """Float32 logits x @ embedding^T, accumulated in float32.

        For a 16-bit table on CPU and at most `MAX_STORED_LAYOUT_HEAD_ROWS` rows (a decode
        step) the product is written table · xᵀ, transposed after: XLA's CPU backend
        then runs it on the table's stored [V, E] layout. Written x · tableᵀ, it
        fuses the dot with the norm before and sampling's scaling after, and for
        that fusion makes a transposed [E, V] copy of the whole table once per
        decode call, and the dot on that layout is slower. The learner's many rows
        keep `dense` (its written-out gradient).
        """
        table = self.embedding[...]
        rows = x.size // x.shape[-1]
        if rows > MAX_STORED_LAYOUT_HEAD_ROWS or not _cpu_16bit(table):
            return dense(x, table, self.dtype, out_dtype=jnp.float32, w_t=True)
        flat = x.reshape(rows, x.shape[-1]).astype(self.dtype)
        dims = (((1,), (1,)), ((), ()))
        logits_t = jax.lax.dot_general(
            table.astype(self.dtype), flat, dims, preferred_element_type=jnp.float32
        )
        return logits_t.T.reshape(*x.shape[:-1], table.shape[0])


class RMSNorm(nnx.Module):
    """y = scale * x / sqrt(mean(x^2) + eps), computed in float32, returned in `dtype`.

    Matches HF: normalise in float32, cast to the compute dtype, then multiply by scale.
    """

    def __init__(self, dim: int, config: Qwen3Config):
        self.scale = nnx.Param(jnp.ones((dim,), config.param_dtype))
        self.eps = config.rms_norm_eps
        self.dtype = config.dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return scale_features(normed.astype(self.dtype), self.scale[...], self.dtype)


@jax.custom_vjp
def _scale_features(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * scale.astype(x.dtype)


def _scale_features_fwd(x, scale):
    return x * scale.astype(x.dtype), (x, scale)


def _scale_features_bwd(residuals, g):
    x, scale = residuals
    dx = (g * scale.astype(g.dtype)).astype(x.dtype)
    rows = (g.astype(jnp.float32) * x.astype(jnp.float32)).reshape(-1, x.shape[-1])
    # dscale = Σ_tokens g ∘ x as a [1, N] · [N, E] matmul: XLA's CPU backend runs this
    # column sum over many tokens as a slow windowed tree reduction otherwise.
    ones = jnp.ones((1, rows.shape[0]), jnp.float32)
    dscale = jnp.dot(ones, rows, preferred_element_type=jnp.float32)[0]
    return dx, dscale.astype(scale.dtype)


_scale_features.defvjp(_scale_features_fwd, _scale_features_bwd)


def scale_features(x: jax.Array, scale: jax.Array, dtype) -> jax.Array:
    """x [..., E] · scale [E] in `dtype`; scale's gradient summed over tokens in float32."""
    return _scale_features(x.astype(dtype), scale)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        e, f = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(e, f, config, rngs=rngs, target="gate")
        self.up_proj = Linear(e, f, config, rngs=rngs, target="up")
        self.down_proj = Linear(f, e, config, rngs=rngs, target="down")

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape [B, T, head_dim / 2] for integer positions [B, T].

    angle[p, i] = p * theta^(-2i / head_dim), i < head_dim / 2 (HF's default RoPE).
    """
    inv_freq = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate halves: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin] (HF `rotate_half`).

    x: [B, T, N, D]; cos/sin: [B, T, D/2]. Computed in float32, returned in x's dtype.
    """
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)
