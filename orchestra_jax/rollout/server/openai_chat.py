"""OpenAI `/v1/chat/completions` on top of a RolloutEngine, as SGLang serves Qwen3.

Messages are rendered with the project's Qwen3 chat template
(`orchestra_jax.chat.template.render`, generation prompt added), tokenised and
generated until `<|im_end|>`, the tokenizer's end of text, or a stop. The reply is
parsed as SGLang does with `--reasoning-parser qwen3 --tool-call-parser qwen25`:
the text before the first `</think>` is `reasoning_content`, `<tool_call>` blocks
naming one of the request's tools become `tool_calls` (parsed by
`chat.tool_calls.parse_tool_calls`) with finish reason "tool_calls", the rest is
`content`. `usage` counts prompt and completion tokens (all choices), which the
expert tools turn into cost.

Body fields: messages (roles system, developer (as system), user, assistant with
content / reasoning_content / tool_calls, tool; content a string or text parts),
tools, tool_choice ("none": tools neither shown nor parsed; "auto"; "required"
or a named function: the reply is started with `<tool_call>` (and the name), so
it opens with a call, without reasoning), parallel_tool_calls, max_tokens |
max_completion_tokens (0 allowed; null: up to the context), temperature, top_p,
top_k, min_p, frequency/presence/repetition_penalty, seed (parallel choices use
seed + i), n, stop (a string or up to 32), stop_token_ids, ignore_eos, logprobs,
top_logprobs, response_format {"type": "text"}, chat_template_kwargs
(enable_thinking), separate_reasoning, skip_special_tokens; model, user,
metadata, store, stream_options are accepted and ignored. What this server cannot
do (stream, response_format json, logit_bias, images or audio) is a 400 naming
the field, as are values of the wrong type; unknown fields are ignored, as
SGLang ignores them.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

from orchestra_jax.chat.tool_calls import THINK_CLOSE, THINK_OPEN, ToolCall, parse_tool_calls
from orchestra_jax.rollout.engine import Completion, GenerateRequest, RolloutEngine
from orchestra_jax.rollout.http import sglang_protocol as proto
from orchestra_jax.rollout.http.sglang_protocol import RequestError

_NUMBERS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty")
_INTEGERS = ("max_tokens", "max_completion_tokens", "top_k", "seed", "n", "top_logprobs")
_BOOLS = ("logprobs", "ignore_eos", "parallel_tool_calls", "separate_reasoning", "stream")
_BOOLS += ("skip_special_tokens",)
_REFUSED = {"logit_bias": "logit_bias", "functions": "functions (use tools)"}
_ROLES = ("system", "developer", "user", "assistant", "tool")


def _bad(field: str, message: str) -> RequestError:
    return RequestError(f"{field}: {message}", param=field)


def _integer(field: str, value: Any) -> int | None:
    """An integer field, as pydantic's lax mode reads it (2.0 is 2; 1.5 and True are not)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(field, f"must be an integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise _bad(field, f"must be an integer, got {value!r}")
    return int(value)


def _check_types(body: dict) -> None:
    for field in _NUMBERS + ("repetition_penalty",):
        value = body.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise _bad(field, f"must be a number, got {value!r}")
    for field in _INTEGERS:
        _integer(field, body.get(field))
    for field in _BOOLS:
        if body.get(field) is not None and not isinstance(body[field], bool):
            raise _bad(field, f"must be a boolean, got {body[field]!r}")
    for field, what in _REFUSED.items():
        if body.get(field) not in (None, {}, []):
            raise _bad(field, f"{what} is not supported by this server")
    if body.get("stream"):
        raise _bad("stream", "stream=true is not supported by this server's chat endpoint")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise _bad("response_format", 'only {"type": "text"} is supported by this server')
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise _bad("stop", f"must be a string or a list of strings, got {stop!r}")
    ids = body.get("stop_token_ids")
    if ids is not None and not (isinstance(ids, list) and all(proto._is_int(t) for t in ids)):
        raise _bad("stop_token_ids", f"must be a list of integers, got {ids!r}")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _bad("chat_template_kwargs", "must be an object")


def _messages(body: dict) -> list[dict]:
    """The messages, checked and normalised for the template (developer -> system,
    text parts joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _bad(field, f"must be an object with a role among {_ROLES}")
        m = dict(m)
        if m["role"] == "developer":
            m["role"] = "system"
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in ("text", "input_text") or not isinstance(part.get("text"), str):
                    raise _bad(f"{field}.content", f"part of type {kind!r} is not supported here")
                texts.append(part["text"])
            m["content"] = " ".join(texts)
        elif content is not None and not isinstance(content, str):
            raise _bad(f"{field}.content", "must be a string, a list of text parts or null")
        elif content is None and m["role"] != "assistant":
            raise _bad(f"{field}.content", "is required")
        out.append(m)
    return out


def _tools(body: dict) -> tuple[list[dict] | None, str | None, bool]:
    """(tools for the template, the forced function name or "" for any, parse calls?)."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict)
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str)
            for t in tools
        ):
            raise _bad("tools", 'must be a list of {"type": "function", "function": {"name", ...}}')
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto" if tools else "none"
    names = [t["function"]["name"] for t in tools or []]
    if choice == "none":
        return None, None, False
    if choice == "auto":
        return tools or None, None, bool(tools)
    if not tools:
        raise _bad("tool_choice", f"{choice!r} needs tools")
    if choice == "required":
        return tools, "", True
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise _bad("tool_choice", 'must be "none", "auto", "required" or a named function')
    if name not in names:
        raise _bad("tool_choice", f"function {name!r} is not among the tools {names}")
    return tools, name, True


def split_reply(text: str) -> tuple[str | None, str]:
    """(reasoning, content): reasoning ends at the first `</think>` (an unclosed `<think>`
    at the start makes it all reasoning); no think tags: no reasoning."""
    if THINK_CLOSE in text:
        before, _, after = text.partition(THINK_CLOSE)
        return before.split(THINK_OPEN, 1)[-1].strip(), after.lstrip("\n")
    if text.lstrip().startswith(THINK_OPEN):
        return text.split(THINK_OPEN, 1)[1].strip(), ""
    return None, text


def _without_calls(content: str, calls: list[ToolCall]) -> str:
    """`content` without the blocks of `calls` (in the order parsed), in one pass."""
    kept, pos = [], 0
    for call in calls:
        start = content.find(call.raw, pos)
        kept.append(content[pos:start])
        pos = start + len(call.raw)
    return "".join(kept) + content[pos:]


def _tool_call_json(i: int, call: ToolCall) -> dict:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "index": i,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
        },
    }


def _logprobs_json(tokenizer, completion: Completion, count: int, top: int) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text = tokenizer.decode([token_id])
        return {"token": text, "bytes": list(text.encode("utf-8")), "logprob": logprob}

    content = []
    for k in range(count):
        item = entry(completion.output_ids[k], completion.logprobs[k])
        rows = completion.top_logprobs[k] if completion.top_logprobs else []
        item["top_logprobs"] = [entry(t, lp) for t, lp in rows[:top]]
        content.append(item)
    return {"content": content, "refusal": None}


async def chat_completion(
    engine: RolloutEngine,
    tokenizer,
    body: Any,
    *,
    model_name: str,
    limits: proto.ServerLimits,
) -> dict[str, Any]:
    """Answer one OpenAI chat-completions body; RequestError (a 400) for a bad request."""
    from orchestra_jax.chat.template import render

    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    _check_types(body)
    messages = _messages(body)
    tools, forced, parse_calls = _tools(body)
    kwargs = body.get("chat_template_kwargs") or {}
    try:
        prompt = render(
            messages,
            tools=tools,
            add_generation_prompt=True,
            enable_thinking=kwargs.get("enable_thinking", True) is not False,
        )
    except ValueError as e:
        raise _bad("messages", str(e)) from None
    prefix = ""
    if forced is not None:  # "required" or a named function: the reply opens with a call
        prefix = "<tool_call>\n" + (f'{{"name": "{forced}", "arguments": ' if forced else "")
    prompt_ids = tokenizer.encode(prompt + prefix)
    n = _integer("n", body.get("n")) or 1
    if n < 1:
        raise _bad("n", f"must be at least 1, got {n}")
    if n > limits.max_batch_prompts:
        raise _bad(
            "n",
            f"must be at most {limits.max_batch_prompts} on this server",
        )
    top = _integer("top_logprobs", body.get("top_logprobs")) or 0
    if not 0 <= top <= limits.max_top_logprobs:
        raise _bad("top_logprobs", f"must be in [0, {limits.max_top_logprobs}], got {top}")
    max_tokens = _integer("max_completion_tokens", body.get("max_completion_tokens"))
    if max_tokens is None:
        max_tokens = _integer("max_tokens", body.get("max_tokens"))
    stop_ids = set(body.get("stop_token_ids") or [])
    if not body.get("ignore_eos"):  # the turn ends at <|im_end|> (Qwen3's eos)
        stop_ids |= {tokenizer.im_end_id, tokenizer.eos_id}
    sampling = {
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "top_k": _integer("top_k", body.get("top_k")),
        "min_p": body.get("min_p"),
        "frequency_penalty": body.get("frequency_penalty"),
        "presence_penalty": body.get("presence_penalty"),
        "repetition_penalty": body.get("repetition_penalty"),
        "max_new_tokens": max_tokens,
        "stop": body.get("stop"),
        "stop_token_ids": sorted(stop_ids),
        "ignore_eos": body.get("ignore_eos"),
        "sampling_seed": _integer("seed", body.get("seed")),
    }
    params = proto.sampling_params_from_json(
        {k: v for k, v in sampling.items() if v is not None}, len(prompt_ids), limits
    )
    seed = params.seed
    requests = [
        GenerateRequest(
            prompt_ids,
            dataclasses.replace(
                params, seed=None if seed is None else (seed + i) % proto.SEED_SPACE
            ),
            top_logprobs_num=top if body.get("logprobs") else 0,
        )
        for i in range(n)
    ]
    try:
        completions = await engine.generate(requests)
    except ValueError as e:
        raise RequestError(str(e)) from None
    names = [t["function"]["name"] for t in tools or []]
    choices = []
    for index, c in enumerate(completions):
        ids = c.output_ids
        if (
            c.finish_reason == "stop"
            and isinstance(c.matched_stop, int)
            and ids[-1:] == [c.matched_stop]
        ):
            ids = ids[:-1]
        text = prefix + tokenizer.decode(ids, skip_special_tokens=False)
        if c.finish_reason == "stop" and isinstance(c.matched_stop, str):
            text = text[: text.find(c.matched_stop)] if c.matched_stop in text else text
        reasoning, content = split_reply(text)
        if body.get("separate_reasoning") is False and reasoning is not None:
            reasoning, content = None, text
        calls = []
        if parse_calls:
            calls = [
                item
                for item in parse_tool_calls(content)
                if isinstance(item, ToolCall) and item.name in names
            ]
            if body.get("parallel_tool_calls") is False:
                calls = calls[:1]
            content = _without_calls(content, calls).strip()
        finish = c.finish_reason
        if calls and finish == "stop":
            finish = "tool_calls"
        message = {
            "role": "assistant",
            "content": content if content or not calls else None,
            "reasoning_content": reasoning,
            "tool_calls": [_tool_call_json(i, call) for i, call in enumerate(calls)] or None,
        }
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": _logprobs_json(tokenizer, c, len(ids), top)
                if body.get("logprobs")
                else None,
                "finish_reason": finish,
                "matched_stop": c.matched_stop,
            }
        )
    completion_tokens = sum(c.completion_tokens for c in completions)
    prompt_tokens = len(prompt_ids)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
