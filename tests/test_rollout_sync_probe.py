"""The sync probe through SGLang's endpoints: the project's server (SGLang's protocol)
over a JaxEngine scores the probe with `/generate` (`logprob_start_len=0`) and
reports its weight version; a sync of the learner's model passes the probe
(`verify_weights`), which refuses a server whose weights or version are not the
learner's. (vLLM: tests/test_vllm_server.py; the probe's own arithmetic and a
server taken out: tests/test_rollout_vllm_client.py.)"""

import asyncio

import pytest
from flax import nnx

from orchestra_jax.models.qwen3.config import Qwen3Config
from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM
from orchestra_jax.rollout.http import sync_probe
from orchestra_jax.rollout.http.sglang_client import SGLangClient
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.rollout.server.app import ServerConfig, load_model, serve_in_thread


def test_probe_through_sglangs_generate(tmp_path):
    config = Qwen3Config.preset("tiny")
    served, other = (Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed)) for seed in (0, 1))
    engine = JaxEngine(served, JaxEngineConfig(max_batch_size=2, max_seq_len=128))
    loader = lambda path: load_model(path, like=config)  # noqa: E731
    with serve_in_thread(engine, ServerConfig(model_path="tiny"), weight_loader=loader) as server:
        client = SGLangClient(server.url, weights_dir=str(tmp_path))

        async def go():
            try:
                await client.update_weights(served, version=1)
                metrics = client.sync_metrics()
                client._probe = client._make_probe(other, config, 1)  # a learner on other weights
                with pytest.raises(sync_probe.SyncNotLanded, match="not the learner's"):
                    await client.verify_weights(server.url, 1)
                with pytest.raises(sync_probe.SyncNotLanded, match="weight version '1' after"):
                    await client.verify_weights(server.url, 2)
                return metrics
            finally:
                await client.aclose()

        metrics = asyncio.run(go())
    assert metrics["rollout/sync_logprob_max_abs_diff"] < 1e-4
