"""Decode with bf16 weights: the KV cache's dtype, and tokens equal to a full forward."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig, default_cache_dtype


def test_cache_dtype_default_is_float32_on_cpu_unless_named():
    assert jax.default_backend() == "cpu"
    assert default_cache_dtype(jnp.bfloat16) == jnp.float32
    assert default_cache_dtype(jnp.bfloat16, "bfloat16") == jnp.bfloat16


def test_bf16_weights_greedy_decode_equals_full_forward():
    """Greedy tokens of the engine (bf16 weights, float32 cache) are the argmax of the
    same bf16 model's full forward over prompt + generated tokens."""
    config = Qwen3Config.preset("tiny", param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    engine = JaxEngine(model, JaxEngineConfig(max_batch_size=2, max_seq_len=64))
    try:
        prompt = [5, 9, 17, 3, 44, 8]
        request = GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=6))
        [completion] = asyncio.run(engine.generate([request]))
    finally:
        engine.close()
    ids = prompt + list(completion.output_ids)
    positions = np.arange(len(ids))[None]
    logits = model(jnp.asarray([ids]), jnp.asarray(positions))
    want = np.asarray(jnp.argmax(logits[0, len(prompt) - 1 : -1], axis=-1))
    np.testing.assert_array_equal(np.asarray(completion.output_ids), want)
