"""chat/template.render is byte-identical to Hugging Face's Qwen3 template, and tokenizes identically."""

import json
import random

import pytest

from orchestra_jax.chat import template
from orchestra_jax.chat.tokenizer import load_tokenizer

N_CONVERSATIONS = 60
TEXT_PIECES = [
    "",
    "Hello",
    " world",
    "What is 17 * 23?",
    "\n",
    "\n\n",
    "  ",
    "naïve café",
    "e\u0301",
    "Straße",
    "中文字符",
    "日本語のテキスト",
    "한국어",
    "مرحبا بالعالم",
    "😀🚀",
    "👩‍👩‍👧",
    '{"json": [1, 2]}',
    "}{",
    "<tool_call>",
    "<|endoftext|>",
    "tab\there",
    "\r\n",
    "x" * 50,
    "💥" * 3,
    "\u200b",
    "$1.25 | $10",
]


def random_text(rng, *, max_pieces=6, long_chance=0.05):
    if rng.random() < long_chance:
        return " ".join(rng.choice(TEXT_PIECES) for _ in range(400))  # a long content
    return "".join(rng.choice(TEXT_PIECES) for _ in range(rng.randint(0, max_pieces)))


def random_schema(rng, depth=0):
    kind = rng.choice(
        ["string", "integer", "number", "boolean", "enum", "array", "object"][: 7 - depth]
    )
    if kind == "enum":
        return {"type": "string", "enum": [random_text(rng, max_pieces=2) for _ in range(3)]}
    if kind == "array":
        return {
            "type": "array",
            "items": random_schema(rng, depth + 2),
            "description": random_text(rng),
        }
    if kind == "object":
        props = {f"p{i}": random_schema(rng, depth + 3) for i in range(rng.randint(0, 3))}
        return {"type": "object", "properties": props, "required": sorted(props)[:1]}
    return {"type": kind, "description": random_text(rng)}


def random_tools(rng):
    tools = []
    for i in range(rng.randint(1, 4)):
        function = {
            "name": f"tool_{i}_{rng.randint(0, 99)}",
            "description": random_text(rng),
            "parameters": random_schema(rng, depth=5)
            | {"properties": {f"arg{j}": random_schema(rng) for j in range(rng.randint(0, 3))}},
        }
        tools.append({"type": "function", "function": function} if rng.random() < 0.8 else function)
    return tools


def random_value(rng, depth=0):
    choices = [
        lambda: rng.randint(-(10**6), 10**6),
        lambda: rng.random() * 100,
        lambda: random_text(rng),
        lambda: rng.random() < 0.5,
        lambda: None,
    ]
    if depth < 2:
        choices += [
            lambda: [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))],
            lambda: {
                random_text(rng, max_pieces=2): random_value(rng, depth + 1) for _ in range(3)
            },
        ]
    return rng.choice(choices)()


def random_tool_call(rng):
    arguments = {f"a{i}": random_value(rng) for i in range(rng.randint(0, 4))}
    if rng.random() < 0.3:  # a JSON string is written verbatim, whatever its spacing
        arguments = json.dumps(
            arguments, indent=rng.choice([None, 2]), ensure_ascii=rng.random() < 0.5
        )
    function = {"name": f"tool_{rng.randint(0, 9)}", "arguments": arguments}
    if rng.random() < 0.2:
        return function
    return {"id": f"call_{rng.randint(0, 999)}", "type": "function", "function": function}


def random_assistant(rng):
    msg = {"role": "assistant", "content": random_text(rng)}
    style = rng.choice(["none", "field", "alias", "inline", "empty_field"])
    if style == "field":
        msg["reasoning_content"] = (
            rng.choice(["", "\n"]) + random_text(rng) + rng.choice(["", "\n\n"])
        )
    elif style == "alias":
        msg["thinking"] = random_text(rng)
    elif style == "inline":
        msg["content"] = (
            rng.choice(["", "<think>", "<think>\n"])
            + random_text(rng)
            + rng.choice(["", "\n"])
            + "</think>"
            + rng.choice(["", "\n\n", "\n"])
            + msg["content"]
        )
    elif style == "empty_field":
        msg["reasoning_content"] = ""
    if rng.random() < 0.5:
        msg["tool_calls"] = [random_tool_call(rng) for _ in range(rng.randint(1, 3))]
    return msg


def random_conversation(rng):
    messages = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": random_text(rng)})
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.1:
            messages.append(
                {
                    "role": "user",
                    "content": f"<tool_response>\n{random_text(rng)}\n</tool_response>",
                }
            )
        elif roll < 0.15:
            messages.append({"role": "system", "content": random_text(rng)})
        else:
            messages.append({"role": "user", "content": random_text(rng)})
        for _ in range(rng.randint(0, 3)):
            messages.append(random_assistant(rng))
            if "tool_calls" in messages[-1] or rng.random() < 0.2:
                messages += [
                    {"role": "tool", "content": random_text(rng)} for _ in range(rng.randint(1, 3))
                ]
    if rng.random() < 0.1:  # conversations that start or end oddly
        messages = messages[rng.randint(0, len(messages) - 1) :]
    tools = random_tools(rng) if rng.random() < 0.6 else rng.choice([None, []])
    return messages, tools, rng.random() < 0.5, rng.random() < 0.5


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen3_dir))


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3_dir):
    return load_tokenizer(qwen3_dir)


@pytest.mark.parametrize("seed", range(N_CONVERSATIONS))
def test_random_conversation_matches_hugging_face(seed, hf_tokenizer, qwen3_tokenizer):
    messages, tools, add_generation_prompt, enable_thinking = random_conversation(
        random.Random(seed)
    )
    kwargs = dict(
        tools=tools, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking
    )
    expected = hf_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    assert template.render(messages, **kwargs) == expected
    expected_ids = hf_tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=False, **kwargs
    )
    assert qwen3_tokenizer.encode(template.render(messages, **kwargs)) == list(expected_ids)


def test_random_conversations_cover_the_template_branches():
    """The generator above reaches every branch the parity test is meant to check."""
    seen = set()
    for seed in range(N_CONVERSATIONS):
        messages, tools, add_gen, thinking = random_conversation(random.Random(seed))
        text = template.render(
            messages, tools=tools, add_generation_prompt=add_gen, enable_thinking=thinking
        )
        seen |= {
            name
            for name, hit in [
                ("tools", "<tools>" in text),
                ("grouped_tool_results", "</tool_response>\n<tool_response>" in text),
                ("several_calls", "</tool_call>\n<tool_call>" in text),
                ("kept_think", "<think>\n" in text),
                (
                    "string_arguments",
                    any(
                        isinstance(c.get("function", c)["arguments"], str)
                        for m in messages
                        for c in m.get("tool_calls", [])
                    ),
                ),
                ("empty_think_prompt", text.endswith(template.EMPTY_THINK)),
                ("long", len(text) > 4000),
                ("no_generation_prompt", not add_gen),
                ("mid_system", any(m["role"] == "system" for m in messages[1:])),
            ]
            if hit
        }
    assert seen == {
        "tools",
        "grouped_tool_results",
        "several_calls",
        "kept_think",
        "string_arguments",
        "empty_think_prompt",
        "long",
        "no_generation_prompt",
        "mid_system",
    }


AGENT_EPISODE = [
    {"role": "system", "content": "You are good at using tools."},
    {"role": "user", "content": "Who wrote Hamlet?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I should search.",
        "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"model": "search-2"}}}
        ],
    },
    {"role": "tool", "content": "Hamlet is a tragedy by William Shakespeare."},
    {"role": "assistant", "content": "William Shakespeare."},
]


def test_agent_episode_renders_exactly():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    expected = (
        "<|im_start|>system\nYou are good at using tools.\n\n# Tools\n\nYou may call one or more functions to "
        "assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML "
        'tags:\n<tools>\n{"type": "function", "function": {"name": "search", "description": "Search.", '
        '"parameters": {"type": "object", "properties": {}}}}\n</tools>\n\nFor each function call, return a '
        "json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI should search.\n</think>\n\n<tool_call>\n"
        '{"name": "search", "arguments": {"model": "search-2"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nHamlet is a tragedy by William Shakespeare.\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nWilliam Shakespeare.<|im_end|>\n"
    )
    assert template.render(AGENT_EPISODE, tools=tools) == expected


def test_earlier_reasoning_is_dropped_before_the_last_query():
    messages = AGENT_EPISODE[1:] + [{"role": "user", "content": "And Macbeth?"}]
    text = template.render(messages, add_generation_prompt=True, enable_thinking=False)
    assert "I should search." not in text and "<think>" not in text.removesuffix(
        template.EMPTY_THINK
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_assistant_content_none_counts_as_empty():
    call = {"function": {"name": "f", "arguments": {}}}
    with_none = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    with_empty = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    assert template.render(with_none) == template.render(with_empty)


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "empty"),
        ([{"role": "developer", "content": "x"}], "role"),
        ([{"role": "user", "content": None}], "must be a string"),
        ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "must be a string"),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}],
            "name",
        ),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}],
            "no arguments",
        ),
        (
            [
                {
                    "role": "user",
                    "content": "x",
                    "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
                }
            ],
            "only assistant",
        ),
    ],
)
def test_bad_messages_raise_clear_errors(messages, match):
    with pytest.raises(ValueError, match=match):
        template.render(messages)
