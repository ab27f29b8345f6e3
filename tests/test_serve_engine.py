"""Requests to the orchestrator service share one in-process JAX engine: their turns
ride in the same engine batch, and a client that disconnects frees its rows.

The policy is a tiny random Qwen3 on `JaxEngine` (it calls no tools: each turn is a
format error the loop answers with an observation), the world the demo's.
"""

import asyncio
import dataclasses
import threading
import time

import aiohttp
import pytest
from flax import nnx

from experiments.configs.grpo_hle import get_config
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.serve.app import OrchestratorServer, ServerThread
from orchestra_jax.serve.build import default_tool_config
from orchestra_jax.serve.service import Orchestrator
from orchestra_jax.training import builders
from orchestra_jax.training.eval_protocols import eval_protocol
from tests.decode_gate import DecodeGate

ROWS = 8
BODY = {"messages": [{"role": "user", "content": "Who founded the observatory?"}]}


@pytest.fixture(scope="module")
def served():
    demo = get_config("demo")
    config = eval_protocol(demo).apply(demo)
    env = builders.build_env(config)
    tokenizer = builders.build_tokenizer(config)
    model = Qwen3ForCausalLM(
        Qwen3Config.preset("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0)
    )
    engine = JaxEngine(
        model,
        JaxEngineConfig(max_batch_size=ROWS, max_seq_len=2048, steps_per_call=4),
        tokenizer=tokenizer,
    )
    limits = dataclasses.replace(
        builders.loop_limits(config), max_turns=2, max_new_tokens_per_turn=64
    )
    orchestrator = Orchestrator(
        engine=engine,
        tokenizer=tokenizer,
        env=env,
        tool_config=default_tool_config(config, env),
        sampling=dataclasses.replace(builders.eval_sampling_params(config), temperature=1.0),
        limits=limits,
        name="tiny",
    )
    with ServerThread(OrchestratorServer(orchestrator)) as server:
        yield server, engine
    engine.close()


def live_rows(engine) -> int:
    return sum(job is not None for job in engine._slots)


def idle(engine) -> bool:
    return live_rows(engine) == 0 and len(engine._queue) == 0


def wait_for(condition, timeout_s=120.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_concurrent_requests_share_the_engines_batch(served):
    server, engine = served
    most = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            most[0] = max(most[0], live_rows(engine))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    async def crowd():
        async with aiohttp.ClientSession() as session:

            async def one():
                async with session.post(server.url + "/v1/chat/completions", json=BODY) as r:
                    return r.status, await r.json()

            return await asyncio.gather(*(one() for _ in range(ROWS)))

    try:
        results = asyncio.run(crowd())
    finally:
        done.set()
        watcher.join()
    assert [status for status, _ in results] == [200] * ROWS
    for _, body in results:
        assert body["orchestration"]["stop_reason"] in ("max_turns", "context")
        assert body["usage"]["completion_tokens"] > 0
    assert most[0] >= 2, "the requests' turns never shared the engine's batch"
    wait_for(lambda: idle(engine), what="the engine to go idle")


def test_a_disconnected_request_frees_its_engine_rows(served, monkeypatch):
    server, engine = served
    wait_for(lambda: idle(engine), what="the engine to go idle")
    gate = DecodeGate(engine, monkeypatch, allow=1)  # the turn starts, then decoding waits

    async def leave_mid_turn():
        body = {**BODY, "stream": True}
        async with aiohttp.ClientSession() as session:
            async with session.post(server.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await asyncio.to_thread(wait_for, lambda: live_rows(engine) == 1, 120, "a row")
        # the session closes: the client is gone while its turn holds a row

    asyncio.run(leave_mid_turn())
    wait_for(lambda: server.server.in_flight == 0, 30, "the request to end")
    gate.open()
    wait_for(lambda: idle(engine), 60, "the row to be freed")
    # 64 tokens at 4 per decode call: a turn left to finish would take 16 calls.
    assert gate.calls <= 4, f"the turn went on after the client left ({gate.calls} calls)"

    async def again():  # the engine serves the next request as before
        async with aiohttp.ClientSession() as session:
            async with session.post(server.url + "/v1/chat/completions", json=BODY) as resp:
                return resp.status

    assert asyncio.run(again()) == 200
