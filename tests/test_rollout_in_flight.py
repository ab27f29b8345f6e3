"""How many calls an HTTP rollout client keeps open on each server, and when their
time limit starts: `rollout.server_pool.max_in_flight` per server (no connector
limit of aiohttp's below it), timed from when a call is sent, not while it waits."""

import asyncio

from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.vllm_client import VLLMClient
from tests.test_rollout_vllm_client import FakeVLLM, reply


class Held:
    """A /v1/completions answer that counts the calls open at once; each call waits
    until `target` are open (at most `hold_s`), or `delay_s` when there is no target."""

    def __init__(self, *, target=None, hold_s=3.0, delay_s=0.0):
        self.target, self.hold_s, self.delay_s = target, hold_s, delay_s
        self.open = self.peak = 0
        self.full = asyncio.Event()

    async def __call__(self, body):
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            if self.target is None:
                await asyncio.sleep(self.delay_s)
            else:
                if self.open >= self.target:
                    self.full.set()
                try:
                    await asyncio.wait_for(self.full.wait(), self.hold_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.open -= 1
        return reply([5, 6], [-0.5, -1.5])


def requests(n):
    return [
        GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=2), request_id=f"r{i}")
        for i in range(n)
    ]


def test_each_server_gets_the_configured_calls_at_once():
    async def go():
        a_calls, b_calls = Held(target=150), Held(target=150)
        async with FakeVLLM(a_calls) as a, FakeVLLM(b_calls) as b:
            settings = ServerPoolSettings(max_in_flight=150, max_retries=0, timeout_s=30.0)
            client = VLLMClient([a.url, b.url], settings=settings)
            try:
                out = await client.generate(requests(300))
            finally:
                await client.aclose()
        return out, a_calls.peak, b_calls.peak

    out, peak_a, peak_b = asyncio.run(go())
    assert len(out) == 300
    # Not aiohttp's default of 100 connections over both servers: 150 on each.
    assert (peak_a, peak_b) == (150, 150)


def test_a_call_waiting_for_its_turn_is_not_timed_out():
    async def go(max_in_flight, n):
        calls = Held(delay_s=1.0)
        async with FakeVLLM(calls) as server:
            settings = ServerPoolSettings(max_in_flight=max_in_flight, max_retries=0, timeout_s=1.8)
            client = VLLMClient(server.url, settings=settings)
            try:
                out = await client.generate(requests(n))
                return len(out), calls.peak, client.take_metrics()["0/errors"]
            finally:
                await client.aclose()

    # 120 calls of a second each, a 1.8 s limit: all open at once (vLLM's default bound
    # of 256; aiohttp's default connector would queue 20 of them for a second, timed),
    # so none times out. (Under the loopback listener's backlog of 128 connections.)
    assert asyncio.run(go(0, 120)) == (120, 120, 0)
    # 60 calls, 30 at once: the second 30 wait a second for their turn, then take a
    # second; the wait is not timed, so they finish too.
    assert asyncio.run(go(30, 60)) == (60, 30, 0)


def test_a_call_that_outlasts_the_time_limit_fails_over():
    async def go():
        async with FakeVLLM(Held(delay_s=5.0)) as slow, FakeVLLM() as fast:
            settings = ServerPoolSettings(max_retries=1, backoff_s=0.0, timeout_s=0.5)
            client = VLLMClient([slow.url, fast.url], settings=settings)
            try:
                start = asyncio.get_running_loop().time()
                [out] = await client.generate(requests(1))
                return out, asyncio.get_running_loop().time() - start, client.take_metrics()
            finally:
                await client.aclose()

    out, took, metrics = asyncio.run(go())
    # rollout.server_pool.timeout_s holds for generate calls too: the slow server's
    # call is cut at 0.5 s and the request served by the other.
    assert out.output_ids == [5, 6] and took < 3.0
    assert metrics["0/errors"] == 1 and metrics["1/requests"] == 1
