"""A tiny Qwen3 behind the rollout server: OpenAI expert client, SGLang client, weight sync."""

import asyncio

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from orchestra_jax.chat.template import render
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http.sglang_client import SGLangClient
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.rollout.server.app import ServerConfig, load_model, serve_in_thread
from orchestra_jax.tools.experts.client import OpenAIChatExpert


@pytest.fixture(scope="module")
def served():
    tokenizer = load_tokenizer("demo")
    config = Qwen3Config.preset("tiny", vocab_size=tokenizer.vocab_size)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=2,
            max_seq_len=128,
            steps_per_call=8,
            min_prefill_len=32,
            min_cache_len=64,
        ),
    )
    with serve_in_thread(
        engine,
        ServerConfig(model_path="tiny-expert", tokenizer_path="demo"),
        tokenizer=tokenizer,
        weight_loader=lambda path: load_model(path, like=config),
    ) as server:
        yield server, model, tokenizer
    engine.close()


@nnx.jit
def _next_token(model, ids, length):
    """argmax of the logits after the first `length` of ids [1, 64] (one compile)."""
    segments = (jnp.arange(ids.shape[1]) < length).astype(jnp.int32)[None]
    logits = model(ids, jnp.arange(ids.shape[1])[None], segment_ids=segments)
    return jnp.argmax(logits[0, length - 1])


def greedy_continuation(model, ids, steps):
    """`steps` greedy tokens after `ids`, each from a full (uncached) forward."""
    ids = list(ids)
    for _ in range(steps):
        padded = jnp.array([ids + [0] * (64 - len(ids))], jnp.int32)
        ids.append(int(_next_token(model, padded, len(ids))))
    return ids[-steps:]


def test_openai_expert_gets_answer_and_usage(served):
    server, model, tokenizer = served
    messages = [{"role": "user", "content": "What is 2+2?"}]
    expert = OpenAIChatExpert(server.url + "/v1", "tiny-expert", api_key_env=None, retries=0)
    reply = asyncio.run(expert.complete(messages, max_tokens=5, temperature=0.0))
    prompt_ids = tokenizer.encode(render(messages, add_generation_prompt=True))
    expected = greedy_continuation(model, prompt_ids, 5)
    if tokenizer.im_end_id in expected:
        expected = expected[: expected.index(tokenizer.im_end_id) + 1]
    assert reply.prompt_tokens == len(prompt_ids)
    assert reply.completion_tokens == len(expected)
    assert reply.text == tokenizer.decode([t for t in expected if t != tokenizer.im_end_id])


def test_weight_sync_through_hf_checkpoint(served, tmp_path):
    server, model, _ = served
    graphdef, state = nnx.split(model)
    new_model = nnx.merge(
        graphdef, jax.tree.map(lambda x: 0.9 * x[::-1] if x.ndim == 2 else x, state)
    )
    client = SGLangClient(server.url, weights_dir=str(tmp_path))
    prompt = [10, 20, 30]
    request = GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=3))

    async def go():
        try:
            await client.update_weights(new_model, version=2)
            return await client.generate([request]), await client.get_model_info()
        finally:
            await client.aclose()

    [completion], [info] = asyncio.run(go())
    assert (tmp_path / "v2" / "config.json").exists() and info["weight_version"] == "2"
    assert completion.output_ids == greedy_continuation(new_model, prompt, 3)
