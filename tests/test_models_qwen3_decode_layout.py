"""bfloat16 decode reads the tied embedding table as stored: no whole-table copy per call.

The token lookup of a decode step's few ids and the tied LM head over a few rows
(`qwen3_layers.lookup_rows`, `Embed.attend`) must not make XLA materialize a
[V, E] or [E, V] array in the compiled decode call (the uint16 view, a float32
conversion or a transposed copy of the table), and they give the same values as
the general paths.
"""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.benchmarks.xla_trace import materialized
from orchestra_jax.models.qwen3 import layers as qwen3_layers
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.jax import sampling
from orchestra_jax.rollout.jax.decode_steps import DecodeSteps

V, E, B = 2048, 128, 8


def _model():
    config = Qwen3Config.preset(
        "demo",
        vocab_size=V,
        hidden_size=E,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
    ).replace(param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    return Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))


def _decode_hlo(model) -> str:
    graphdef, state = nnx.split(model)
    steps = DecodeSteps(graphdef, max_seq_len=64, cache_dtype=jnp.float32)
    seeds = [sampling.split_seed(i) for i in range(B)]
    args = (
        np.arange(3, 3 + B, dtype=np.int32),  # tokens
        np.full(B, 8, np.int32),  # positions
        np.zeros(B, np.int32),  # counts
        np.zeros(B, bool),  # done
        np.full(B, 100, np.int32),  # max_new
        np.full((B, 8), -1, np.int32),  # stop ids
        np.ones(B, np.float32),  # temperature
        np.ones(B, np.float32),  # top_p
        np.full(B, -1, np.int32),  # top_k
        np.zeros(B, np.float32),  # min_p
        np.array([s[0] for s in seeds], np.uint32),
        np.array([s[1] for s in seeds], np.uint32),
    )
    cache = model.init_cache(B, 64, jnp.float32)
    lowered = steps.decode.lower(state, cache, *args, None, num_steps=4)
    return lowered.compile().as_text()


def test_bf16_decode_call_makes_no_copy_of_the_embedding_table():
    hlo = _decode_hlo(_model())
    assert re.search(rf"bf16\[{V},{E}\]", hlo)  # the table is there, as stored
    assert materialized(hlo, {f"{V},{E}", f"{E},{V}"}) == []


@pytest.mark.parametrize("shape", [(B,), (3, 5), (64,)])
def test_sliced_lookup_equals_the_gather_bit_for_bit(shape):
    embed = _model().model.embed_tokens
    ids = jnp.asarray(np.random.default_rng(0).integers(-V, V, shape), jnp.int32)
    table = embed.embedding[...]
    want = qwen3_layers.from_bits(jnp.take(qwen3_layers.as_bits(table), ids, axis=0), table.dtype)
    got = embed(ids)
    assert got.shape == (*shape, E) and got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_stored_layout_head_equals_dense():
    embed = _model().model.embed_tokens
    x = jnp.asarray(np.random.default_rng(1).normal(size=(B, 1, E)), jnp.bfloat16)
    want = qwen3_layers.dense(
        x, embed.embedding[...], jnp.bfloat16, out_dtype=jnp.float32, w_t=True
    )
    got = embed.attend(x)
    assert got.shape == (B, 1, V) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
