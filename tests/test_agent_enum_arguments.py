"""The enum-argument constraint (`agent/enum_arguments.py`) against a reference reading.

The reference below reads the text as a whole with `str.find` (no automaton):
after `"name": "<tool>"` of a tool with enum arguments, up to `</tool_call>` or
the next `"name": "`, every `"<argument>": "` of an enum argument must be
followed by one of its values and `"` (or the text ends inside a prefix of
one). The token automaton must accept a tokenized text exactly when the
reference does, on fuzzed texts built from the pieces of calls, with the
demo tokenizer and (when `../shared/qwen3` is there) the real Qwen3 one.
"""

import numpy as np
import pytest

from orchestra_jax.agent.enum_arguments import (
    NAME_KEY,
    build_constraint,
    enum_argument_constraint,
    enum_arguments,
    token_texts,
)
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.chat.tool_calls import TOOL_CALL_CLOSE
from orchestra_jax.rollout.token_constraint import TokenConstraint

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {
                    "model": {"type": "string", "enum": [f"{name}-{i}" for i in (1, 2, 3)]},
                    "query": {"type": "string"},
                },
            },
        },
    }
    for name in ("search", "enhance_reasoning", "answer")
] + [{"type": "function", "function": {"name": "free", "parameters": {"type": "object"}}}]
ENUMS = enum_arguments(TOOLS)


def reference_ok(text: str) -> bool:
    pos, tool = 0, None
    while True:
        if tool is None:
            at = text.find(NAME_KEY, pos)
            if at < 0:
                return True
            start = at + len(NAME_KEY)
            end = text.find('"', start)
            if end < 0:
                return True
            name = text[start:end]
            if name in ENUMS:
                tool, pos = name, end + 1
            else:
                pos = start
            continue
        keys = {NAME_KEY: None, TOOL_CALL_CLOSE: None}
        keys.update({f'"{arg}": "': arg for arg in ENUMS[tool]})
        found = [(text.find(k, pos) + len(k), k) for k in keys if text.find(k, pos) >= 0]
        if not found:
            return True
        end, key = min(found)
        if key == NAME_KEY:
            tool, pos = None, end - len(NAME_KEY)
            continue
        if key == TOOL_CALL_CLOSE:
            tool, pos = None, end
            continue
        values = ENUMS[tool][keys[key]]
        close = text.find('"', end)
        if close < 0:
            return any(v.startswith(text[end:]) for v in values)
        if text[end:close] not in values:
            return False
        pos = close + 1


PIECES = [
    "<tool_call>\n",
    '{"name": "',
    '"name": "',
    "search",
    "answer",
    "enhance_reasoning",
    "free",
    '", "arguments": {"model": "',
    '"model": "',
    '"query": "',
    "search-1",
    "answer-3",
    "answer-",
    "-2",
    '"',
    '"}}',
    "}}\n</tool_call>",
    "</tool_call>",
    "x",
    " ",
    "name",
    ": ",
    "é",
]


NAMES = ["search", "answer", "enhance_reasoning", "free", "sea", "answerx", ""]
VALUES = ["search-1", "search-3", "answer-2", "enhance_reasoning-1", "answer-", "ans", "x", ""]


def fuzzed_texts(n: int, seed: int) -> list[str]:
    """Calls with a random tool and value (paired right or wrong, cut anywhere), among
    random pieces."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(int(rng.integers(1, 4))):
            parts += list(rng.choice(PIECES, size=int(rng.integers(0, 4))))
            call = (
                f'<tool_call>\n{{"name": "{rng.choice(NAMES)}", "arguments": '
                f'{{"query": "q", "model": "{rng.choice(VALUES)}"}}}}\n</tool_call>'
            )
            parts.append(call[: int(rng.integers(len(call) // 2, len(call) + 1))])
        texts.append("".join(parts))
    return texts


def canonical_calls() -> list[str]:
    return [
        f'<tool_call>\n{{"name": "{tool}", "arguments": {{"model": "{alias}"}}}}\n</tool_call>'
        for tool in ENUMS
        for alias in sorted({a for args in ENUMS.values() for a in args["model"]})
    ]


@pytest.fixture(scope="module")
def demo():
    tokenizer = load_tokenizer("orchestra_jax/chat/assets/demo_tokenizer.json")
    return tokenizer, enum_argument_constraint(TOOLS, tokenizer)


def test_the_reference_reading_itself():
    ok, bad = (
        '{"name": "search", "arguments": {"model": "search-2"}}',
        '{"name": "search", "arguments": {"model": "answer-2"}}',
    )
    assert reference_ok(ok) and not reference_ok(bad)
    assert reference_ok('{"name": "answer", "arguments": {"model": "answ')
    assert not reference_ok('{"name": "answer", "arguments": {"model": "answx')
    assert reference_ok('{"name": "free", "arguments": {"model": "anything"}}')


def test_a_call_pairs_a_tool_only_with_its_own_models(demo):
    tokenizer, constraint = demo
    for text in canonical_calls():
        tool, alias = (
            text.split('"name": "')[1].split('"')[0],
            text.split('"model": "')[1].split('"')[0],
        )
        assert constraint.allows(tokenizer.encode(text)) == alias.startswith(tool + "-"), text


def test_agrees_with_the_reference_on_fuzzed_texts(demo):
    tokenizer, constraint = demo
    texts = fuzzed_texts(3000, seed=0)
    verdicts = [reference_ok(t) for t in texts]
    assert 0.2 < np.mean(verdicts) < 0.95  # both kinds are exercised
    for text, expected in zip(texts, verdicts):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert constraint.allows(ids) == expected, text


def test_every_prefix_of_an_accepted_text_is_accepted_and_leaves_a_way_on(demo):
    tokenizer, constraint = demo
    for text in fuzzed_texts(300, seed=1):
        ids = tokenizer.encode(text)
        if not constraint.allows(ids):
            continue
        state = constraint.start
        for t in ids:
            state = constraint.advance(state, [t])
            assert (constraint.next_state[state] >= 0).any()


def test_the_start_and_free_states_allow_every_token(demo):
    _, constraint = demo
    assert (constraint.next_state[constraint.start] >= 0).all()
    assert isinstance(constraint, TokenConstraint)


def test_tokens_the_tokenizer_does_not_know_are_refused_only_inside_a_value(demo):
    tokenizer, _ = demo
    texts = token_texts(tokenizer, tokenizer.vocab_size + 8)
    constraint = build_constraint(ENUMS, texts)
    unknown = constraint.next_state[:, -8:]
    prefix = tokenizer.encode('{"name": "search", "arguments": {"model": "sea')
    inside = constraint.advance(constraint.start, prefix)
    assert (unknown[inside] == -1).all()
    assert (unknown[constraint.start] == constraint.start).all()


def test_no_enum_argument_means_no_constraint(demo):
    tokenizer, _ = demo
    assert enum_argument_constraint(TOOLS[-1:], tokenizer) is None


def test_enum_values_json_would_escape_are_refused():
    tools = [
        {
            "name": "t",
            "parameters": {"properties": {"model": {"type": "string", "enum": ['a"b']}}},
        }
    ]
    with pytest.raises(ValueError, match="JSON writes unescaped"):
        enum_arguments(tools)


def test_the_real_qwen3_tokenizer(qwen3_dir):
    tokenizer = load_tokenizer(qwen3_dir)
    constraint = enum_argument_constraint(TOOLS, tokenizer, vocab_size=151936)
    assert constraint.vocab_size == 151936
    for text in canonical_calls():
        tool, alias = (
            text.split('"name": "')[1].split('"')[0],
            text.split('"model": "')[1].split('"')[0],
        )
        assert constraint.allows(tokenizer.encode(text)) == alias.startswith(tool + "-")
    for text in fuzzed_texts(300, seed=2):
        assert constraint.allows(tokenizer.encode(text)) == reference_ok(text), text
