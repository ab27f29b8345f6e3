"""Access to the rollout servers: the project's server refuses requests without its API
key on every route, and the HTTP clients send the key from `rollout.api_key_env`'s
variable on every call (generation, start-up checks, health, weight sync)."""

import asyncio

import aiohttp
import pytest

from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http.client import RolloutServerError
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.sglang_client import SGLangClient
from orchestra_jax.rollout.http.vllm_client import VLLMClient
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import ServerConfig, api_key_from, serve_in_thread
from tests.test_rollout_vllm_client import FakeVLLM

KEY = "s3cret-key"
REQUEST = GenerateRequest([1, 2], SamplingParams(max_new_tokens=2))
ROUTES = [
    ("GET", "/health", None),
    ("GET", "/get_model_info", None),
    ("GET", "/v1/models", None),
    ("POST", "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}),
    ("POST", "/update_weights_from_disk", {"model_path": "/anywhere"}),
    ("POST", "/load_lora_adapter", {"lora_name": "x", "lora_path": "/anywhere"}),
    ("POST", "/flush_cache", None),
]


def echo_policy(ids, request):
    out = list(reversed(ids)) + [9]
    return out, [-0.1] * len(out)


@pytest.fixture()
def keyed():
    loaded = []
    with serve_in_thread(
        ScriptedEngine(echo_policy),
        ServerConfig(model_path="scripted", api_key=KEY),
        weight_loader=lambda path: loaded.append(path) or {},
    ) as s:
        yield s, loaded


def statuses(url, headers):
    async def go():
        async with aiohttp.ClientSession(headers=headers) as session:
            out = {}
            for method, path, body in ROUTES:
                async with session.request(method, url + path, json=body) as resp:
                    out[path] = resp.status
            return out

    return asyncio.run(go())


def test_every_route_refuses_a_missing_or_wrong_key_and_takes_the_right_one(keyed):
    server, loaded = keyed
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        assert set(statuses(server.url, headers).values()) == {401}, headers
    assert loaded == []  # no weights were loaded by the refused calls
    answered = statuses(server.url, {"Authorization": f"Bearer {KEY}"})
    assert answered["/health"] == 200 and answered["/generate"] == 200
    assert answered["/update_weights_from_disk"] == 200 and loaded == ["/anywhere"]


def test_the_server_beyond_loopback_needs_a_key(monkeypatch):
    monkeypatch.delenv("ROLLOUT_API_KEY", raising=False)
    assert api_key_from("ROLLOUT_API_KEY", "127.0.0.1") is None
    with pytest.raises(SystemExit, match="ROLLOUT_API_KEY"):
        api_key_from("ROLLOUT_API_KEY", "0.0.0.0")
    monkeypatch.setenv("ROLLOUT_API_KEY", KEY)
    assert api_key_from("ROLLOUT_API_KEY", "0.0.0.0") == KEY


def test_the_sglang_client_sends_the_key_from_its_variable(keyed, monkeypatch):
    server, _ = keyed
    monkeypatch.setenv("MY_ROLLOUT_KEY", KEY)
    settings = ServerPoolSettings(max_retries=0, backoff_s=0.01)
    client = SGLangClient(server.url, settings=settings, api_key_env="MY_ROLLOUT_KEY")

    async def go():
        try:
            served = await client.generate([REQUEST])
            await client.update_weights_from_disk("/w/v1", version=1)
            return served, await client.health(), await client.weight_versions()
        finally:
            await client.aclose()

    served, healthy, versions = asyncio.run(go())
    assert served[0].output_ids == [2, 1] and healthy and versions == {server.url: "1"}
    monkeypatch.delenv("MY_ROLLOUT_KEY")
    keyless = SGLangClient(server.url, settings=settings, api_key_env="MY_ROLLOUT_KEY")
    with pytest.raises(RolloutServerError, match="401"):
        asyncio.run(keyless.generate([REQUEST]))


class KeyedVLLM(FakeVLLM):
    """FakeVLLM recording the Authorization header of every call."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.keys: list[tuple[str, str | None]] = []

    def _json(self, answer):
        handle = super()._json(answer)

        async def recorded(request):
            self.keys.append((request.path, request.headers.get("Authorization")))
            return await handle(request)

        return recorded

    async def _completions(self, request):
        self.keys.append((request.path, request.headers.get("Authorization")))
        return await super()._completions(request)

    async def _reload(self, request):
        self.keys.append((request.path, request.headers.get("Authorization")))
        return await super()._reload(request)


def test_the_vllm_client_sends_the_key_on_every_call(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUT_API_KEY", KEY)  # rollout.api_key_env's default

    async def go():
        async with KeyedVLLM() as server:
            settings = ServerPoolSettings(max_retries=0, backoff_s=0.01)
            client = VLLMClient(server.url, settings=settings, weights_dir=str(tmp_path))
            try:
                await client.generate([REQUEST])
                await client.sync_from_disk(str(tmp_path), version=1)
                await client.health()
            finally:
                await client.aclose()
            return server.keys

    keys = asyncio.run(go())
    paths = {p for p, _ in keys}
    assert {"/v1/models", "/server_info", "/v1/completions", "/collective_rpc"} <= paths
    assert {"/pause", "/resume", "/weight_info", "/health"} <= paths
    assert {k for _, k in keys} == {f"Bearer {KEY}"}
