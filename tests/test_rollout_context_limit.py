"""The servers' context against the agent's: a server serving less than
`agent.max_context_tokens` is refused at start-up, naming both numbers; a request a
server refuses for context length is the policy's context stop, not a failure of
the server."""

import asyncio
from typing import Any

import pytest
from aiohttp import web

from orchestra_jax.agent.loop import LoopLimits, run_episodes_sync
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http.client import (
    RefusedRequest,
    RolloutServerError,
    refused_for_context,
)
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.sglang_client import SGLangClient
from orchestra_jax.rollout.http.vllm_client import VLLMClient
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import ServerConfig, serve_in_thread
from orchestra_jax.training.builders import build_engine
from tests.test_agent_loop import SAMPLING, TOK, FakeTool, spec

SETTINGS = ServerPoolSettings(max_retries=0, backoff_s=0.01)


def echo(ids, request):
    out = [7] * request.sampling.max_new_tokens
    return out, [-0.1] * len(out)


def request(prompt_len, max_new):
    return GenerateRequest(list(range(1, prompt_len + 1)), SamplingParams(max_new_tokens=max_new))


def test_a_vllm_server_with_a_shorter_max_model_len_is_refused_naming_both():
    async def models(_):
        return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

    async def go():
        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        client = VLLMClient(url, settings=SETTINGS, max_context_tokens=8192)
        try:
            await client.check_servers()
        finally:
            await client.aclose()
            await runner.cleanup()

    with pytest.raises(RolloutServerError, match=r"4096 tokens.*max_context_tokens=8192"):
        asyncio.run(go())


def test_our_server_reports_its_context_and_the_sglang_client_checks_it():
    with serve_in_thread(ScriptedEngine(echo), ServerConfig(context_len=64)) as s:
        short = SGLangClient(s.url, settings=SETTINGS, max_context_tokens=128)
        with pytest.raises(RolloutServerError, match=r"64 tokens.*max_context_tokens=128"):
            asyncio.run(short.generate([request(3, 2)]))
        enough = SGLangClient(s.url, settings=SETTINGS, max_context_tokens=64)
        assert asyncio.run(enough.generate([request(3, 2)]))[0].output_ids == [7, 7]


def test_a_refusal_for_context_answers_that_request_only_and_is_no_server_error():
    with serve_in_thread(ScriptedEngine(echo), ServerConfig(context_len=16)) as s:
        client = SGLangClient(s.url, settings=SETTINGS)

        async def go():
            try:
                out = await client.generate([request(4, 2), request(12, 8), request(3, 1)])
                return out, client.take_metrics()
            finally:
                await client.aclose()

        (fits, over, small), metrics = asyncio.run(go())
    assert fits.output_ids == [7, 7] and small.output_ids == [7]
    assert over.finish_reason == "context" and over.output_ids == []
    assert metrics["0/errors"] == 0 and client.pool.healthy() == [s.url]


def test_an_episode_the_server_cannot_hold_ends_as_a_context_stop_not_an_infra_failure():
    """The agent's budget (4096) is longer than the server's context (the first prompt
    plus 40 tokens): the turn that would not fit ends the episode as "context"."""
    think = FakeTool("think")

    def policy(ids, req):
        out = TOK.encode('<tool_call>\n{"name": "think", "arguments": {"q": "more"}}\n</tool_call>')
        out = (out + [TOK.im_end_id])[: req.sampling.max_new_tokens]
        return out, [-0.1] * len(out)

    probe = run_episodes_sync(
        [spec([think])], ScriptedEngine(policy), TOK, sampling=SAMPLING, limits=LoopLimits()
    )[0]
    first_prompt = list(probe.loss_mask).index(1)  # the tokens before the first sampled one
    limits = LoopLimits(max_context_tokens=4096, max_new_tokens_per_turn=32, max_turns=20)
    with serve_in_thread(ScriptedEngine(policy), ServerConfig(context_len=first_prompt + 40)) as s:
        client = SGLangClient(s.url, settings=SETTINGS)
        [traj] = run_episodes_sync([spec([think])], client, TOK, sampling=SAMPLING, limits=limits)
        client.close()
    assert traj.finish_reason == "context" and traj.infra_failure is None
    assert 1 <= len(traj.turns) < 20 and len(traj.token_ids) <= first_prompt + 40


def test_a_config_passes_the_agent_budget_and_the_key_variable_to_the_client():
    from experiments.configs.grpo_hle import get_config

    config = get_config("demo")
    rollout: Any = config.rollout
    agent: Any = config.agent
    rollout.engine, rollout.urls, rollout.weights_dir = "sglang", "http://127.0.0.1:1", "/w"
    rollout.api_key_env = "MY_KEY_VARIABLE"
    agent.max_context_tokens = 3000
    client = build_engine(config, None, None)
    assert isinstance(client, SGLangClient)
    assert client.max_context_tokens == 3000 and client.api_key_env == "MY_KEY_VARIABLE"


@pytest.mark.parametrize(
    "message",
    [  # vLLM 0.32's two wordings, SGLang's (and rollout/server/app.py's) two
        "This model's maximum context length is 4096 tokens. However, you requested 100 "
        "output tokens and your prompt contains 4000 input tokens, for a total of 4100 tokens.",
        "The decoder prompt (length 5000) is longer than the maximum model length of 4096.",
        "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        "Requested token count exceeds the model's maximum context length of 4096 tokens.",
    ],
)
def test_the_servers_context_refusals_are_recognised(message):
    assert refused_for_context(RefusedRequest(f"POST /x -> 400: {message}", 400))
    assert not refused_for_context(RefusedRequest(f"POST /x -> 404: {message}", 404))
    assert not refused_for_context(RefusedRequest("POST /x -> 400: top_p must be > 0", 400))
