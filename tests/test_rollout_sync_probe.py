"""The sync probe through SGLang's endpoints: the project's server (SGLang's protocol)
over a JaxEngine scores the probe with `/generate` (`logprob_start_len=0`) and
reports its weight version; the probe passes the model it serves and stops a run
whose learner holds other weights or another version. (vLLM: tests/test_vllm_server.py;
the probe's own arithmetic: tests/test_rollout_vllm_client.py.)"""

import asyncio

import pytest
from flax import nnx

from orchestra_jax.models.qwen3 import Qwen3ForCausalLM
from orchestra_jax.models.qwen3_config import Qwen3Config
from orchestra_jax.rollout import sync_probe
from orchestra_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig
from orchestra_jax.rollout.server import ServerConfig, serve_in_thread
from orchestra_jax.rollout.sglang_client import SGLangClient


def test_probe_through_sglangs_generate():
    config = Qwen3Config.preset("tiny")
    served, other = (Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed)) for seed in (0, 1))
    engine = JaxEngine(served, JaxEngineConfig(max_batch_size=2, max_seq_len=128))
    with serve_in_thread(engine, ServerConfig(model_path="tiny")) as server:
        client = SGLangClient([server.url, server.url])

        async def go():
            try:
                metrics = await sync_probe.verify_sync(client, served, 0)
                with pytest.raises(sync_probe.SyncNotLanded, match="not the learner's"):
                    await sync_probe.verify_sync(client, other, 0)
                with pytest.raises(sync_probe.SyncNotLanded, match="weight version 0 after"):
                    await sync_probe.verify_sync(client, served, 1)
                return metrics
            finally:
                await client.aclose()

        metrics = asyncio.run(go())
    assert metrics["rollout/sync_logprob_max_abs_diff"] < 1e-4
