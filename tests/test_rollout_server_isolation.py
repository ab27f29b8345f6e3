"""One bad request harms no other: poison requests beside requests in flight, an
oversized batch, a client that disconnects, a truthful /health, weight updates
during a long request."""

import asyncio
import json

import aiohttp
import jax
import pytest
from flax import nnx

from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import ServerConfig, serve_in_thread
from tests.decode_gate import DecodeGate, wait_until

CONTEXT = 64
NORMAL = {
    "input_ids": [5, 6, 7],
    "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
    "return_logprob": True,
}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _model(tokenizer, seed=0):
    config = Qwen3Config.preset("tiny", vocab_size=tokenizer.vocab_size)
    return Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("demo")


@pytest.fixture(scope="module")
def served(tokenizer):
    model = _model(tokenizer)
    engine = JaxEngine(
        model,
        JaxEngineConfig(max_batch_size=4, max_seq_len=CONTEXT, steps_per_call=4),
        tokenizer=tokenizer,
    )
    graphdef, state = nnx.split(model)
    other = jax.tree.map(lambda x: -1.2 * x, state)
    config = ServerConfig(model_path="tiny", max_body_bytes=2**20, max_batch_prompts=64)
    loader = {"old": state, "new": other}.__getitem__
    with serve_in_thread(engine, config, tokenizer=tokenizer, weight_loader=loader) as server:
        yield server, engine
    engine.close()


async def _request(session, url, path, body=None, raw=None, method="POST"):
    data = raw if raw is not None else None
    kwargs = {"data": data} if raw is not None else {"json": body}
    async with session.request(method, url + path, **kwargs) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


async def _alone(url):
    async with aiohttp.ClientSession() as session:
        return await _request(session, url, "/generate", NORMAL)


def _deep(n):
    return ("[" * n + "]" * n).encode()


POISON = {
    "max_new_tokens 2^31": (
        "/generate",
        {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2**31}},
        400,
    ),
    "stop id 2^31": (
        "/generate",
        {"input_ids": [5, 6], "sampling_params": {"stop_token_ids": [2**31], "max_new_tokens": 4}},
        200,
    ),
    "top_k 2^40": (
        "/generate",
        {"input_ids": [5], "sampling_params": {"top_k": 2**40, "max_new_tokens": 4}},
        200,
    ),
    "top_p 1e-40": (
        "/generate",
        {"input_ids": [5], "sampling_params": {"top_p": 1e-40, "max_new_tokens": 4}},
        200,
    ),
    "temperature NaN": (
        "/generate",
        b'{"input_ids": [5], "sampling_params": {"temperature": NaN}}',
        400,
    ),
    "id past the vocabulary": ("/generate", {"input_ids": [5, 10**9]}, 400),
    "JSON 1000 deep": ("/generate", _deep(1000), 400),
    "JSON 100000 deep": ("/generate", _deep(100_000), 400),
    "not JSON": ("/generate", b"{nope", 400),
    "body too large": ("/generate", b" " * (2**20 + 1), 413),
    "chat seed 1.5": ("/v1/chat/completions", {**CHAT, "seed": 1.5}, 400),
    "chat top_k 2^40": ("/v1/chat/completions", {**CHAT, "top_k": 2**40}, 200),
    "chat max_tokens 2^31": ("/v1/chat/completions", {**CHAT, "max_tokens": 2**31}, 400),
    "chat temperature [1]": ("/v1/chat/completions", {**CHAT, "temperature": [1]}, 400),
    "chat tools 5": ("/v1/chat/completions", {**CHAT, "tools": 5}, 400),
    "chat content 5": ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
}


@pytest.mark.parametrize("name", POISON)
def test_a_bad_request_beside_three_in_flight(served, monkeypatch, name):
    server, engine = served
    path, bad, expected = POISON[name]
    reference = asyncio.run(_alone(server.url))[1]
    gate = DecodeGate(engine, monkeypatch)  # the three stay in flight until the bad one is in

    async def go():
        async with aiohttp.ClientSession() as session:
            normal = [
                asyncio.ensure_future(_request(session, server.url, "/generate", NORMAL))
                for _ in range(3)
            ]
            await wait_until(lambda: engine.running() >= 3, what="three requests in flight")
            raw = bad if isinstance(bad, bytes) else None
            poison = asyncio.ensure_future(
                _request(session, server.url, path, None if raw else bad, raw)
            )
            # Refused at the door, or queued beside the three: either way, now decode.
            await wait_until(lambda: poison.done() or engine.running() >= 4, what="the bad one")
            gate.open()
            return await poison, await asyncio.gather(*normal)

    (status, reply), normal = asyncio.run(go())
    assert status == expected, reply
    if status >= 400:
        assert reply["error"]["message"]
    for status, reply in normal:
        assert status == 200
        assert reply["output_ids"] == reference["output_ids"]
        assert reply["meta_info"]["completion_tokens"] == 24


def test_an_oversized_batch_is_refused_and_a_big_one_does_not_starve_others(served):
    server, engine = served

    async def go():
        async with aiohttp.ClientSession() as session:
            for prompts, limit in ((200_000, "limit of 1048576 bytes"), (20_000, "limit of 64")):
                huge = {"input_ids": [[5, 6]] * prompts}
                status, reply = await _request(session, server.url, "/generate", huge)
                assert status == 413 and limit in reply["error"]["message"]
            order = []

            async def call(name, body):
                result = await _request(session, server.url, "/generate", body)
                order.append(name)
                return result

            big = {
                "input_ids": [[5, i] for i in range(64)],
                "sampling_params": {"max_new_tokens": 8},
            }
            small = {"input_ids": [9, 9], "sampling_params": {"max_new_tokens": 8}}
            first = asyncio.ensure_future(call("big", big))
            await wait_until(lambda: engine.running() >= 4, what="the batch in flight")
            health = await session.get(server.url + "/health")
            results = [await call("small", small), await first]
            return order, health.status, results

    order, health, results = asyncio.run(go())
    assert order == ["small", "big"] and health == 200
    assert all(status == 200 for status, _ in results) and len(results[1][1]) == 64


def test_a_disconnected_client_has_its_work_cancelled(served):
    """64 prompts of 60 tokens through 4 slots; the client leaves once work has begun:
    the rest is never admitted and the running rows are freed."""
    server, engine = served
    many = {
        "input_ids": [[5, i] for i in range(64)],
        "sampling_params": {"max_new_tokens": 60, "ignore_eos": True},
    }
    admitted = engine.prefix_cache_stats["requests"]

    async def go():
        session = aiohttp.ClientSession()
        task = asyncio.ensure_future(_request(session, server.url, "/generate", many))
        await wait_until(lambda: engine.running() > 0, what="the batch in flight")
        task.cancel()
        await session.close()  # the connection goes: the client disconnected
        for _ in range(1000):
            if engine.running() == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(go())
    assert engine.prefix_cache_stats["requests"] - admitted < 64


def test_health_generates_and_times_out():
    slow = ScriptedEngine([[1]], latency_s=2.0)
    with serve_in_thread(slow, ServerConfig(health_timeout_s=0.2)) as server:

        async def go():
            async with aiohttp.ClientSession() as session:
                return [
                    (await session.get(server.url + path)).status
                    for path in ("/health", "/health_generate")
                ]

        assert asyncio.run(go()) == [503, 503]
    quick = ScriptedEngine(lambda ids, r: [1])
    with serve_in_thread(quick) as server:
        assert asyncio.run(_get(server.url + "/health")) == 200
        assert quick.requests[-1].input_ids == [0]  # it really generated


async def _get(url):
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as resp:
            return resp.status


@pytest.mark.parametrize("abort", [False, True])
def test_a_weight_update_during_a_long_request(served, monkeypatch, abort):
    """Every token of the response is from one version, and the response says which.

    The old weights' tokens are those of the same request before the update; the new
    weights (the old ones times -1.2) give other tokens, as a request after it shows.
    """
    server, engine = served
    long = {
        "input_ids": [5, 6],
        "sampling_params": {"max_new_tokens": 50, "temperature": 0, "ignore_eos": True},
    }

    async def go():
        async with aiohttp.ClientSession() as session:
            _, before = await _request(session, server.url, "/generate", long)
            # Two decode calls (1 + 2 * 4 tokens), then held until the update is queued.
            gate = DecodeGate(engine, monkeypatch, allow=2)
            task = asyncio.ensure_future(_request(session, server.url, "/generate", long))
            await wait_until(lambda: gate.calls > 2, what="9 tokens generated")
            update = {"model_path": "new", "weight_version": "v-new", "abort_all_requests": abort}
            path = "/update_weights_from_disk"
            updating = asyncio.ensure_future(_request(session, server.url, path, update))
            await wait_until(lambda: bool(engine._swaps), what="the update queued")
            gate.open()
            updated = await updating
            _, during = await task
            _, after = await _request(session, server.url, "/generate", long)
            _, info = await _request(session, server.url, "/model_info", method="GET")
            back = {"model_path": "old", "weight_version": "0"}
            await _request(session, server.url, "/update_weights_from_disk", back)
            return before, updated, during, after, info

    before, updated, during, after, info = asyncio.run(go())
    old = before["output_ids"]
    assert updated[0] == 200 and updated[1]["success"] and info["weight_version"] == "v-new"
    assert during["meta_info"]["weight_version"] == "0"
    if abort:
        assert during["meta_info"]["finish_reason"]["type"] == "abort"
        assert 5 <= len(during["output_ids"]) < 50
        assert during["output_ids"] == old[: len(during["output_ids"])]
    else:
        assert during["output_ids"] == old
    assert after["meta_info"]["weight_version"] == "v-new"
    assert len(after["output_ids"]) == 50 and after["output_ids"] != old


def test_flush_cache_drops_cached_prefixes(served):
    server, engine = served
    body = {"input_ids": list(range(10, 40)), "sampling_params": {"max_new_tokens": 2}}

    async def go():
        async with aiohttp.ClientSession() as session:
            await _request(session, server.url, "/generate", body)
            _, again = await _request(session, server.url, "/generate", body)
            flushed = await session.post(server.url + "/flush_cache")
            _, after = await _request(session, server.url, "/generate", body)
            return again, flushed.status, after

    again, status, after = asyncio.run(go())
    assert again["meta_info"]["cached_tokens"] > 0
    assert status == 200 and after["meta_info"]["cached_tokens"] == 0


def test_a_request_id_in_flight_is_refused():
    engine = ScriptedEngine(lambda ids, r: [1, 2], latency_s=2.0)
    with serve_in_thread(engine) as server:

        async def go():
            async with aiohttp.ClientSession() as session:
                body = {"input_ids": [3], "rid": "same"}
                first = asyncio.ensure_future(_request(session, server.url, "/generate", body))
                in_flight = server.server._rids_in_flight
                await wait_until(lambda: "same" in in_flight, what="the first in flight")
                second = await _request(session, server.url, "/generate", body)
                return await first, second

        (first, _), (second, reply) = asyncio.run(go())
    assert first == 200 and second == 400 and "Duplicate request ID" in reply["error"]["message"]
