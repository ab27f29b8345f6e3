"""chat/tool_calls: parsing never raises, round-trips what render writes, and checks schemas."""

import json
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from orchestra_jax.chat import template, tool_calls
from orchestra_jax.chat.tool_calls import (
    ToolCall,
    ToolCallError,
    parse_tool_calls,
    split_reasoning,
    strip_think,
)
from tests.linear_time import LINEAR_BOUND, growth

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["model"],
            "properties": {
                "model": {"type": "string", "enum": ["search-1", "search-2"]},
                "k": {"type": "integer"},
                "score": {"type": ["number", "null"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "filter": {
                    "type": "object",
                    "required": ["year"],
                    "properties": {"year": {"type": "integer"}},
                },
                "mode": {"anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["fast"]}]},
            },
        },
    },
}
ANSWER = {
    "name": "answer",
    "parameters": {"type": "object", "properties": {"model": {"type": "string"}}},
}
TOOLS = [SEARCH, ANSWER]


def call(body):
    return f"<tool_call>\n{body}\n</tool_call>"


def test_several_calls_with_text_around_and_braces_in_strings():
    arguments = {"model": "search-1", "tags": ["}{", "</tool_call>"]}
    first_block = call(json.dumps({"name": "search", "arguments": arguments}))
    text = (
        f"I will search.\n{first_block}\nand then\n"
        + call('{"name": "answer", "arguments": {}}')
        + "<|im_end|>"
    )
    first, second = parse_tool_calls(text, TOOLS)
    assert first == ToolCall("search", arguments, first_block)
    assert (
        second.name == "answer" and second.arguments == {} and second.raw.startswith("<tool_call>")
    )


def test_calls_inside_think_are_not_calls():
    inner = call('{"name": "answer", "arguments": {}}')
    assert parse_tool_calls(f"<think>\nmaybe {inner}\n</think>\n\nNo call.") == []
    assert (
        parse_tool_calls(f"<think>\nstill thinking {inner}") == []
    )  # unclosed think: all reasoning
    assert [c.name for c in parse_tool_calls(f"<think>\nx\n</think>\n\n{inner}")] == ["answer"]


def test_reasoning_ends_at_the_first_think_close():
    # A `</think>` inside a call's JSON is data: reasoning ended at the first one
    # (found by the round-trip property below with arguments {"</think>": null}).
    block = call('{"name": "answer", "arguments": {"</think>": null}}')
    (parsed,) = parse_tool_calls(f"<think>\n\n</think>\n\n{block}")
    assert parsed == ToolCall("answer", {"</think>": None}, block)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('<tool_call>\n{"name": "search", "arguments": {"model": "sea', "not closed"),
        ("<tool_call>\n</tool_call>", "no JSON"),
        ('<tool_call>{"name": "a" "arguments": {}}</tool_call>', "not valid JSON"),
        ('<tool_call>["search"]</tool_call>', "expected a JSON object, got array"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'missing "name"'),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', '"name" must be a string'),
        ('<tool_call>{"name": "answer"}</tool_call>', 'missing "arguments"'),
        (
            '<tool_call>{"name": "answer", "arguments": "{}"}</tool_call>',
            "must be a JSON object, got string",
        ),
        (
            '<tool_call>{"name": "answer", "arguments": {}, "id": 1}</tool_call>',
            "unexpected keys ['id']",
        ),
        (
            '<tool_call>{"name": "answer", "arguments": {}} trailing</tool_call>',
            "unexpected text after",
        ),
        ('{"name": "answer", "arguments": {}}</tool_call>', "without an opening"),
        ("<tool_call>" + "[" * 100_000, "nested too deeply"),
    ],
)
def test_malformed_blocks_give_readable_errors(text, fragment):
    (error,) = parse_tool_calls(text)
    assert isinstance(error, ToolCallError) and fragment in error.message, error.message
    assert error.raw and error.raw in text


def test_tags_inside_json_strings_are_data():
    text = '<tool_call>{"name": "answer", "arguments": {"q": "<tool_call>"}} junk' + call(
        '{"name": "answer", "arguments": {}}'
    )
    error, ok = parse_tool_calls(text)
    assert "unexpected text after" in error.message and ok.arguments == {}


def test_a_broken_block_does_not_hide_the_next_call():
    text = '<tool_call>{"name": "search", "arg' + call('{"name": "answer", "arguments": {}}')
    error, ok = parse_tool_calls(text)
    assert "before the next one" in error.message and ok.name == "answer"


@pytest.mark.parametrize(
    "arguments, fragment",
    [
        ({}, "missing required argument 'model'"),
        (
            {"model": "search-9"},
            'argument \'model\' must be one of ["search-1", "search-2"], got "search-9"',
        ),
        ({"model": "search-1", "k": "5"}, "argument 'k' must be integer, got string"),
        ({"model": "search-1", "k": True}, "argument 'k' must be integer, got boolean"),
        ({"model": "search-1", "score": "high"}, "argument 'score' must be number or null"),
        ({"model": "search-1", "tags": ["a", 2]}, "argument 'tags[1]' must be string, got integer"),
        ({"model": "search-1", "filter": {}}, "missing required argument 'filter.year'"),
        (
            {"model": "search-1", "mode": "slow"},
            "argument 'mode' matches none of the allowed forms",
        ),
        (
            {"model": "search-1", "limit": 3},
            "unknown argument 'limit' (allowed: model, k, score, tags, filter, mode)",
        ),
    ],
)
def test_schema_violations(arguments, fragment):
    (error,) = parse_tool_calls(call(json.dumps({"name": "search", "arguments": arguments})), TOOLS)
    assert isinstance(error, ToolCallError) and error.message.startswith(
        "Invalid arguments for tool 'search'"
    )
    assert fragment in error.message, error.message


def test_schema_accepts_valid_values():
    arguments = {
        "model": "search-2",
        "k": 3.0,
        "score": None,
        "tags": [],
        "filter": {"year": 1999},
        "mode": True,
    }
    (ok,) = parse_tool_calls(call(json.dumps({"name": "search", "arguments": arguments})), TOOLS)
    assert ok == ToolCall("search", arguments, ok.raw)


def test_unknown_tool_lists_the_available_ones():
    (error,) = parse_tool_calls(call('{"name": "browse", "arguments": {}}'), TOOLS)
    assert error.message == "Unknown tool 'browse'. Available tools: search, answer."


def test_reference_meta_tools(shared_file):
    tools = json.loads(shared_file("reference/toolorchestra_tools.json").read_text())
    (ok, error) = parse_tool_calls(
        call('{"name": "search", "arguments": {"model": "search-3"}}')
        + call('{"name": "enhance_reasoning", "arguments": {}}'),
        tools,
    )
    assert (
        ok.arguments == {"model": "search-3"}
        and "missing required argument 'model'" in error.message
    )


def test_malformed_tools_raise():
    with pytest.raises(ValueError, match="function name"):
        parse_tool_calls("", [{"type": "function", "function": {"description": "no name"}}])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>\nA\n</think>\n\nB", ("A", "B")),
        ("A\n</think>\n\nB", ("A", "B")),
        ("<think>\nA", ("A", "")),
        ("plain", ("", "plain")),
        ("<think>\nA\n</think>\n\nB</think>C", ("A\n</think>\n\nB", "C")),
    ],
)
def test_split_reasoning(text, expected):
    assert split_reasoning(text) == expected and strip_think(text) == expected[1]


FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    ":",
    ",",
    '"name"',
    '"arguments"',
    '"search"',
    "\n",
    " ",
    "null",
    "1e400",
    "-",
    "NaN",
    '{"name": "search", ',
]
model_text = st.one_of(
    st.text(), st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3)).map("".join)
)


@settings(max_examples=300, deadline=None)
@given(text=model_text, with_tools=st.booleans())
def test_never_raises(text, with_tools):
    for item in parse_tool_calls(text, TOOLS if with_tools else None):
        assert isinstance(item, (ToolCall, ToolCallError)) and item.raw in text


TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
calls = st.lists(
    st.tuples(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,15}", fullmatch=True),
        st.dictionaries(st.text(), json_values, max_size=4),
        st.booleans(),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=100, deadline=None)
@example(calls=[("A", {"</think>": None}, False)], content="", reasoning=None)
@given(
    calls=calls,
    content=st.text().filter(lambda s: not any(t in s for t in TAGS)),
    reasoning=st.none() | st.text().filter(lambda s: not any(t in s for t in TAGS)),
)
def test_round_trips_every_call_render_writes(calls, content, reasoning):
    tool_calls = [
        {
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if as_str else args},
        }
        for name, args, as_str in calls
    ]
    assistant = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": tool_calls,
    }
    text = template.render([{"role": "user", "content": "q"}, assistant])
    generated = text.split("<|im_start|>assistant\n")[-1]
    tools = [{"name": name, "parameters": {"type": "object"}} for name, _, _ in calls]
    parsed = parse_tool_calls(generated, tools)
    assert [(p.name, p.arguments) for p in parsed] == [(name, args) for name, args, _ in calls]
    assert all(p.raw in generated for p in parsed)


# Long degenerate outputs: the parser agrees with a plain reading of its rules and
# takes time linear in the text (a model can repeat `<tool_call>`, one Qwen3 token,
# until its token budget runs out).


def reference_parse(text, tools):
    """The module docstring's rules read plainly: every search and decode on the whole text."""
    decoder, schemas = json.JSONDecoder(), tool_calls.tool_parameters(tools)
    if "</think>" in text:
        content = text.partition("</think>")[2]
    else:
        content = text.partition("<think>")[0]
    results, pos = [], 0
    fmt = tool_calls.CALL_FORMAT
    while True:
        start, stray = content.find("<tool_call>", pos), content.find("</tool_call>", pos)
        if stray != -1 and (start == -1 or stray < start):
            raw = content[pos : stray + len("</tool_call>")].strip()
            message = f"Found </tool_call> without an opening <tool_call>. Write each call as {fmt}"
            results.append(ToolCallError(message, raw))
            pos = stray + len("</tool_call>")
            continue
        if start == -1:
            return results
        body = start + len("<tool_call>")
        while body < len(content) and content[body] in " \t\n\r":
            body += 1
        end = None
        try:
            value, end = decoder.raw_decode(content, body)
        except json.JSONDecodeError as e:
            problem = (
                "the block holds no JSON"
                if content.startswith("</tool_call>", body) or body == len(content)
                else f"the call is not valid JSON ({e.msg} at offset {e.pos - body})"
            )
        except RecursionError:
            problem = "the call's JSON is nested too deeply"
        else:
            close = end
            while close < len(content) and content[close] in " \t\n\r":
                close += 1
            if content.startswith("</tool_call>", close):
                stop = close + len("</tool_call>")
                results.append(tool_calls.check_call(value, content[start:stop], schemas))
                pos = stop
                continue
            problem = f"unexpected text after the JSON object: {content[close : close + 40]!r}"
        after = end if end is not None else body
        close, nxt = content.find("</tool_call>", after), content.find("<tool_call>", after)
        if nxt != -1 and (close == -1 or nxt < close):
            message = (
                "A <tool_call> block was not closed with </tool_call> before the next one"
                f" ({problem}). Write each call as {fmt}"
            )
            results.append(ToolCallError(message, content[start:nxt]))
            pos = nxt
        elif close == -1:
            message = (
                f"A <tool_call> block was not closed with </tool_call> ({problem}). "
                f"Write each call as {fmt}"
            )
            results.append(ToolCallError(message, content[start:]))
            pos = len(content)
        else:
            pos = close + len("</tool_call>")
            message = f"Invalid tool call: {problem}. Write each call as {fmt}"
            results.append(ToolCallError(message, content[start:pos]))


DEGENERATE = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    "\\u00e9",
    "\\ud83d\\ude00",
    "\\u12",
    ",",
    ":",
    " ",
    "\n",
    "1",
    "-",
    ".5",
    "e+7",
    "-Infinity",
    "NaN",
    "true",
    "nul",
    "a",
    '{"name": "search", "arguments": {"model": "search-1"}}',
    '{"name": "answer", "arguments": {"q": "',
    '"</tool_call>"',
    "<tool_call>\n[",
    '<tool_call>{"a": "',
]
degenerate_text = st.lists(
    st.tuples(st.sampled_from(DEGENERATE) | st.text(max_size=2), st.integers(1, 200)),
    max_size=12,
).map(lambda runs: "".join(fragment * count for fragment, count in runs))


@settings(max_examples=300, deadline=None)
@example(text='<tool_call>{"a": 1.5e+7}</tool_call>', window=18)
@example(text="<tool_call>-Infinity</tool_call>" * 3, window=10)
@example(text='<tool_call>["\\ud83d\\ude00"]</tool_call>', window=20)
@example(text="<tool_call>" + "[" * 3000 + "</tool_call>", window=256)
@given(text=degenerate_text, window=st.integers(1, 300))
def test_degenerate_outputs_parse_as_the_plain_reading(text, window):
    # small first windows make every JSON value cross a window's end somewhere
    with mock.patch.object(tool_calls, "_FIRST_WINDOW", window):
        assert parse_tool_calls(text, TOOLS) == reference_parse(text, TOOLS)


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>",
        "</tool_call>",
        "<tool_call>{",
        '<tool_call>["',
        '<tool_call>{"a": "',
        "<think>",
    ],
)
def test_parsing_time_is_linear_in_the_text(block):
    make = lambda n: "text " + block * n + "\n<tool_call>\n{}\n</tool_call>"  # noqa: E731
    assert growth(parse_tool_calls, make, 1000) < LINEAR_BOUND
