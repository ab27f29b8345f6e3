"""Weight sync by LoRA adapter through SGLang's LoRA endpoints, end to end against the
project's server (`rollout/server/app.py` over a JaxEngine whose model carries adapters):
each sync loads the policy's adapter as a PEFT folder under a versioned name
(`/load_lora_adapter`), requests name it (`lora_path`), the sync probe checks the
served log-probs against the learner's with adapters on, older adapters are
unloaded. (vLLM: tests/test_vllm_server.py.)"""

import asyncio
import json
import os
import urllib.error
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.lora import LoRAParam, LoRASpec
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.sglang_client import RolloutServerError, SGLangClient
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.rollout.server.app import serve_in_thread

CONFIG = Qwen3Config.preset("tiny", lora=LoRASpec(rank=4, alpha=8.0))


def randomise_adapters(model, seed):
    rng = np.random.default_rng(seed)
    nnx.update(
        model,
        nnx.from_flat_state(
            [
                (k, v.replace(jnp.asarray(0.2 * rng.standard_normal(v.shape), jnp.float32)))
                for k, v in nnx.to_flat_state(nnx.state(model, LoRAParam))
            ]
        ),
    )


def post(url, body):
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_sglang_adapter_sync_against_the_projects_server(tmp_path):
    learner = Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(0))
    engine = JaxEngine(  # the same base, fresh adapters (B = 0)
        Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(0)),
        JaxEngineConfig(max_batch_size=2, max_seq_len=128),
    )
    prompt = [5, 9, 33, 7]
    request = GenerateRequest(prompt, SamplingParams(temperature=1.0, max_new_tokens=4, seed=1))
    with serve_in_thread(engine) as server:
        client = SGLangClient(server.url, weights_dir=str(tmp_path), model_config=CONFIG)

        async def go():
            try:
                await client.update_weights(learner, version=0)  # fresh adapters: the base
                diffs = [client.sync_metrics()["rollout/sync_logprob_max_abs_diff"]]
                outs = []
                for version, seed in ((1, 1), (2, 2)):
                    randomise_adapters(learner, seed)
                    await client.update_weights(learner, version=version)
                    diffs.append(client.sync_metrics()["rollout/sync_logprob_max_abs_diff"])
                    [out] = await client.generate([request])
                    outs.append(out)
                return diffs, outs
            finally:
                await client.aclose()

        diffs, outs = asyncio.run(go())
        stale = post(server.url + "/generate", {"input_ids": prompt, "lora_path": "policy-v1"})
        adapters = list(server.server._adapters)
    assert max(diffs) < 1e-4  # every sync landed, base included
    assert [o.weight_version for o in outs] == [1, 2]
    ids = prompt + list(outs[1].output_ids)
    logits = learner(jnp.asarray([ids[:-1]]), jnp.arange(len(ids) - 1)[None])[0]
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    want = [logp[len(prompt) - 1 + i, t] for i, t in enumerate(outs[1].output_ids)]
    np.testing.assert_allclose(outs[1].logprobs, want, atol=1e-4)  # the second adapter's
    assert stale[0] == 400 and "policy-v1" in stale[1]["error"]["message"]  # replaced
    assert adapters == ["policy-v1", "policy-v2"]  # policy-v0 unloaded
    assert sorted(os.listdir(tmp_path)) == ["v1", "v2"]
    assert sorted(os.listdir(tmp_path / "v2")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


def test_a_server_without_adapters_refuses_an_adapter_sync(tmp_path):
    base = Qwen3Config.preset("tiny")
    engine = JaxEngine(
        Qwen3ForCausalLM(base, rngs=nnx.Rngs(0)), JaxEngineConfig(max_batch_size=2, max_seq_len=64)
    )
    with serve_in_thread(engine) as server:
        client = SGLangClient(
            server.url, weights_dir=str(tmp_path), settings=ServerPoolSettings(max_retries=0)
        )

        async def go():
            try:
                await client.update_weights(Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(0)), version=1)
            finally:
                await client.aclose()

        with pytest.raises(RolloutServerError, match="adapter policy-v1"):
            asyncio.run(go())
