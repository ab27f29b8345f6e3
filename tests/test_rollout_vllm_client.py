"""VLLMClient's wire format and error paths, against a loopback aiohttp server that
answers as vLLM 0.32.0 does (field names and shapes read from its OpenAI server),
or fails on purpose. The real server: tests/test_vllm_server.py."""

import asyncio
import json
import logging
import os

import jax.numpy as jnp
import numpy as np
import pytest
from aiohttp import web
from flax import nnx

from orchestra_jax.models.lora import LoRASpec
from orchestra_jax.models.qwen3.config import Qwen3Config
from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http import sync_probe
from orchestra_jax.rollout.http import vllm_protocol as proto
from orchestra_jax.rollout.http.client import RolloutServerError, ServerUnreachable
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.vllm_client import VLLMClient
from tests.live_helpers import free_port

CONFIG = Qwen3Config.preset("tiny")


def reply(tokens, logprobs, reason="length", stop=None, prompt_logprobs=None, top=None):
    choice = {
        "index": 0,
        "text": "",
        "token_ids": tokens,
        "finish_reason": reason,
        "stop_reason": stop,
        "logprobs": {
            "token_logprobs": logprobs,
            "tokens": [f"token_id:{t}" for t in tokens],
            "top_logprobs": top,
        },
        "prompt_logprobs": prompt_logprobs,
    }
    usage = {"prompt_tokens": 3, "completion_tokens": len(tokens), "prompt_tokens_details": None}
    return {"choices": [choice], "usage": usage}


class FakeVLLM:
    """A loopback server with vLLM's endpoints; `completions` answers /v1/completions,
    `model` (shifted by `probe_error`) the sync probe (a request for prompt log-probs)."""

    def __init__(
        self, completions=None, *, info=None, dev_mode=True, model=None, probe_error=0.0, port=0
    ):
        self.port = port  # 0: any free port
        self.calls: list[tuple[str, object]] = []
        self.model, self.probe_error = model, probe_error
        self.completions = completions or (lambda body: reply([5, 6], [-0.5, -1.5]))
        self.version = "default"
        model = {"logprobs_mode": "processed_logprobs", "dtype": "torch.float32", "model": ""}
        self.info = info if info is not None else {"vllm_config": {"model_config": model}}
        self.dev_mode = dev_mode
        self.reload_gate: asyncio.Event | None = None

    async def __aenter__(self):
        app = web.Application()
        app.router.add_get("/v1/models", self._json(lambda b: {"data": [{"id": "m"}]}))
        app.router.add_get("/health", self._json(lambda b: {}))
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/pause", self._json(lambda b: {"status": "paused"}))
        app.router.add_post("/resume", self._json(lambda b: {"status": "resumed"}))
        app.router.add_post("/update_weight_version", self._json(self._set_version))
        app.router.add_get("/weight_info", self._json(lambda b: {"weight_version": self.version}))
        app.router.add_post("/v1/load_lora_adapter", self._json(lambda b: "Success"))
        app.router.add_post("/v1/unload_lora_adapter", self._json(lambda b: "Success"))
        if self.dev_mode:
            app.router.add_get("/server_info", self._json(lambda b: self.info))
            app.router.add_post("/collective_rpc", self._reload)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()

    def _set_version(self, body):
        self.version = body["new_version"]
        return {"success": True}

    def _json(self, answer):
        async def handle(request):
            body = await request.json() if request.can_read_body else None
            self.calls.append((request.path_qs, body))
            return web.json_response(answer(body))

        return handle

    async def _reload(self, request):
        body = await request.json()
        self.calls.append((request.path_qs, body))
        if self.reload_gate is not None:
            await self.reload_gate.wait()
        return web.Response(status=200)

    async def _completions(self, request):
        body = await request.json()
        self.calls.append((request.path_qs, body))
        if "prompt_logprobs" in body and self.model is not None:
            ids = body["prompt"]
            scores = sync_probe.learner_logprobs(self.model, ids) + self.probe_error
            prompt = [None] + [
                {str(t): {"logprob": float(x), "rank": 1}} for t, x in zip(ids[1:], scores)
            ]
            return web.json_response(reply([5], [-1.0], prompt_logprobs=prompt))
        answer = self.completions(body)
        if asyncio.iscoroutine(answer):
            answer = await answer
        if isinstance(answer, web.Response):
            return answer
        return web.json_response(answer)

    def paths(self):
        return [p for p, _ in self.calls]


def client(url, **kw):
    settings = ServerPoolSettings(max_retries=kw.pop("max_retries", 1), backoff_s=0.01)
    return VLLMClient(url, settings=settings, **kw)


def run(coro):
    return asyncio.run(coro)


def test_payload_sends_every_sampling_field_and_token_ids():
    sampling = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=5, stop_token_ids=(9,), seed=2**64 - 1
    )
    body = proto.completion_payload(GenerateRequest([1, 2], sampling, logprob_start_len=0), "r-1")
    assert body["prompt"] == [1, 2] and body["max_tokens"] == 5 and body["request_id"] == "r-1"
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["top_k"] == -1
    assert body["stop_token_ids"] == [9] and body["ignore_eos"] is True
    assert body["skip_special_tokens"] is False and body["include_stop_str_in_output"] is True
    assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
    assert body["logprobs"] == 0 and body["prompt_logprobs"] == 0
    assert body["seed"] == -1  # 2**64 - 1 as vLLM's signed 64-bit seed
    unscored = proto.completion_payload(GenerateRequest([1], SamplingParams(max_new_tokens=0)), "r")
    assert "prompt_logprobs" not in unscored and "seed" not in unscored
    assert unscored["max_tokens"] == 1  # vLLM refuses 0: one token, dropped


def test_completion_reads_tokens_logprobs_stop_and_prompt_scores():
    request = GenerateRequest(
        [3, 4, 5], SamplingParams(max_new_tokens=4), logprob_start_len=1, top_logprobs_num=1
    )
    prompt = [
        None,
        {"4": {"logprob": -2.0, "rank": 3}, "8": {"logprob": -0.1, "rank": 1}},
        {"5": {"logprob": -0.25, "rank": 1}},
    ]
    top = [{"token_id:7": -0.5}, {"token_id:9": -0.75, "token_id:1": -3.0}]
    body = reply([7, 9], [-0.5, -0.75], "stop", 9, prompt_logprobs=prompt, top=top)
    c = proto.completion_from_json(body, request, latency_s=0.5)
    assert c.output_ids == [7, 9] and c.logprobs == [-0.5, -0.75]
    assert c.finish_reason == "stop" and c.matched_stop == 9 and c.prompt_tokens == 3
    assert c.top_logprobs == [[(7, -0.5)], [(9, -0.75)]]
    assert c.prompt_logprobs == [-2.0, -0.25]
    assert c.prompt_top_logprobs == [[(8, -0.1)], [(5, -0.25)]]
    scoring = GenerateRequest([3, 4, 5], SamplingParams(max_new_tokens=0), logprob_start_len=0)
    c = proto.completion_from_json(reply([7], [-0.5], prompt_logprobs=prompt), scoring, latency_s=0)
    assert c.output_ids == [] and c.logprobs == [] and c.prompt_logprobs == [None, -2.0, -0.25]


MALFORMED = {
    "no choices": ({"error": "?"}, "malformed /v1/completions reply"),
    "an unknown finish": (reply([5], [-1.0], reason="repetition"), "unknown finish_reason"),
    "a token name that is not the token": (
        {
            **reply([5], [-1.0]),
            "choices": [
                {
                    **reply([5], [-1.0])["choices"][0],
                    "logprobs": {"token_logprobs": [-1.0], "tokens": ["token_id:6"]},
                }
            ],
        },
        r"tokens\[0\] is 'token_id:6' but token_ids\[0\] 5",
    ),
    "a missing log-prob": (reply([5, 6], [-1.0]), "has 1 entries for 2 tokens"),
    "a null log-prob": (reply([5], [None]), "is not a number"),
    "a NaN log-prob": (reply([5], [float("nan")]), "is not a probability's"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_reply_is_retried_then_reported(case):
    body, message = MALFORMED[case]

    async def go():
        async with FakeVLLM(lambda b: body) as server:
            c = client(server.url)
            try:
                with pytest.raises(RolloutServerError, match=message):
                    await c.generate([GenerateRequest([1])])
            finally:
                await c.aclose()
            return server.paths().count("/v1/completions")

    assert run(go()) == 2  # the first try and one retry


def test_a_failing_server_is_retried_on_the_next_one_then_reported():
    async def go():
        async with FakeVLLM(lambda b: web.Response(status=503, text="busy")) as bad:
            async with FakeVLLM() as good:
                c = client([bad.url, good.url])
                try:
                    [out] = await c.generate([GenerateRequest([1])])
                    assert out.output_ids == [5, 6]
                finally:
                    await c.aclose()
                c = client(bad.url)
                try:
                    with pytest.raises(RolloutServerError, match="503"):
                        await c.generate([GenerateRequest([1])])
                finally:
                    await c.aclose()

    run(go())


def test_a_server_that_is_not_up_is_named():
    async def go():
        c = client("http://127.0.0.1:9", max_retries=0)
        try:
            with pytest.raises(RolloutServerError, match=r"GET /v1/models failed.*127.0.0.1:9"):
                await c.generate([GenerateRequest([1])])
        finally:
            await c.aclose()

    run(go())


def test_a_server_dead_at_start_up_is_taken_out_the_others_serve_and_it_comes_back(caplog):
    port = free_port()  # nothing listens there yet
    dead = f"http://127.0.0.1:{port}"

    async def go():
        async with FakeVLLM() as alive:
            c = client([dead, alive.url])
            try:
                requests = [GenerateRequest([1], affinity_key=f"e{k}") for k in range(3)]
                outs = await c.generate(requests)
                down = c.pool.down()
                async with FakeVLLM(port=port) as back:  # the dead one starts
                    healthy = await c.health()  # passes the start-up checks, is back
                    return outs, down, alive.paths(), healthy, c.pool.healthy(), back.paths()
            finally:
                await c.aclose()

    with caplog.at_level(logging.ERROR, logger="orchestra_jax.rollout.http.server_pool"):
        outs, down, served, healthy, up, checked = run(go())
    assert [o.output_ids for o in outs] == [[5, 6]] * 3
    assert served.count("/v1/completions") == 3
    assert list(down) == [dead] and "did not answer at start-up" in down[dead]
    assert f"rollout server {dead} taken out" in caplog.text
    assert healthy and len(up) == 2 and "/server_info?config_format=json" in checked


@pytest.mark.parametrize("dead_servers", [1, 2])
def test_with_no_server_answering_at_start_up_the_error_names_each(dead_servers):
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(dead_servers)]

    async def go():
        c = client(dead, max_retries=1)
        try:
            await c.generate([GenerateRequest([1])])
        finally:
            await c.aclose()

    with pytest.raises(ServerUnreachable, match="no rollout server answered at start-up") as e:
        run(go())
    assert all(f"{url}: GET /v1/models failed after 2 attempts" in str(e.value) for url in dead)


@pytest.mark.parametrize(
    "server, message",
    [
        (dict(dev_mode=False), "VLLM_SERVER_DEV_MODE=1"),
        (
            dict(info={"vllm_config": {"model_config": {"logprobs_mode": "raw_logprobs"}}}),
            "--logprobs-mode processed_logprobs",
        ),
    ],
)
def test_start_up_checks_name_what_is_missing(server, message):
    async def go():
        async with FakeVLLM(**server) as fake:
            c = client(fake.url)
            try:
                with pytest.raises(RolloutServerError, match=message):
                    await c.generate([GenerateRequest([1])])
            finally:
                await c.aclose()
            assert "/v1/completions" not in fake.paths()

    run(go())


def test_a_served_model_of_another_dtype_or_shape_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG.to_hf_dict(), "hidden_size": 128}))

    async def go(model_config, message):
        async with FakeVLLM() as fake:
            fake.info["vllm_config"]["model_config"]["model"] = str(tmp_path)
            c = client(fake.url, model_config=model_config)
            try:
                with pytest.raises(RolloutServerError, match=message):
                    await c.generate([GenerateRequest([1])])
            finally:
                await c.aclose()

    run(go(CONFIG, "hidden_size: 128, 64"))
    run(
        go(
            CONFIG.replace(dtype=jnp.bfloat16),
            "serves in float32, the learner computes in bfloat16",
        )
    )


def tiny_model():
    return Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(0))


def test_weight_sync_reloads_labels_checks_and_keeps_two_versions(tmp_path):
    model = tiny_model()

    async def go():
        async with FakeVLLM(model=model) as fake:
            c = client(fake.url, weights_dir=str(tmp_path), model_config=CONFIG)
            try:
                for version in (1, 2, 3):
                    await c.update_weights(model, version=version)
                [out] = await c.generate([GenerateRequest([1])])
            finally:
                await c.aclose()
            return fake, out

    fake, out = run(go())
    syncs = [(p, b) for p, b in fake.calls if not p.startswith(("/v1/models", "/server_info"))]
    assert [p for p, _ in syncs[:5]] == [
        "/pause?mode=wait",
        "/collective_rpc",
        "/update_weight_version",
        "/resume",
        "/weight_info",
    ]
    assert syncs[5][0] == "/v1/completions" and syncs[5][1]["prompt_logprobs"] == 0  # the probe
    rpc = syncs[1][1]
    assert rpc["method"] == "reload_weights"
    assert rpc["kwargs"]["weights_path"] == os.path.join(str(tmp_path), "v1")
    assert syncs[2][1] == {"new_version": "1"}
    assert sorted(os.listdir(tmp_path)) == ["v2", "v3"]
    assert json.load(open(tmp_path / "v3" / "config.json"))["hidden_size"] == CONFIG.hidden_size
    assert out.weight_version == 3 and out.first_weight_version is None


def test_adapter_sync_loads_names_probes_and_unloads_versioned_adapters(tmp_path):
    config = CONFIG.replace(lora=LoRASpec(rank=4, alpha=8.0))
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    lora = {"max_lora_rank": 8, "max_loras": 2}

    async def go():
        async with FakeVLLM(model=model) as fake:
            fake.info["vllm_config"]["lora_config"] = lora
            c = client(fake.url, weights_dir=str(tmp_path), model_config=config)
            try:
                for version in (1, 2, 3):
                    await c.update_weights(model, version=version)
                [out] = await c.generate([GenerateRequest([1])])
            finally:
                await c.aclose()
            return fake, out

    fake, out = run(go())
    syncs = [(p, b) for p, b in fake.calls if not p.startswith(("/v1/models", "/server_info"))]
    assert [p for p, _ in syncs[:6]] == [
        "/pause?mode=wait",
        "/v1/load_lora_adapter",
        "/update_weight_version",
        "/resume",
        "/weight_info",
        "/v1/completions",  # the probe, with the new adapter
    ]
    assert syncs[1][1] == {
        "lora_name": "policy-v1",
        "lora_path": os.path.join(tmp_path, "v1"),
        "load_inplace": True,
    }
    assert syncs[5][1]["model"] == "policy-v1" and syncs[5][1]["prompt_logprobs"] == 0
    assert ("/v1/unload_lora_adapter", {"lora_name": "policy-v1"}) in syncs  # at the third
    assert not any(p.startswith("/collective_rpc") for p, _ in syncs)  # the base stays
    assert syncs[-1][1]["model"] == "policy-v3" and out.weight_version == 3
    assert sorted(os.listdir(tmp_path / "v3")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]

    async def refused(lora_config, message):
        async with FakeVLLM() as fake:
            fake.info["vllm_config"]["lora_config"] = lora_config
            c = client(fake.url, model_config=config)
            try:
                with pytest.raises(RolloutServerError, match=message):
                    await c.generate([GenerateRequest([1])])
            finally:
                await c.aclose()

    run(refused(None, "serves no LoRA adapters"))
    run(refused({"max_lora_rank": 1, "max_loras": 2}, "up to rank 1"))


def test_a_sync_the_server_did_not_label_fails_and_resumes(tmp_path):
    async def go():
        fake = FakeVLLM()
        fake._set_version = lambda body: {"success": True}  # the label does not change
        async with fake:
            c = client(fake.url, weights_dir=str(tmp_path), model_config=CONFIG)
            try:
                with pytest.raises(
                    sync_probe.SyncNotLanded, match="serves weight version 'default' after the sync"
                ):
                    await c.update_weights(tiny_model(), version=1)
            finally:
                await c.aclose()
            return fake.paths()

    assert "/resume" in run(go())


def test_partial_sync_keeps_requests_in_flight_and_records_both_versions(tmp_path):
    model = tiny_model()

    async def go():
        release = asyncio.Event()

        async def slow(body):
            await release.wait()
            return reply([5], [-1.0])

        async with FakeVLLM(slow, model=model) as fake:
            c = client(fake.url, weights_dir=str(tmp_path), model_config=CONFIG)
            try:
                await c.update_weights(model, version=1)
                pending = asyncio.ensure_future(c.generate([GenerateRequest([1])]))
                while "/v1/completions" not in fake.paths():
                    await asyncio.sleep(0.01)
                await c.update_weights(model, version=2, partial=True)
                release.set()
                [out] = await pending
            finally:
                await c.aclose()
            return fake, out

    fake, out = run(go())
    assert "/pause?mode=keep" in fake.paths()
    assert (out.first_weight_version, out.weight_version) == (1, 2)


def test_probe_passes_a_landed_sync_and_stops_one_that_did_not(tmp_path):
    model = tiny_model()
    ids = sync_probe.probe_ids(CONFIG.vocab_size)
    assert ids == sync_probe.probe_ids(CONFIG.vocab_size) and len(ids) == sync_probe.PROBE_LENGTH
    assert max(ids) < CONFIG.vocab_size
    # learner_logprobs is log_softmax of the model's logits at the previous position.
    logits = np.asarray(model(jnp.asarray([ids]), jnp.arange(len(ids))[None])[0], np.float64)
    logits -= logits.max(-1, keepdims=True)
    hand = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = hand[np.arange(len(ids) - 1), ids[1:]]
    np.testing.assert_allclose(sync_probe.learner_logprobs(model, ids), expected, atol=1e-5)

    async def sync(errors):
        fakes = [FakeVLLM(model=model, probe_error=e) for e in errors]
        for fake in fakes:
            await fake.__aenter__()
        c = client([f.url for f in fakes], weights_dir=str(tmp_path), model_config=CONFIG)
        try:
            await c.update_weights(model, version=4)
            return c.sync_metrics(), c.take_metrics()
        finally:
            await c.aclose()
            for fake in fakes:
                await fake.__aexit__()

    metrics, _ = run(sync([1e-4, 0.0]))
    assert metrics["rollout/sync_logprob_max_abs_diff"] == pytest.approx(1e-4, rel=1e-2)
    # One server off: it is taken out, the sync stands on the other.
    metrics, servers = run(sync([0.0, 0.01]))
    assert metrics["rollout/sync_logprob_max_abs_diff"] < 1e-5
    assert (servers["0/up"], servers["1/up"]) == (1.0, 0.0)
    with pytest.raises(sync_probe.SyncNotLanded, match=r"differ from the learner's by up to 0.01"):
        run(sync([0.01]))
    assert sync_probe.tolerance_for(jnp.bfloat16) > sync_probe.tolerance_for(jnp.float32)


def test_two_servers_keep_each_episode_on_one_and_fail_over_from_a_dead_one():
    async def go():
        async with FakeVLLM() as a, FakeVLLM() as b:
            fakes = [a, b]
            c = client([a.url, b.url], max_retries=2)
            try:

                def turn(t):
                    return [
                        GenerateRequest([1, 2], request_id=f"e{k}-t{t}", affinity_key=f"e{k}")
                        for k in range(4)
                    ]

                for t in range(3):
                    await c.generate(turn(t))
                served = [
                    {b["request_id"].split("-t")[0] for p, b in f.calls if p == "/v1/completions"}
                    for f in fakes
                ]
                counts = [f.paths().count("/v1/completions") for f in fakes]
                c.take_metrics()
                await a.__aexit__()  # server a dies: its episodes move to b
                outs = await c.generate(turn(3))
                return served, counts, outs, c.take_metrics(), b.paths().count("/v1/completions")
            finally:
                await c.aclose()

    served, counts, outs, metrics, b_after = run(go())
    assert served[0] and served[1] and not served[0] & served[1]  # spread, never split
    assert counts == [3 * len(served[0]), 3 * len(served[1])]  # each episode's three turns
    assert [o.output_ids for o in outs] == [[5, 6]] * 4
    assert b_after == counts[1] + 4
    assert metrics["0/errors"] >= len(served[0]) and metrics["1/requests"] == 4


def test_a_config_names_the_vllm_engine_with_partial_rollouts_and_its_servers():
    from experiments.configs import grpo_hle
    from orchestra_jax.training import builders, experiment_config

    c = grpo_hle.get_config("micro")
    c.rollout.engine = "vllm"
    c.rl.max_staleness, c.rl.partial_rollouts = 1, True
    errors = experiment_config.problems(c)
    assert errors == [
        "rollout.urls: the 'vllm' engine needs it",
        "rollout.weights_dir: the 'vllm' engine needs it",
    ]
    c.rollout.urls, c.rollout.weights_dir = "http://a:8000,http://b:8000", "/w"
    assert experiment_config.problems(c) == []
    engine = builders.build_engine(c, None, CONFIG)
    assert isinstance(engine, VLLMClient) and engine.urls == ["http://a:8000", "http://b:8000"]
    c.rollout.engine = "sglang"
    assert any("rl.partial_rollouts needs" in e for e in experiment_config.problems(c))
    c.rollout.sync_tolerance = -1.0
    assert any("rollout.sync_tolerance" in e for e in experiment_config.problems(c))


def test_rollout_server_pool_settings_are_checked_and_reach_each_client_and_its_pool():
    from experiments.configs import grpo_hle
    from orchestra_jax.rollout.http.sglang_client import SGLangClient
    from orchestra_jax.training import builders, experiment_config

    c = grpo_hle.get_config("micro")
    c.rollout.engine, c.rollout.urls, c.rollout.weights_dir = "vllm", "http://a:8000", "/w"
    pool = c.rollout.server_pool
    pool.timeout_s, pool.max_retries, pool.max_consecutive_errors = 0.0, -1, 0
    assert experiment_config.problems(c) == [
        "rollout.server_pool.timeout_s must be > 0.0, got 0.0",
        "rollout.server_pool.max_retries must be >= 0, got -1",
        "rollout.server_pool.max_consecutive_errors must be >= 1, got 0",
    ]
    with pytest.raises(ValueError, match="max_retries must be >= 0"):
        ServerPoolSettings(max_retries=-1)
    pool.timeout_s, pool.max_retries, pool.backoff_s = 5.0, 1, 0.25
    pool.max_consecutive_errors, pool.recheck_s, pool.health_interval_s = 2, 3.0, 0.0
    pool.health_timeout_s, pool.max_in_flight = 2.0, 8
    assert experiment_config.problems(c) == []
    for engine, engine_class in (("vllm", VLLMClient), ("sglang", SGLangClient)):
        c.rollout.engine = engine
        built = builders.build_engine(c, None, CONFIG)
        assert isinstance(built, engine_class)
        assert built.settings == ServerPoolSettings(**pool)
        assert (built.timeout_s, built.max_retries, built.backoff_s) == (5.0, 1, 0.25)
        assert (built.health_timeout_s, built.max_in_flight) == (2.0, 8)
        p = built.pool
        assert (p.max_consecutive_errors, p.recheck_s, p.health_interval_s) == (2, 3.0, 0.0)
    pool.max_in_flight = 0  # each client's own bound
    assert builders.build_engine(c, None, CONFIG).max_in_flight is None  # sglang: every chunk
    c.rollout.engine = "vllm"
    assert builders.build_engine(c, None, CONFIG).max_in_flight == 256
