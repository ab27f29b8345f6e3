"""The Qwen3 chat template in plain Python, byte-identical to Hugging Face's.

`render` reproduces `AutoTokenizer.from_pretrained(<qwen3>).apply_chat_template(
messages, tools=tools, tokenize=False, add_generation_prompt=...,
enable_thinking=...)` for OpenAI-style messages, without Jinja at run time.
The layout it writes::

    <|im_start|>system\\n{system}\\n\\n# Tools ... <tools>\\n{tool json}...</tools> ...<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n{reasoning}\\n</think>\\n\\n{content}
        \\n<tool_call>\\n{call json}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{result}\\n</tool_response>\\n<tool_response>...<|im_end|>\\n
    <|im_start|>assistant\\n                       (add_generation_prompt)
    <think>\\n\\n</think>\\n\\n                        (... and enable_thinking=False)

Qwen3 rules reproduced here:
  * The *last query* is the last `user` message that is not a pure tool
    response (content starting with `<tool_response>` and ending with
    `</tool_response>`). Assistant turns up to it lose their reasoning; later
    ones keep a `<think>` block when they have reasoning or are the final
    message (then possibly an empty `<think>\\n\\n</think>\\n\\n`).
  * Reasoning is `reasoning_content` (or its aliases `thinking`, `reasoning`,
    as transformers accepts), else it is split out of a content that holds
    `</think>`.
  * Consecutive `tool` messages share one user turn.

Incremental segments, for the agent loop (token-in/token-out). Let
``P = render(msgs, tools=T, add_generation_prompt=True, enable_thinking=True)``,
for `msgs` ending in a user or tool turn, ``G`` the generated text, ending in `<|im_end|>`, and
``S = tool_response_segment(results)``. Then::

    P + G + S == render(msgs + [{"role": "assistant", "content": G[:-len("<|im_end|>")]}]
                             + [{"role": "tool", "content": r} for r in results],
                        tools=T, add_generation_prompt=True)

exactly when (1) thinking is enabled, (2) the assistant turn is given as its raw
text (tool calls left in `content`, not as structured `tool_calls`), and (3) G
either has no `</think>` or is canonical: ``"<think>\\n" + R + "\\n</think>\\n\\n"
+ C`` with R non-empty, free of `<think>`, not starting or ending with a newline,
C not starting with a newline, and a single `</think>`. It is *not* append-only when
  * `enable_thinking=False`: P ends with an empty think block that a full
    render drops again from every non-final assistant turn;
  * a `user_message_segment` follows a turn with reasoning: the new user turn
    becomes the last query, and a full render strips every earlier `<think>`;
  * tool calls are passed structurally: render re-serialises their JSON;
  * the reasoning has other newlines around it: render normalises them.
Training therefore uses the token ids actually sampled plus the ids of the
segments (mask 0), never a re-render of the text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
EMPTY_THINK = "<think>\n\n</think>\n\n"

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)

ROLES = ("system", "user", "assistant", "tool")
# transformers copies the first non-None of these into `reasoning_content`.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def to_json(value: Any) -> str:
    """JSON as the template's `tojson` filter writes it: `", "`/`": "`, no ASCII escaping."""
    return json.dumps(value, ensure_ascii=False)


def generation_prompt(*, enable_thinking: bool = True) -> str:
    """The opening of an assistant turn that the model completes."""
    return f"{IM_START}assistant\n" + ("" if enable_thinking else EMPTY_THINK)


def tool_response_segment(results: Sequence[str], *, enable_thinking: bool = True) -> str:
    """Text to append right after a generated `<|im_end|>`: tool results, then the next prompt.

    ``"\\n<|im_start|>user" + "".join("\\n<tool_response>\\n" + r + "\\n</tool_response>")
    + "<|im_end|>\\n<|im_start|>assistant\\n"`` (+ the empty think block when
    thinking is off). One result per consecutive `tool` message.
    """
    if isinstance(results, str) or not results:
        raise ValueError("tool_response_segment needs a non-empty list of result strings")
    for result in results:
        _require_str(result, "tool result")
    blocks = "".join(f"\n{TOOL_RESPONSE_OPEN}\n{r}\n{TOOL_RESPONSE_CLOSE}" for r in results)
    return f"\n{IM_START}user{blocks}{IM_END}\n" + generation_prompt(
        enable_thinking=enable_thinking
    )


def user_message_segment(text: str, *, enable_thinking: bool = True) -> str:
    """Text to append after a generated `<|im_end|>` for a plain user turn (e.g. a format error).

    ``"\\n<|im_start|>user\\n" + text + "<|im_end|>\\n<|im_start|>assistant\\n"`` (+ the
    empty think block). Unlike tool results this starts a new query: a full
    render would drop the reasoning of all earlier turns (see module docstring).
    """
    _require_str(text, "user message")
    return f"\n{IM_START}user\n{text}{IM_END}\n" + generation_prompt(
        enable_thinking=enable_thinking
    )


def render(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool = True,
) -> str:
    """Render a conversation exactly as Qwen3's Hugging Face chat template does.

    Deviations, all on inputs where HF errors or silently misbehaves: an
    assistant `content` that is missing or None counts as "" (HF raises); an
    unknown role, non-string content or malformed tool call raises ValueError
    (HF drops unknown roles and str()s odd values).
    """
    if not messages:
        raise ValueError("cannot render an empty conversation")
    msgs = [_checked_message(m, i) for i, m in enumerate(messages)]
    parts = [_system_block(msgs[0], tools)]
    last_query = _last_query_index(msgs)
    for i, msg in enumerate(msgs):
        role = msg["role"]
        if role == "user" or (role == "system" and i > 0):
            parts.append(f"{IM_START}{role}\n{msg['content']}{IM_END}\n")
        elif role == "assistant":
            parts.append(
                _assistant_turn(msg, keep_think=i > last_query, is_last=i == len(msgs) - 1)
            )
        elif role == "tool":
            if i == 0 or msgs[i - 1]["role"] != "tool":
                parts.append(f"{IM_START}user")
            parts.append(f"\n{TOOL_RESPONSE_OPEN}\n{msg['content']}\n{TOOL_RESPONSE_CLOSE}")
            if i == len(msgs) - 1 or msgs[i + 1]["role"] != "tool":
                parts.append(f"{IM_END}\n")
    if add_generation_prompt:
        # The template tests `enable_thinking is false`: only the bool False counts.
        parts.append(generation_prompt(enable_thinking=enable_thinking is not False))
    return "".join(parts)


def is_tool_response(content: str) -> bool:
    """Whether a user message only carries tool results (and so is not a new query)."""
    return content.startswith(TOOL_RESPONSE_OPEN) and content.endswith(TOOL_RESPONSE_CLOSE)


def _system_block(first: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None) -> str:
    system = first["content"] if first["role"] == "system" else None
    if not tools:
        return "" if system is None else f"{IM_START}system\n{system}{IM_END}\n"
    for tool in tools:
        if not isinstance(tool, Mapping):
            raise ValueError(f"tools must be JSON-schema dicts, got {type(tool).__name__}")
    head = f"{IM_START}system\n" + ("" if system is None else system + "\n\n")
    return head + TOOLS_HEADER + "".join("\n" + to_json(t) for t in tools) + TOOLS_FOOTER


def _last_query_index(msgs: list[dict[str, Any]]) -> int:
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i]["role"] == "user" and not is_tool_response(msgs[i]["content"]):
            return i
    return len(msgs) - 1


def _assistant_turn(msg: dict[str, Any], *, keep_think: bool, is_last: bool) -> str:
    content, reasoning = msg["content"], msg["reasoning"]
    if reasoning is None:
        reasoning = ""
        if THINK_CLOSE in content:
            before, content = (
                content.split(THINK_CLOSE)[0],
                content.split(THINK_CLOSE)[-1].lstrip("\n"),
            )
            reasoning = before.rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    if keep_think and (is_last or reasoning):
        body = reasoning.strip("\n")
        out = f"{IM_START}assistant\n{THINK_OPEN}\n{body}\n{THINK_CLOSE}\n\n" + content.lstrip("\n")
    else:
        out = f"{IM_START}assistant\n{content}"
    for k, (name, arguments) in enumerate(msg["tool_calls"]):
        if k > 0 or content:
            out += "\n"
        args = arguments if isinstance(arguments, str) else to_json(arguments)
        out += f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
    return out + f"{IM_END}\n"


def _checked_message(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Validate one message; returns role, content, reasoning, tool_calls [(name, arguments)]."""
    if not isinstance(message, Mapping):
        raise ValueError(f"message {index} must be a dict, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"message {index} has role {role!r}; expected one of {ROLES}")
    content = message.get("content")
    if content is None and role == "assistant":
        content = ""
    _require_str(content, f"message {index} ({role}) content")
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is not None:
        _require_str(reasoning, f"message {index} reasoning_content")
    calls = message.get("tool_calls") or []
    if calls and role != "assistant":
        raise ValueError(f"message {index}: only assistant messages may carry tool_calls")
    return {
        "role": role,
        "content": content,
        "reasoning": reasoning,
        "tool_calls": [_checked_call(c, index) for c in calls],
    }


def _checked_call(call: Any, index: int) -> tuple[str, Any]:
    if not isinstance(call, Mapping):
        raise ValueError(f"message {index}: each tool call must be a dict, got {call!r}")
    function = call.get("function") or call
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError(f"message {index}: tool call {call!r} needs a string function name")
    if "arguments" not in function:
        raise ValueError(f"message {index}: tool call {function['name']!r} has no arguments")
    return function["name"], function["arguments"]


def _require_str(value: Any, what: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
