"""Find and check the `<tool_call>` blocks a Qwen3 model writes; never raises on model text.

Qwen3 writes each call as::

    <tool_call>
    {"name": "search", "arguments": {"model": "search-2"}}
    </tool_call>

`parse_tool_calls(text, tools)` returns one item per block, in order: a
`ToolCall` when the block is a JSON object with exactly a string `name` and an
object `arguments` that fit the tool schemas (if given), else a
`ToolCallError` whose `message` is written for the model to read. Calls inside
the `<think>` section are reasoning, not calls, and are ignored. That section
ends at the first `</think>`, where generation left reasoning (as SGLang's and
vLLM's Qwen3 reasoning parsers split); a later `</think>`, e.g. inside a call's
JSON string, is content. (`split_reasoning` splits at the last one instead, as
the chat template does when it re-renders earlier turns.)

Parsing rules, chosen so that a bad block never hides a good one:
  * the JSON is decoded first, so `}` or `</tool_call>` inside JSON strings do
    not end a block; only when it does not decode, the block ends at the next
    `</tool_call>`, or is cut short by the next `<tool_call>` or the end of text;
  * a `</tool_call>` with no opening tag is an error too.

Parsing takes time linear in the text, however the blocks repeat, nest or go
unclosed (`_NextTag`, `_decode`).

Schema checks (OpenAI function schemas, a JSON-Schema subset): known tool name;
`type` (one or a list of string, integer, number, boolean, array, object,
null), `enum`, `properties`, `required`, `additionalProperties: false`,
`items` and `anyOf`, recursively. Other keywords are not checked.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_FORMAT = (
    '<tool_call>\n{"name": <tool name>, "arguments": {<arguments as a JSON object>}}\n</tool_call>'
)

_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclasses.dataclass
class ToolCall:
    """A well-formed call; `raw` is its whole `<tool_call>…</tool_call>` block as written."""

    name: str
    arguments: dict
    raw: str


@dataclasses.dataclass
class ToolCallError:
    """A malformed or invalid call; `message` is meant to be shown to the model."""

    message: str
    raw: str


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, content) of an assistant text, splitting at the last `</think>`.

    Reasoning is what precedes it, after the first `<think>`, stripped of
    newlines; content is what follows, without leading newlines (as the chat
    template splits them). With an unclosed `<think>` everything after it is
    reasoning (generation stopped while thinking).
    """
    if THINK_CLOSE in text:
        before, _, after = text.rpartition(THINK_CLOSE)
        return before.split(THINK_OPEN, 1)[-1].strip("\n"), after.lstrip("\n")
    if THINK_OPEN in text:
        before, _, after = text.partition(THINK_OPEN)
        return after.strip("\n"), before
    return "", text


def strip_think(text: str) -> str:
    """The content of an assistant text, without its `<think>` section."""
    return split_reasoning(text)[1]


def generated_content(text: str) -> str:
    """What a model wrote after its reasoning: the text after the first `</think>`.

    With an unclosed `<think>` there is none; with no think tags it is all the text.
    """
    if THINK_CLOSE in text:
        return text.partition(THINK_CLOSE)[2]
    if THINK_OPEN in text:
        return text.partition(THINK_OPEN)[0]
    return text


def parse_tool_calls(
    text: str, tools: Sequence[Mapping[str, Any]] | None = None
) -> list[ToolCall | ToolCallError]:
    """Every `<tool_call>` block outside `<think>`, decoded and checked against `tools`.

    Never raises on any string; raises ValueError only for malformed `tools`
    (a programming error, not model output).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_calls takes a str, got {type(text).__name__}")
    schemas = tool_parameters(tools) if tools is not None else None
    content = generated_content(text)
    find = _NextTag(content)
    results: list[ToolCall | ToolCallError] = []
    pos = 0
    while True:
        start = find(TOOL_CALL_OPEN, pos)
        stray = find(TOOL_CALL_CLOSE, pos)
        if stray != -1 and (start == -1 or stray < start):
            raw = content[pos : stray + len(TOOL_CALL_CLOSE)].strip()
            results.append(
                ToolCallError(
                    f"Found {TOOL_CALL_CLOSE} without an opening {TOOL_CALL_OPEN}. "
                    f"Write each call as {CALL_FORMAT}",
                    raw,
                )
            )
            pos = stray + len(TOOL_CALL_CLOSE)
            continue
        if start == -1:
            return results
        item, pos = _parse_block(content, start, schemas, find)
        results.append(item)


class _NextTag:
    """`content.find(tag, pos)`, in linear time overall for positions that never decrease.

    The parser asks for the next opening and closing tag after every block; a
    plain `find` rescans the text up to a far tag each time, quadratic in the
    number of blocks. Each tag's last answer is kept and is still the answer
    for any later position up to it (and -1 stays -1), so every character is
    scanned at most once per tag. (An earlier position gets a plain `find`.)
    """

    def __init__(self, content: str):
        self.content = content
        self.last: dict[str, tuple[int, int]] = {}  # tag -> (asked at, answer)

    def __call__(self, tag: str, pos: int) -> int:
        asked, found = self.last.get(tag, (-1, -1))
        if 0 <= asked <= pos and (found == -1 or pos <= found):
            return found
        found = self.content.find(tag, pos)
        if pos >= asked:
            self.last[tag] = (pos, found)
        return found


def _skip_space(content: str, pos: int) -> int:
    """The position after the JSON white space at `pos` (`_JSON_SPACE` matches "" too)."""
    match = _JSON_SPACE.match(content, pos)
    return match.end() if match else pos


def _parse_block(
    content: str, start: int, schemas, find: _NextTag
) -> tuple[ToolCall | ToolCallError, int]:
    """The block opening at `start`, and where scanning resumes after it."""
    body = _skip_space(content, start + len(TOOL_CALL_OPEN))
    try:
        value, end = _decode(content, body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        value, end, problem = None, None, _json_problem(e, content, body)
    else:
        close = _skip_space(content, end)
        if content.startswith(TOOL_CALL_CLOSE, close):
            stop = close + len(TOOL_CALL_CLOSE)
            return check_call(value, content[start:stop], schemas), stop
        problem = f"unexpected text after the JSON object: {content[close : close + 40]!r}"
    after = end if end is not None else body  # tags inside decoded JSON strings are data, not tags
    close, nxt = find(TOOL_CALL_CLOSE, after), find(TOOL_CALL_OPEN, after)
    if nxt != -1 and (close == -1 or nxt < close):
        msg = f"A {TOOL_CALL_OPEN} block was not closed with {TOOL_CALL_CLOSE} before the next one"
        return ToolCallError(
            f"{msg} ({problem}). Write each call as {CALL_FORMAT}", content[start:nxt]
        ), nxt
    if close == -1:
        msg = f"A {TOOL_CALL_OPEN} block was not closed with {TOOL_CALL_CLOSE}"
        return ToolCallError(
            f"{msg} ({problem}). Write each call as {CALL_FORMAT}", content[start:]
        ), len(content)
    stop = close + len(TOOL_CALL_CLOSE)
    return ToolCallError(
        f"Invalid tool call: {problem}. Write each call as {CALL_FORMAT}", content[start:stop]
    ), stop


def _decode(content: str, body: int) -> tuple[Any, int]:
    """`_DECODER.raw_decode(content, body)`, in time linear in how far the decoder reads.

    A failed decode of the whole text takes time linear in `body` (JSONDecodeError
    counts the lines before the error): quadratic over many blocks. So the decoder
    reads windows of the text from `body`, doubling, until its verdict cannot depend
    on where the window ends: a value or an error (other than an unterminated
    string) more than `_WINDOW_MARGIN` characters before it. The decoder looks at
    most a few characters ahead (`-Infinity`, a `\\uXXXX` escape, `1.5e+7`), so such
    a verdict is the one on the whole text. Errors' positions are offsets from `body`.
    """
    width = _FIRST_WINDOW
    while True:
        window = content[body : body + width]
        whole = body + width >= len(content)
        near_end = len(window) - _WINDOW_MARGIN
        try:
            value, end = _DECODER.raw_decode(window)
        except json.JSONDecodeError as e:
            if whole or (e.pos < near_end and not e.msg.startswith("Unterminated")):
                raise
        else:
            if whole or end < near_end:
                return value, body + end
        width *= 2


_FIRST_WINDOW = 256
_WINDOW_MARGIN = 16


def _json_problem(error: Exception, content: str, body: int) -> str:
    if content.startswith(TOOL_CALL_CLOSE, body) or body == len(content):
        return "the block holds no JSON"
    if isinstance(error, json.JSONDecodeError):
        return f"the call is not valid JSON ({error.msg} at offset {error.pos})"
    if isinstance(error, RecursionError):
        return "the call's JSON is nested too deeply"
    return f"the call's JSON could not be decoded ({error})"


def check_call(
    value: Any, raw: str, schemas: Mapping[str, Any] | None = None
) -> ToolCall | ToolCallError:
    """A decoded call object as a `ToolCall`, or the reason it is not one."""
    if not isinstance(value, dict):
        return ToolCallError(
            f"Invalid tool call: expected a JSON object, got {_json_type(value)}. "
            f"Write each call as {CALL_FORMAT}",
            raw,
        )
    name, arguments = value.get("name"), value.get("arguments")
    extra = sorted(set(value) - {"name", "arguments"})
    problem = (
        'missing "name"'
        if "name" not in value
        else f'"name" must be a string, got {_json_type(name)}'
        if not isinstance(name, str)
        else 'missing "arguments"'
        if "arguments" not in value
        else f'"arguments" must be a JSON object, got {_json_type(arguments)}'
        if not isinstance(arguments, dict)
        else f'unexpected keys {extra}; a call has only "name" and "arguments"'
        if extra
        else None
    )
    if problem:
        return ToolCallError(f"Invalid tool call: {problem}. Write each call as {CALL_FORMAT}", raw)
    name, arguments = cast(str, name), cast(dict, arguments)  # checked by `problem` above
    if schemas is not None:
        if name not in schemas:
            return ToolCallError(
                f"Unknown tool {name!r}. Available tools: {', '.join(schemas) or 'none'}.", raw
            )
        errors = schema_errors(arguments, schemas[name], "")
        if errors:
            return ToolCallError(f"Invalid arguments for tool {name!r}: {'; '.join(errors)}.", raw)
    return ToolCall(name, arguments, raw)


def tool_parameters(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{name: parameters schema} from OpenAI tool schemas (wrapped in "function" or bare)."""
    index = {}
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f"a tool schema needs a function name, got {tool!r}")
        index[function["name"]] = function.get("parameters") or {}
    return index


def schema_errors(value: Any, schema: Any, path: str) -> list[str]:
    """Why `value` does not fit `schema` (the subset in the module docstring); [] when it fits."""
    if not isinstance(schema, Mapping):
        return []
    where = f"argument {path!r}" if path else "the arguments"
    if isinstance(schema.get("anyOf"), list) and not any(
        not schema_errors(value, s, path) for s in schema["anyOf"]
    ):
        return [f"{where} matches none of the allowed forms"]
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    if types and not any(_is_type(value, t) for t in types):
        return [f"{where} must be {' or '.join(types)}, got {_json_type(value)}"]
    if "enum" in schema and isinstance(schema["enum"], list):
        if not any(_same_json(value, option) for option in schema["enum"]):
            return [
                f"{where} must be one of {json.dumps(schema['enum'], ensure_ascii=False)}, "
                f"got {json.dumps(value, ensure_ascii=False)}"
            ]
    if isinstance(value, dict):
        return _object_errors(value, schema, path)
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [
            e
            for i, item in enumerate(value)
            for e in schema_errors(item, schema["items"], f"{path}[{i}]")
        ]
    return []


def _object_errors(value: dict, schema: Mapping[str, Any], path: str) -> list[str]:
    declared = schema.get("properties")
    properties: Mapping[str, Any] = declared if isinstance(declared, Mapping) else {}
    prefix = f"{path}." if path else ""
    errors = [
        f"missing required argument {prefix + key!r}"
        for key in schema.get("required") or []
        if isinstance(key, str) and key not in value
    ]
    if schema.get("additionalProperties") is False:
        errors += [
            f"unknown argument {prefix + key!r} (allowed: {', '.join(properties) or 'none'})"
            for key in value
            if key not in properties
        ]
    for key, item in value.items():
        errors += schema_errors(item, properties.get(key), prefix + key)
    return errors


def _is_type(value: Any, type_name: Any) -> bool:
    if type_name == "integer":  # JSON Schema counts 1.0 as an integer
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if type_name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    python_type = {
        "string": str,
        "boolean": bool,
        "array": list,
        "object": dict,
        "null": type(None),
    }.get(type_name)
    return python_type is None or isinstance(
        value, python_type
    )  # unknown type names do not constrain


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {
        str: "string",
        int: "integer",
        float: "number",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _same_json(a: Any, b: Any) -> bool:
    """JSON equality: 1 != true, key order ignored."""
    try:
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    except (TypeError, ValueError):
        return a == b
