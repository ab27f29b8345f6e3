"""Qwen3 causal language model in Flax NNX, matching Hugging Face's `Qwen3ForCausalLM`.

Parameter tree (kernels are [in, out], the transpose of torch's `weight`):
    model.embed_tokens.embedding                  [V, E]
    model.layers[i].self_attn.{q,k,v,o}_proj.kernel
    model.layers[i].self_attn.{q,k}_norm.scale    [D]
    model.layers[i].mlp.{gate,up,down}_proj.kernel
    model.layers[i].{input,post_attention}_layernorm.scale
    model.norm.scale
    lm_head.kernel                                [E, V]   (absent when tied)
With `scan_layers`, `model.layers` is one layer whose parameters carry a leading
[num_hidden_layers] axis and the stack runs under `lax.scan`, except when decoding
with a KV cache: the cache holds one array per layer (`qwen3_cache`), so the
layers then run one by one over static slices of the stacked weights (a copy of
the weights per call; serve with scan_layers=False where decode speed matters).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from orchestra_jax.models.attention_mask import AttentionMask
from orchestra_jax.models.matmul import dense
from orchestra_jax.models.qwen3.attention import Attention
from orchestra_jax.models.qwen3.cache import KVCache
from orchestra_jax.models.qwen3.config import Qwen3Config
from orchestra_jax.models.qwen3.layers import MLP, Embed, Linear, RMSNorm, rope_tables
from orchestra_jax.parallel.axes import constrain_batch
from orchestra_jax.parallel.mesh import state_shardings

__all__ = ["KVCache", "Qwen3Config", "Qwen3ForCausalLM", "count_params", "create_sharded_model"]

_REMAT_POLICY = {
    "full": None,  # save nothing inside a layer: recompute all of it in the backward pass.
    "dots": jax.checkpoint_policies.checkpoint_dots,
}


class DecoderLayer(nnx.Module):
    """Pre-norm block: x += attn(norm(x)); x += mlp(norm(x))."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(config.hidden_size, config)
        self.self_attn = Attention(config, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x, cos, sin, mask, cache=None):
        x = constrain_batch(x)  # keep FSDP activations split by batch (parallel/axes.py)
        h, cache_k, cache_v = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, cache_k, cache_v


def _stack_layers(config: Qwen3Config, rngs: nnx.Rngs) -> DecoderLayer:
    """One DecoderLayer whose every parameter has a leading [num_layers] axis."""
    layers = [DecoderLayer(config, rngs=rngs) for _ in range(config.num_hidden_layers)]
    graphdef, _ = nnx.split(layers[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(layer) for layer in layers])
    return nnx.merge(graphdef, stacked)


class Qwen3Model(nnx.Module):
    """Embedding, decoder stack and final norm (HF's `Qwen3Model`)."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        self.config = config
        self.embed_tokens = Embed(config, rngs=rngs)
        # One stacked DecoderLayer (scan_layers) or a list of them.
        self.layers: Any
        if config.scan_layers:
            self.layers = _stack_layers(config, rngs)
        else:
            self.layers = nnx.List(
                [DecoderLayer(config, rngs=rngs) for _ in range(config.num_hidden_layers)]
            )
        self.norm = RMSNorm(config.hidden_size, config)

    def _layer_fn(self, graphdef, kv_len):
        """Pure (layer_state, x, cos, sin, mask, ck, cv, slots) -> (x, ck, cv), rematted."""

        def apply(state, x, cos, sin, mask, cache_k, cache_v, slots):
            layer = nnx.merge(graphdef, state)
            cache = None if cache_k is None else (cache_k, cache_v, slots, kv_len)
            return layer(x, cos, sin, mask, cache)

        if self.config.remat == "none":
            return apply
        return jax.checkpoint(apply, policy=_REMAT_POLICY[self.config.remat])

    def __call__(self, input_ids, cos, sin, mask, cache_k, cache_v, slots, kv_len):
        """Final normed hidden states and the updated per-layer caches (tuples, or None).

        Stacked layers run under `lax.scan` without a cache (training). With a
        cache they run one by one over static slices of the stacked weights, since
        each layer's cache is its own array (see `qwen3_cache`).
        """
        x = self.embed_tokens(input_ids)
        if self.config.scan_layers and cache_k is None:
            graphdef, state = nnx.split(self.layers)
            apply = self._layer_fn(graphdef, kv_len)

            def body(x, layer_state):
                x, _, _ = apply(layer_state, x, cos, sin, mask, None, None, slots)
                return x, None

            x, _ = jax.lax.scan(body, x, state)
            return self.norm(x), None, None
        if self.config.scan_layers:
            graphdef, stacked = nnx.split(self.layers)
            layers = [
                (graphdef, jax.tree.map(lambda p, i=i: p[i], stacked))
                for i in range(self.config.num_hidden_layers)
            ]
        else:
            layers = [nnx.split(layer) for layer in self.layers]
        new_k, new_v = [], []
        for i, (graphdef, state) in enumerate(layers):
            apply = self._layer_fn(graphdef, kv_len)
            ck = None if cache_k is None else cache_k[i]
            cv = None if cache_v is None else cache_v[i]
            x, ck, cv = apply(state, x, cos, sin, mask, ck, cv, slots)
            new_k.append(ck)
            new_v.append(cv)
        if cache_k is None:
            return self.norm(x), None, None
        return self.norm(x), tuple(new_k), tuple(new_v)


class Qwen3ForCausalLM(nnx.Module):
    """Qwen3 with a language-model head; see the module docstring for the parameter tree."""

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        self.config = config
        self.model = Qwen3Model(config, rngs=rngs)
        if not config.tie_word_embeddings:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, config, rngs=rngs)

    def init_cache(self, batch_size: int, max_len: int, dtype=None) -> KVCache:
        """A zeroed KVCache (see `qwen3_cache` for its layout; dtype: compute dtype)."""
        c = self.config
        return KVCache.zeros(
            c.num_hidden_layers,
            batch_size,
            c.num_key_value_heads,
            max_len,
            c.head_dim,
            c.dtype if dtype is None else dtype,
        )

    def head_weight(self) -> tuple[jax.Array, bool]:
        """(LM head weight, tied): the [E, V] kernel, or the [V, E] embedding table when tied."""
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.embedding[...], True
        return self.lm_head.kernel[...], False

    def logits(self, hidden):
        """Float32 logits [..., V] from final hidden states [..., H] (the LM head)."""
        c = self.config
        if c.tie_word_embeddings:
            return self.model.embed_tokens.attend(hidden)
        return dense(hidden, self.lm_head.kernel[...], c.dtype, out_dtype=jnp.float32)

    def rope_table(self, length: int) -> tuple[jax.Array, jax.Array]:
        """cos, sin [length, head_dim / 2] for positions 0 .. length - 1 (see `hidden_states`)."""
        c = self.config
        return rope_tables(jnp.arange(length, dtype=jnp.int32), c.head_dim, c.rope_theta)

    def hidden_states(
        self,
        input_ids,
        positions,
        *,
        segment_ids=None,
        prefix_segment_ids=None,
        cache=None,
        kv_len=None,
        rope_table=None,
    ):
        """Final normed hidden states [B, T, H]; with a cache, (hidden, new_cache).

        `logits(hidden_states(...))` is `__call__` (arguments as there); a learner
        that needs only some positions' logits, or a prefill that needs only each
        prompt's last one, gathers those first and skips most of the [B, T, V] head.
        `rope_table` (from `rope_table(n)`, every position < n) replaces the
        rotary angles' cos/sin by a lookup, with the same values: XLA fuses the
        tables into each layer's q and k rotation and so evaluates cos and sin
        once per element of q and k; a decode loop computes the table once,
        outside the loop. `prefix_segment_ids` (no cache): the segment of a shared
        prefix each token also attends to (`AttentionMask.causal`).
        """
        _check_inputs(input_ids, positions)
        c = self.config
        if rope_table is None:
            cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        else:
            cos, sin = (jnp.take(t, positions, axis=0, mode="clip") for t in rope_table)
        if cache is None:
            if kv_len is not None:
                raise ValueError("kv_len only applies when a cache is given")
            seg = jnp.ones_like(input_ids) if segment_ids is None else segment_ids
            mask = AttentionMask.causal(seg, prefix_segment_ids)
            x, _, _ = self.model(input_ids, cos, sin, mask, None, None, None, None)
            return x
        if prefix_segment_ids is not None:
            raise ValueError("prefix_segment_ids apply without a cache only")
        kv_len = cache.max_len if kv_len is None else int(kv_len)
        if not 0 < kv_len <= cache.max_len:
            raise ValueError(f"kv_len must be in (0, {cache.max_len}], got {kv_len}")
        mask = AttentionMask.cache(positions, kv_len, segment_ids)
        slots = (
            positions
            if segment_ids is None
            else jnp.where(segment_ids != 0, positions, cache.max_len)
        )  # out of range: dropped.
        x, cache_k, cache_v = self.model(input_ids, cos, sin, mask, cache.k, cache.v, slots, kv_len)
        assert cache_k is not None and cache_v is not None  # a cache in, a cache out
        return x, KVCache(cache_k, cache_v)

    def __call__(
        self,
        input_ids,
        positions,
        *,
        segment_ids=None,
        prefix_segment_ids=None,
        cache=None,
        kv_len=None,
        rope_table=None,
    ):
        """Float32 logits [B, T, V] for int32 input_ids / positions [B, T].

        Without a cache: `segment_ids` [B, T] (0 = padding) keeps packed sequences
        apart; attention is causal within a segment, and `prefix_segment_ids` [B, T]
        (0: none) names a shared prefix's segment each token also sees. With `cache`: each token is
        written to slot `positions[b, t]` of row b and attends to slots
        s <= positions[b, t] and s < kv_len (a static int, default the cache length,
        so cost follows the current length bucket; it must exceed every position in
        the call); here `segment_ids` only marks padding (0), whose keys are not
        written, and packing is not supported. Returns (logits, new_cache) then.
        `rope_table`: see `hidden_states`.
        """
        out = self.hidden_states(
            input_ids,
            positions,
            segment_ids=segment_ids,
            prefix_segment_ids=prefix_segment_ids,
            cache=cache,
            kv_len=kv_len,
            rope_table=rope_table,
        )
        if cache is None:
            return self.logits(out)
        hidden, cache = out
        return self.logits(hidden), cache


def _check_inputs(input_ids, positions) -> None:
    if input_ids.ndim != 2 or positions.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and positions must both be [B, T]; got {input_ids.shape} and "
            f"{positions.shape}"
        )


def count_params(config: Qwen3Config) -> int:
    """Number of parameters of `config`'s model, computed abstractly (no memory used)."""
    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def create_sharded_model(
    config: Qwen3Config, mesh: jax.sharding.Mesh, *, seed: int = 0
) -> Qwen3ForCausalLM:
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
