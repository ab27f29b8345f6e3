"""The SGLang client against a loopback aiohttp server that sends malformed replies.

Every reply that does not follow the wire format (not JSON under a JSON content
type, a token/log-prob pair of the wrong shape, an output token without a
log-probability) is a server fault: retried like a dead server, then one
`RolloutServerError` naming it; never a raw exception, never a NaN.
"""

import asyncio
import json
import re

import pytest
from aiohttp import web

from orchestra_jax.rollout.engine import GenerateRequest
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.sglang_client import RolloutServerError, SGLangClient


def generate_reply(pairs):
    meta = {"output_token_logprobs": pairs, "finish_reason": {"type": "length"}, "prompt_tokens": 1}
    return [{"text": "", "output_ids": [], "meta_info": meta}]


GOOD = json.dumps(generate_reply([[-0.5, 7, None], [-0.25, 8, None]]))


async def generate_against(bodies, *, content_type="application/json"):
    """Generates one completion from a server that answers /generate with `bodies` in
    turn (the last one thereafter); returns (completions or the error, attempts)."""
    attempts = []

    async def handle(request):
        attempts.append(await request.json())
        body = bodies[min(len(attempts), len(bodies)) - 1]
        return web.Response(text=body, content_type=content_type)

    app = web.Application()
    app.router.add_post("/generate", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = SGLangClient(
        f"http://127.0.0.1:{port}", settings=ServerPoolSettings(max_retries=2, backoff_s=0.01)
    )
    try:
        return await client.generate([GenerateRequest([1])]), len(attempts)
    except Exception as e:  # noqa: BLE001 - the test looks at which exception it is
        return e, len(attempts)
    finally:
        await client.aclose()
        await runner.cleanup()


MALFORMED = {
    "not JSON under a JSON content type": ('{"meta_info": ', "reply is not valid JSON"),
    "a missing output log-prob": (
        json.dumps(generate_reply([[-0.5, 7, None], [None, 8, None]])),
        r"output_token_logprobs\[1\] has no log-probability \(null\)",
    ),
    "a pair without its token id": (
        json.dumps(generate_reply([[-0.5]])),
        r"output_token_logprobs\[0\] is \[-0.5\], not \[logprob, id, ...\]",
    ),
    "a null token id": (
        json.dumps(generate_reply([[-0.5, None, None]])),
        r"token id None is not a non-negative integer",
    ),
    "a number for a pair": (json.dumps(generate_reply([3])), r"is 3, not \[logprob, id"),
    "a string log-prob": (
        json.dumps(generate_reply([["-0.5", 7, None]])),
        r"log-probability '-0.5' is not a number",
    ),
    "a NaN log-prob": (
        json.dumps(generate_reply([[float("nan"), 7, None]])),
        r"log-probability nan is not",
    ),
    "a map for the batch": (json.dumps({"error": "?"}), r"/generate returned dict for 1 prompts"),
    "pairs that are a map": (json.dumps(generate_reply({"a": 1})), r"is map, not a list"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_reply_is_retried_then_reported(case):
    body, message = MALFORMED[case]
    error, attempts = asyncio.run(generate_against([body]))
    assert isinstance(error, RolloutServerError), repr(error)
    assert attempts == 3  # retried as a dead server is, then reported
    assert "failed after 3 attempts" in str(error) and "malformed reply" in str(error)
    assert re.search(message, str(error)), str(error)


def test_a_malformed_reply_then_a_good_one_gives_the_good_one():
    completions, attempts = asyncio.run(generate_against(['{"meta_info": ', GOOD]))
    assert attempts == 2
    [completion] = completions
    assert completion.output_ids == [7, 8] and completion.logprobs == [-0.5, -0.25]
