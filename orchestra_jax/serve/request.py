"""A chat-completions body read into what one orchestration needs (docs/serving.md).

Everything is checked before anything runs: a bad body is a `BadRequest` (its HTTP
status and the field at fault), never an episode that fails later.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra_jax.tools.config import ToolConfig
from orchestra_jax.tools.meta_tool_table import is_meta_tool

# OpenAI fields the orchestrator cannot honour: it calls its own tools, answers in text.
REFUSED_FIELDS = ("tools", "tool_choice", "functions", "function_call", "logprobs",
                  "top_logprobs", "response_format")  # fmt: skip
ANSWER_TOOL = "answer"


class BadRequest(Exception):
    """A request the service refuses: `status` (400, 413), the `param` at fault."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


@dataclasses.dataclass(frozen=True)
class Defaults:
    """What a request may change and what it gets when it does not."""

    tool_config: ToolConfig
    max_turns: int
    max_new_tokens_per_turn: int


@dataclasses.dataclass(frozen=True)
class OrchestrationRequest:
    """One request: the question, its tool configuration (preference and tools
    applied), its budgets and sampling overrides (None: the config's)."""

    question: str
    tool_config: ToolConfig
    max_turns: int
    max_cost_usd: float | None = None
    max_new_tokens_per_turn: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                raise BadRequest(f"{where}: only text content parts are read", param="messages")
            if not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}: a text part needs a string 'text'", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"{where}: content must be a string or a list of text parts", param="messages")


def question_of(messages: Any) -> str:
    """The question: the last message (role user), after the earlier user and
    assistant messages as `User: …` / `Assistant: …` lines."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    lines = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise BadRequest(f"messages[{i}] must be an object", param="messages")
        role = message.get("role")
        if role == "system":
            raise BadRequest(
                "system messages are refused: the orchestrator's system prompt is its tool "
                "configuration's (set `preference` instead)",
                param="messages",
            )
        if role not in ("user", "assistant"):
            raise BadRequest(f"messages[{i}]: role must be user or assistant", param="messages")
        lines.append((role, _text(message.get("content"), f"messages[{i}]")))
    if lines[-1][0] != "user":
        raise BadRequest("the last message must have role user", param="messages")
    *before, (_, question) = lines
    if not question.strip():
        raise BadRequest("the question (the last message) is empty", param="messages")
    if not before:
        return question
    said = "\n".join(f"{role.capitalize()}: {text}" for role, text in before)
    return f"Conversation so far:\n{said}\n\nUser: {question}"


def _number(body: Mapping[str, Any], name: str, *, low: float, high: float | None = None):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"{name} must be a finite number", param=name)
    if value < low or (high is not None and value > high):
        bound = f"in [{low:g}, {high:g}]" if high is not None else f">= {low:g}"
        raise BadRequest(f"{name} must be {bound}, got {value}", param=name)
    return value


def _integer(body: Mapping[str, Any], name: str, *, low: int, high: int | None = None):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer", param=name)
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise BadRequest(f"{name} must be {bound}, got {value}", param=name)
    return value


def with_preference(config: ToolConfig, preference: Any) -> ToolConfig:
    """`config` with `preference` (feature -> weight >= 0) stated in its prompt."""
    if not isinstance(preference, Mapping) or not preference:
        raise BadRequest(
            "preference must be a non-empty object {feature: weight}", param="preference"
        )
    valid = config.feature_names()
    for feature, weight in preference.items():
        if feature not in valid:
            raise BadRequest(
                f"unknown preference feature {feature!r}; valid: {valid}", param="preference"
            )
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not math.isfinite(weight)
            or weight < 0
        ):
            raise BadRequest(
                f"preference[{feature!r}] must be a finite number >= 0", param="preference"
            )
    weights = {str(k): float(v) for k, v in preference.items()}
    return dataclasses.replace(config, preference=weights, preference_text=None)


def with_tools(config: ToolConfig, allowed: Any) -> ToolConfig:
    """`config` restricted to `allowed` tool names and model aliases (docs/serving.md:
    a tool stays when named, with its aliases, or when one of its aliases is named,
    with those; `answer` always stays). The preference keeps its remaining features."""
    if not isinstance(allowed, list) or not all(isinstance(n, str) for n in allowed):
        raise BadRequest(
            "allowed_tools must be a list of tool names or aliases", param="allowed_tools"
        )
    aliases = {a.alias: a for a in config.aliases}
    unknown = [n for n in allowed if n not in config.tools and n not in aliases]
    if unknown:
        raise BadRequest(
            f"allowed_tools: unknown {unknown}; tools {list(config.tools)}, "
            f"aliases {list(aliases)}",
            param="allowed_tools",
        )
    named = set(allowed)
    tools, kept = [], []
    for tool in config.tools:
        own = config.aliases_for(tool) if is_meta_tool(tool) else []
        picked = [a for a in own if a.alias in named]
        if tool in named or (tool == ANSWER_TOOL and not picked):
            tools.append(tool)
            kept.extend(own)
        elif picked:
            tools.append(tool)
            kept.extend(picked)
    narrowed = dataclasses.replace(config, tools=tuple(tools), aliases=tuple(kept))
    features = set(narrowed.feature_names())
    preference = {k: v for k, v in config.preference.items() if k in features}
    return dataclasses.replace(narrowed, preference=preference or {"accuracy": 1.0})


def parse_request(body: Any, defaults: Defaults) -> OrchestrationRequest:
    """The request in `body` (a JSON object), or `BadRequest`."""
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object")
    for name in REFUSED_FIELDS:
        if body.get(name) is not None:
            raise BadRequest(
                f"{name} is not supported: the orchestrator calls its own tools and answers "
                "in text (choose among its tools with allowed_tools)",
                param=name,
            )
    if body.get("n", 1) != 1:
        raise BadRequest("n must be 1", param="n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise BadRequest("stream_options must be an object", param="stream_options")
    config = defaults.tool_config
    if body.get("allowed_tools") is not None:
        config = with_tools(config, body["allowed_tools"])
    if body.get("preference") is not None:
        config = with_preference(config, body["preference"])
    max_turns = _integer(body, "max_turns", low=1, high=defaults.max_turns)
    caps: Sequence[int | None] = [
        _integer(body, name, low=1) for name in ("max_tokens", "max_completion_tokens")
    ]
    given = [c for c in caps if c is not None]
    max_new = min([defaults.max_new_tokens_per_turn, *given]) if given else None
    max_cost = _number(body, "max_cost_usd", low=0.0)
    if max_cost is not None and max_cost <= 0:
        raise BadRequest("max_cost_usd must be > 0", param="max_cost_usd")
    seed = _integer(body, "seed", low=0)
    return OrchestrationRequest(
        question=question_of(body.get("messages")),
        tool_config=config,
        max_turns=max_turns or defaults.max_turns,
        max_cost_usd=None if max_cost is None else float(max_cost),
        max_new_tokens_per_turn=max_new,
        temperature=_number(body, "temperature", low=0.0, high=2.0),
        top_p=_number(body, "top_p", low=0.0, high=1.0),
        seed=seed,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
    )
