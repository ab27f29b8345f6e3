"""OpenAI `/v1/chat/completions` on top of a RolloutEngine.

Messages are rendered with the project's Qwen3 chat template
(`orchestra_jax.chat.template.render`, generation prompt added), tokenised, and
generated until `<|im_end|>` or the tokenizer's end-of-text.  The reply text is
the decoded output without that stop token.  `usage` counts prompt and
completion tokens, which the expert tools turn into cost.

Supported body fields: model, messages, max_tokens | max_completion_tokens,
temperature, top_p, top_k, seed, n (= 1), stream (= false), tools,
chat_template_kwargs.enable_thinking.  Anything else that would change the
output (stop strings, penalties, logprobs) is refused with a 400.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from orchestra_jax.rollout.engine import GenerateRequest, RolloutEngine, SamplingParams

_IGNORED = {"model", "user", "stream_options", "parallel_tool_calls", "tool_choice"}
_SUPPORTED = {
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "n",
    "stream",
    "tools",
    "chat_template_kwargs",
} | _IGNORED
DEFAULT_MAX_TOKENS = 512


def _sampling(body: dict, stop_ids: tuple[int, ...]) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise ValueError(f"max_tokens must be an integer, got {max_tokens!r}")

    def field(name, default):  # OpenAI clients send null for "unset"
        value = body.get(name)
        return default if value is None else value

    return SamplingParams(
        temperature=float(field("temperature", 1.0)),
        top_p=float(field("top_p", 1.0)),
        top_k=int(field("top_k", -1)),
        max_new_tokens=max_tokens,
        stop_token_ids=stop_ids,
        seed=body.get("seed"),
    )


def _validate(body: Any) -> None:
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    unknown = set(body) - _SUPPORTED
    if unknown:
        raise ValueError(f"unsupported fields for /v1/chat/completions: {sorted(unknown)}")
    if body.get("stream"):
        raise ValueError("stream=true is not supported by this server")
    if body.get("n", 1) != 1:
        raise ValueError("only n=1 is supported")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        if m.get("content") is not None and not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}].content must be a string")


async def chat_completion(
    engine: RolloutEngine, tokenizer, body: Any, *, model_name: str
) -> dict[str, Any]:
    """Answer one OpenAI chat-completions body; ValueError for a bad request."""
    from orchestra_jax.chat.template import render

    _validate(body)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}:
        raise ValueError("chat_template_kwargs supports only enable_thinking")
    prompt = render(
        body["messages"],
        tools=body.get("tools"),
        add_generation_prompt=True,
        enable_thinking=bool(kwargs.get("enable_thinking", True)),
    )
    prompt_ids = tokenizer.encode(prompt)
    stop_ids = tuple(sorted({tokenizer.im_end_id, tokenizer.eos_id}))
    [completion] = await engine.generate([GenerateRequest(prompt_ids, _sampling(body, stop_ids))])
    ids = completion.output_ids
    if completion.finish_reason == "stop" and ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": tokenizer.decode(ids)},
                "finish_reason": "length" if completion.finish_reason == "length" else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        },
    }
