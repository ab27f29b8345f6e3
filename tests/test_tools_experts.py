"""OpenAI-compatible expert client against a local aiohttp server; simulated experts."""

import asyncio

import pytest
from aiohttp import web

from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.experts import prompts
from orchestra_jax.tools.experts.client import ExpertError, OpenAIChatExpert
from orchestra_jax.tools.experts.simulated import SimulatedExpert

OK_BODY = {
    "choices": [{"message": {"role": "assistant", "content": "Final answer: 4"}}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 5},
}


async def serve(statuses, seen):
    """Answers each POST with the next status (200 = OK_BODY)."""
    queue = list(statuses)

    async def handler(request):
        seen.append((await request.json(), request.headers.get("Authorization")))
        status = queue.pop(0) if queue else 200
        if status == 200:
            return web.json_response(OK_BODY)
        return web.Response(status=status, text=f"status {status}")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/v1"


def run_against(statuses, **client_kwargs):
    async def go():
        seen = []
        runner, url = await serve(statuses, seen)
        try:
            client = OpenAIChatExpert(url, "test-model", backoff_s=0.01, **client_kwargs)
            try:
                return await client.complete(
                    [{"role": "user", "content": "2+2?"}], max_tokens=8, temperature=0.0
                ), seen
            except ExpertError as e:
                return e, seen
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_retries_5xx_then_succeeds(monkeypatch):
    monkeypatch.setenv("TEST_EXPERT_KEY", "k123")
    reply, seen = run_against([503, 500], api_key_env="TEST_EXPERT_KEY", retries=3)
    assert reply.text == "Final answer: 4"
    assert (reply.prompt_tokens, reply.completion_tokens) == (11, 5)
    assert reply.latency_s > 0 and len(seen) == 3
    body, auth = seen[-1]
    assert auth == "Bearer k123" and body["model"] == "test-model"
    assert body["max_tokens"] == 8 and body["messages"][0]["content"] == "2+2?"


def test_reasoning_models_get_max_completion_tokens_and_no_temperature():
    reply, seen = run_against([], api_key_env=None, reasoning_model=True)
    body, _ = seen[0]
    assert reply.text == "Final answer: 4"
    assert body["max_completion_tokens"] == 8 and "max_tokens" not in body
    assert "temperature" not in body


def test_gives_up_with_a_clear_error():
    error, seen = run_against([502] * 10, api_key_env=None, retries=2)
    assert isinstance(error, ExpertError) and len(seen) == 3
    assert "3 attempt" in str(error) and "HTTP 502" in str(error)
    assert "test-model" in str(error)


def test_client_errors_are_not_retried():
    error, seen = run_against([400], api_key_env=None, retries=3)
    assert isinstance(error, ExpertError) and len(seen) == 1 and "HTTP 400" in str(error)


def test_connection_refused_is_reported():
    async def go():
        client = OpenAIChatExpert(
            "http://127.0.0.1:9/v1", "m", api_key_env=None, retries=1, backoff_s=0.01, timeout=2
        )
        with pytest.raises(ExpertError, match="2 attempt"):
            await client.complete([{"role": "user", "content": "x"}], max_tokens=4, temperature=0.0)

    asyncio.run(go())


def test_missing_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ExpertError, match="NO_SUCH_KEY_VAR"):
        OpenAIChatExpert("http://127.0.0.1:9/v1", "m", api_key_env="NO_SUCH_KEY_VAR")


def test_simulated_expert_skill_and_evidence():
    task = Task(
        "x",
        "Q?",
        "gold",
        "exact",
        "facts",
        {"evidence": "the gold fact", "distractors": ["d1", "d2"]},
    )
    expert = SimulatedExpert("s", {"facts": 0.0}, reading_skill=1.0, mean_latency_s=5.0)
    messages = prompts.role_messages("answer", task.question)

    def answer(ctx):
        reply = asyncio.run(expert.complete(messages, max_tokens=64, temperature=0.0, ctx=ctx))
        return prompts.extract_final_answer(reply.text), reply

    wrong, reply = answer(ToolContext(task=task, seed=1))
    assert wrong in ("d1", "d2") and reply.latency_s > 0 and reply.prompt_tokens > 0
    right, _ = answer(ToolContext(task=task, seed=1, documents=["here is the gold fact."]))
    assert right == "gold"
    assert answer(ToolContext(task=task, seed=1))[0] == wrong  # seeded
    with pytest.raises(ExpertError, match="ToolContext"):
        asyncio.run(expert.complete(messages, max_tokens=8, temperature=0.0))


def test_simulated_expert_sleeps_latency_times_scale(monkeypatch):
    slept = []

    async def fake_sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    task = Task("x", "Q?", "gold")
    expert = SimulatedExpert("s", {}, mean_latency_s=0.2, latency_sigma=0.0, sleep_scale=0.5)
    reply = asyncio.run(
        expert.complete(prompts.role_messages("answer", "Q?"), ctx=ToolContext(task=task))
    )
    assert reply.latency_s == pytest.approx(0.2)
    assert slept == [pytest.approx(0.1)]
