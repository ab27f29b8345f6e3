"""Incremental chat segments: where prompt + generated + segment equals a full render, and where not."""

import random

import pytest

from orchestra_jax.chat import template
from orchestra_jax.chat.tokenizer import load_tokenizer

IM_END = "<|im_end|>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
START = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Who wrote Hamlet?"},
]


def generated(rng, *, reasoning=True):
    """A canonical Qwen3 completion: think block, some text, raw tool calls, <|im_end|>."""
    calls = [
        f'<tool_call>\n{{"name": "search", "arguments": {{"q": "hamlet {rng.randint(0, 99)}"}}}}\n</tool_call>'
        for _ in range(rng.randint(0, 2))
    ]
    think = f"<think>\nStep {rng.randint(0, 9)}: search.\n</think>\n\n" if reasoning else ""
    content = "\n".join(
        rng.choice([[], ["Let me check."]]) + calls
    )  # no leading newline: canonical
    return think + content + IM_END


def test_tool_response_segment_text():
    assert template.tool_response_segment(["a", "b"]) == (
        "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.tool_response_segment(["a"], enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_user_message_segment_text():
    assert template.user_message_segment("Bad call.") == (
        "\n<|im_start|>user\nBad call.<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("results", [[], "a string", [1]])
def test_tool_response_segment_rejects_bad_results(results):
    with pytest.raises(ValueError):
        template.tool_response_segment(results)


@pytest.mark.parametrize("seed", range(8))
def test_append_only_with_thinking_and_tool_results(seed):
    """With thinking on, raw assistant text and tool results, P + G + S is a full render, turn after turn."""
    rng = random.Random(seed)
    messages, text = list(START), template.render(START, tools=TOOLS, add_generation_prompt=True)
    for _ in range(3):
        completion = generated(rng, reasoning=rng.random() < 0.7)
        results = [f"result {rng.randint(0, 99)} ✓" for _ in range(rng.randint(1, 3))]
        text += completion + template.tool_response_segment(results)
        messages += [{"role": "assistant", "content": completion.removesuffix(IM_END)}]
        messages += [{"role": "tool", "content": r} for r in results]
        assert text == template.render(messages, tools=TOOLS, add_generation_prompt=True)


def test_not_append_only_when_thinking_is_off():
    """The prompt's empty think block stays in the tokens, but a full render drops it from earlier turns."""
    prompt = template.render(START, add_generation_prompt=True, enable_thinking=False)
    completion = "Searching." + IM_END
    text = prompt + completion + template.tool_response_segment(["r"], enable_thinking=False)
    turns = [{"role": "assistant", "content": "Searching."}, {"role": "tool", "content": "r"}]
    rerender = template.render(START + turns, add_generation_prompt=True, enable_thinking=False)
    assert text != rerender
    assert text.replace(template.EMPTY_THINK, "", 1) == rerender


def test_not_append_only_after_a_user_turn():
    """A user turn is a new query: a full render strips the reasoning of all earlier turns."""
    completion = "<think>\nHmm.\n</think>\n\nNo call here." + IM_END
    text = (
        template.render(START, add_generation_prompt=True)
        + completion
        + template.user_message_segment("Please call a tool.")
    )
    rerender = template.render(
        START
        + [
            {"role": "assistant", "content": completion.removesuffix(IM_END)},
            {"role": "user", "content": "Please call a tool."},
        ],
        add_generation_prompt=True,
    )
    assert text.replace("<think>\nHmm.\n</think>\n\n", "") == rerender


def test_not_append_only_for_structured_calls_or_odd_think_spacing():
    prompt = template.render(START, add_generation_prompt=True)
    structured = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "search", "arguments": {"q": "x"}}}],
    }
    raw = '<tool_call>\n{"name":"search","arguments":{"q":"x"}}\n</tool_call>' + IM_END
    assert prompt + raw != template.render(START + [structured])  # JSON re-serialised with spaces
    odd = "<think>\n\nHmm.\n\n</think>\nOk." + IM_END
    assert prompt + odd != template.render(
        START + [{"role": "assistant", "content": odd[: -len(IM_END)]}]
    )


@pytest.mark.parametrize("which", ["demo", "qwen3"])
def test_segment_ids_concatenate(which, request):
    """Segments start and end at special tokens, so their ids concatenate without re-tokenizing."""
    tokenizer = load_tokenizer("demo" if which == "demo" else request.getfixturevalue("qwen3_dir"))
    prompt = template.render(START, tools=TOOLS, add_generation_prompt=True)
    completion = generated(random.Random(0))
    segment = template.tool_response_segment(["Hamlet: Shakespeare, 1600."])
    pieces = tokenizer.encode(prompt) + tokenizer.encode(completion) + tokenizer.encode(segment)
    assert pieces == tokenizer.encode(prompt + completion + segment)
    assert tokenizer.encode(segment)[:2] == tokenizer.encode("\n") + [tokenizer.im_start_id]
