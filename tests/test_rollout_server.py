"""The rollout server and the SGLang client, on loopback, over a scripted engine."""

import asyncio

import aiohttp
import pytest

from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.sglang_client import RolloutServerError, SGLangClient
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import ServerConfig, serve_in_thread
from tests.live_helpers import free_port

STOP = 9


def echo_policy(ids, request):
    """Replies with the prompt reversed, then the stop token, logprob -0.1 per token."""
    out = list(reversed(ids)) + [STOP]
    return out, [-0.1 * (i + 1) for i in range(len(out))]


@pytest.fixture()
def server():
    engine = ScriptedEngine(echo_policy)
    loaded = []
    with serve_in_thread(
        engine,
        ServerConfig(model_path="scripted"),
        weight_loader=lambda path: loaded.append(path) or {"path": path},
    ) as s:
        s.engine, s.loaded = engine, loaded
        yield s


def run(coro):
    return asyncio.run(coro)


def test_round_trip_batched_and_in_order(server):
    client = SGLangClient(server.url, max_batch_per_request=2)
    requests = [
        GenerateRequest([1, 2, 3], SamplingParams(stop_token_ids=(STOP,), seed=5)),
        GenerateRequest([4], SamplingParams(max_new_tokens=1)),
        GenerateRequest([5, 6], SamplingParams(temperature=0.0, top_k=3)),
    ]

    async def go():
        try:
            return await client.generate(requests), await client.health()
        finally:
            await client.aclose()

    completions, healthy = run(go())
    assert healthy
    assert [c.output_ids for c in completions] == [[3, 2, 1, STOP], [4], [6, 5, STOP]]
    assert [c.finish_reason for c in completions] == ["stop", "length", "stop"]
    assert completions[0].logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert completions[0].prompt_tokens == 3 and completions[0].completion_tokens == 4
    sent = server.engine.requests[:3]  # the sampling fields survive the wire unchanged
    assert [r.sampling for r in sent] == [r.sampling for r in requests]


async def _post(url, path, payload=None, raw=None):
    async with aiohttp.ClientSession() as session:
        async with session.post(url + path, json=payload, data=raw) as resp:
            return resp.status, await resp.json()


@pytest.mark.parametrize(
    "body, message",
    [
        ({"text": "hi"}, "tokenizer"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [1, -2]}, "outside the vocabulary"),
        ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "2 prompts but 1"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [1], "sampling_params": {"temperature": "hot"}}, "temperature"),
        ({"input_ids": [1], "sampling_params": {"stop": ["x"]}}, "without a tokenizer"),
        ({"input_ids": [1], "sampling_params": {"regex": "a+"}}, "regex is not supported"),
        ({"input_ids": [1], "sampling_params": {"bogus": 1}}, "unknown field `bogus`"),
    ],
)
def test_bad_generate_requests_get_400(server, body, message):
    status, reply = run(_post(server.url, "/generate", body))
    assert status == 400 and message in reply["error"]["message"]


def test_invalid_json_and_unknown_route(server):
    status, reply = run(_post(server.url, "/generate", raw=b"{not json"))
    assert status == 400 and "JSON" in reply["error"]["message"]
    status, reply = run(_post(server.url, "/nope", {}))
    assert status == 404
    status, reply = run(_post(server.url, "/v1/chat/completions", {"messages": []}))
    assert status == 400 and "tokenizer" in reply["error"]["message"]


def test_single_prompt_native_shape_and_admin_routes(server):
    status, reply = run(
        _post(
            server.url,
            "/generate",
            {
                "input_ids": [7, 8],
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 8, "stop_token_ids": [STOP]},
            },
        )
    )
    assert status == 200
    meta = reply["meta_info"]
    assert reply["output_ids"] == [8, 7, STOP]
    assert meta["finish_reason"] == {"type": "stop", "matched": STOP}
    assert [p[1] for p in meta["output_token_logprobs"]] == [8, 7, STOP]

    client = SGLangClient(server.url)

    async def admin():
        try:
            info = await client.get_model_info()
            await client.update_weights_from_disk("/tmp/ckpt/v3", version=3)
            return info, await client.get_model_info()
        finally:
            await client.aclose()

    before, after = run(admin())
    assert before[0]["model_path"] == "scripted" and after[0]["weight_version"] == "3"
    assert server.loaded == ["/tmp/ckpt/v3"] and server.engine.weight_versions == [3]
    status, reply = run(_post(server.url, "/update_weights_from_disk", {}))
    assert status == 400 and "model_path" in reply["error"]["message"]


def test_engine_failure_is_500_and_server_survives():
    def flaky(ids, request):
        if ids == [0]:
            raise RuntimeError("boom")
        return [1]

    with serve_in_thread(ScriptedEngine(flaky)) as s:
        status, reply = run(_post(s.url, "/generate", {"input_ids": [0]}))
        assert status == 500 and "boom" in reply["error"]["message"]
        status, reply = run(_post(s.url, "/generate", {"input_ids": [3]}))
        assert status == 200 and reply["output_ids"] == [1]


def test_killed_server_retries_then_raises_clearly():
    engine = ScriptedEngine(echo_policy, latency_s=0.5)
    server = serve_in_thread(engine)
    client = SGLangClient(server.url, settings=ServerPoolSettings(max_retries=2, backoff_s=0.01))

    async def go():
        try:
            task = asyncio.create_task(client.generate([GenerateRequest([1, 2])] * 3))
            await asyncio.sleep(0.2)  # the request is in flight when the server dies
            await asyncio.to_thread(server.stop, abrupt=True)
            return await task
        finally:
            await client.aclose()

    with pytest.raises(RolloutServerError, match="failed after 3 attempts") as info:
        run(go())
    assert server.url in str(info.value)


def test_unreachable_server_one_clear_error():
    client = SGLangClient(
        "http://127.0.0.1:9", settings=ServerPoolSettings(max_retries=1, backoff_s=0.01)
    )

    async def go():
        try:
            return await client.health(), await client.generate([GenerateRequest([1])])
        finally:
            await client.aclose()

    with pytest.raises(RolloutServerError, match="unreachable"):
        run(go())


def test_client_needs_exactly_one_address():
    with pytest.raises(ValueError, match="either urls"):
        SGLangClient()
    with pytest.raises(ValueError, match="either urls"):
        SGLangClient("http://a", router_url="http://b")


class CountingEngine(ScriptedEngine):
    """Counts flushes; refuses them while `busy` (as SGLang does with requests running)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.flushes, self.busy = 0, False

    async def flush_cache(self) -> bool:
        self.flushes += 1
        return not self.busy


def test_client_ids_are_unique_per_attempt_and_weights_sync_without_a_flush():
    engine = CountingEngine(echo_policy, latency_s=0.3)
    with serve_in_thread(engine, weight_loader=lambda path: {"path": path}) as s:
        client = SGLangClient(s.url)
        same = [GenerateRequest([1, 2], SamplingParams(max_new_tokens=4), request_id="task/0/1")]

        async def go():
            try:
                # The agent loop's ids repeat; a server refuses an id in flight.
                both = await asyncio.gather(client.generate(same), client.generate(same))
                await client.update_weights_from_disk("/w/v3", version=3)
                after = await client.generate(same)
                engine.busy = True
                flushed = await client.flush_cache()
                return both, after, flushed
            finally:
                await client.aclose()

        both, [after], flushed = run(go())
    rids = [r.request_id for r in engine.requests if r.input_ids != [0]]
    assert len(set(rids)) == 3 and all(r.startswith("task/0/1-") for r in rids)
    assert all(c.weight_version == 0 for [c] in both) and after.weight_version == 3
    assert engine.flushes == 1 and flushed is False  # only the explicit one; a 400 is no error


def test_a_server_out_during_a_sync_serves_nothing_until_it_has_caught_up():
    engines = [ScriptedEngine(echo_policy) for _ in range(2)]
    loaded = [[], []]
    threads = [
        serve_in_thread(e, weight_loader=lambda path, i=i: loaded[i].append(path) or {})
        for i, e in enumerate(engines)
    ]
    a, b = (t.url for t in threads)
    client = SGLangClient([a, b], settings=ServerPoolSettings(max_retries=1, backoff_s=0.01))
    request = GenerateRequest([1, 2], SamplingParams(max_new_tokens=2))

    async def go():
        try:
            client.pool.mark_down(b, "failed its /health check")
            await client.update_weights_from_disk("/w/v3", version=3)
            out = client.pool.down()[b]
            served = await client.generate([request] * 4)
            versions = await client.weight_versions()
            healthy = await client.health()  # b answers: loads v3 first, then is back
            return out, served, versions, healthy, await client.weight_versions()
        finally:
            await client.aclose()

    try:
        out, served, versions, healthy, after = run(go())
    finally:
        for t in threads:
            t.stop()
    assert "out during the sync to version 3" in out
    assert loaded == [["/w/v3"], ["/w/v3"]]
    assert [c.weight_version for c in served] == [3] * 4  # none from b's old weights
    assert versions == {a: "3", b: "0"}
    assert healthy and after == {a: "3", b: "3"} and client.pool.healthy() == [a, b]


def test_a_server_dead_at_start_up_is_taken_out_by_the_first_sync_and_the_other_serves():
    thread = serve_in_thread(ScriptedEngine(echo_policy), weight_loader=lambda path: {})
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = SGLangClient(
        [dead, thread.url], settings=ServerPoolSettings(max_retries=1, backoff_s=0.01)
    )

    async def go():
        try:
            await client.update_weights_from_disk("/w/v1", version=1)
            served = await client.generate([GenerateRequest([1, 2])] * 2)
            return client.pool.down(), served
        finally:
            await client.aclose()

    try:
        down, served = run(go())
    finally:
        thread.stop()
    assert list(down) == [dead] and "weight sync to version 1 failed" in down[dead]
    assert [c.weight_version for c in served] == [1, 1]


def test_with_every_server_stale_generate_fails_naming_why():
    client = SGLangClient(
        ["http://127.0.0.1:9", "http://127.0.0.1:10"], settings=ServerPoolSettings(max_retries=1)
    )
    for url in client.urls:
        client.pool.mark_down(url, f"weight sync to version 2 failed at {url}", stale=True)

    async def go():
        try:
            return await client.generate([GenerateRequest([1])])
        finally:
            await client.aclose()

    with pytest.raises(RolloutServerError, match="no rollout server can serve") as error:
        run(go())
    assert "failed at http://127.0.0.1:10" in str(error.value)


def test_a_session_whose_event_loop_ended_is_closed_not_leaked(server, caplog):
    # The training loop calls the client from a fresh event loop each time
    # (run_sync): each call's session is closed once its loop has ended.
    import gc

    client = SGLangClient(server.url)
    request = GenerateRequest([1, 2], SamplingParams(stop_token_ids=(STOP,)))
    sessions = []
    for _ in range(3):

        async def go():
            out = await client.generate([request])
            sessions.append(client._session)
            return out

        assert run(go())[0].output_ids == [2, 1, STOP]
    client.close()
    gc.collect()
    assert all(s.closed for s in sessions) and len(set(map(id, sessions))) == 3
    assert not [r for r in caplog.records if "Unclosed client session" in r.getMessage()]
