"""Tool calls' enum arguments, constrained while sampling (`agent.constrain_enum_arguments`).

A call written as Qwen3 writes it (`chat/tool_calls.py`, JSON with `json.dumps`'
separators)::

    <tool_call>
    {"name": "search", "arguments": {"model": "search-1"}}
    </tool_call>

names its tool first; once it does, a string argument whose schema has an
`enum` (the tool's model aliases) can take only those values: after
`"model": "` the sampler may write only a prefix of one of the tool's aliases,
then the closing quote. Everything else is left to the model: text outside
calls, calls of tools with no enum argument, other arguments, a call written
with other spacing or with its arguments before its name (then nothing is
constrained, and the parser reads it as it is).

The automaton is built at the level of characters (states below), then over
the tokenizer's tokens (each token's decoded text run through it; a token whose
text leaves an enum value's prefixes is not allowed there), as a
`rollout.token_constraint.TokenConstraint` that the JAX engine follows.

Character states:
  free(buf)               outside a call's name; buf: the longest end of the text
                          that begins `"name": "`
  name(prefix)            reading a tool name, a prefix of a constrained tool's
  call(tool, buf)         in `tool`'s call; buf: the longest end of the text that
                          begins `"<enum argument>": "`, `"name": "` or `</tool_call>`
  value(tool, arg, prefix)  inside an enum argument's string: only prefixes of its
                          values, then `"` after a whole value (back to call)
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orchestra_jax.chat.tool_calls import TOOL_CALL_CLOSE, tool_parameters
from orchestra_jax.rollout.token_constraint import TokenConstraint

NAME_KEY = '"name": "'
_REJECT = -1


def enum_arguments(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, tuple[str, ...]]]:
    """{tool: {argument: values}} for the top-level string arguments with an `enum`.

    Values must be non-empty strings that JSON writes as they are (no quote,
    backslash or control character): the automaton reads the raw text.
    """
    found: dict[str, dict[str, tuple[str, ...]]] = {}
    for tool, parameters in tool_parameters(tools).items():
        for arg, schema in (parameters.get("properties") or {}).items():
            values = schema.get("enum") if isinstance(schema, Mapping) else None
            if not isinstance(values, list) or not values or arg == "name":
                continue
            if not all(isinstance(v, str) and v and json.dumps(v) == f'"{v}"' for v in values):
                raise ValueError(
                    f"tool {tool!r} argument {arg!r}: enum values must be non-empty strings "
                    f"that JSON writes unescaped to be constrained, got {values!r}"
                )
            if '"' in tool or "\\" in tool:
                raise ValueError(f"tool name {tool!r} cannot be constrained (quote or backslash)")
            found.setdefault(tool, {})[arg] = tuple(values)
    return found


def _longest_start(text: str, keys: Sequence[str]) -> str:
    """The longest end of `text` that is the beginning of one of `keys` ('' if none)."""
    for k in range(min(len(text), max(map(len, keys))), 0, -1):
        if any(key.startswith(text[-k:]) for key in keys):
            return text[-k:]
    return ""


class _CharAutomaton:
    """The character states above and their transitions (None: rejected)."""

    def __init__(self, enums: Mapping[str, Mapping[str, Sequence[str]]]):
        self.enums = enums
        self.call_keys = {
            tool: [NAME_KEY, TOOL_CALL_CLOSE] + [f'"{arg}": "' for arg in args]
            for tool, args in enums.items()
        }

    def _scan(self, buf: str, c: str, keys: Sequence[str]) -> tuple[str | None, str]:
        text = buf + c
        for key in keys:
            if text.endswith(key):
                return key, ""
        return None, _longest_start(text, keys)

    def step(self, state: tuple, c: str) -> tuple | None:
        mode = state[0]
        if mode == "free":
            key, buf = self._scan(state[1], c, [NAME_KEY])
            return ("name", "") if key else ("free", buf)
        if mode == "name":
            prefix = state[1]
            if c == '"' and prefix in self.enums:
                return ("call", prefix, "")
            if c != '"' and any(tool.startswith(prefix + c) for tool in self.enums):
                return ("name", prefix + c)
            return ("free", _longest_start(NAME_KEY + prefix + c, [NAME_KEY]))
        if mode == "call":
            tool = state[1]
            key, buf = self._scan(state[2], c, self.call_keys[tool])
            if key == NAME_KEY:
                return ("name", "")
            if key == TOOL_CALL_CLOSE:
                return ("free", "")
            if key is not None:
                return ("value", tool, key[1:-4], "")
            return ("call", tool, buf)
        _, tool, arg, prefix = state
        values = self.enums[tool][arg]
        if c == '"' and prefix in values:
            return ("call", tool, "")
        if any(v.startswith(prefix + c) for v in values):
            return ("value", tool, arg, prefix + c)
        return None

    def alphabet(self) -> list[str]:
        """The characters the automaton tells apart; any other behaves as '\\x00'."""
        chars = set(NAME_KEY + TOOL_CALL_CLOSE)
        for tool, args in self.enums.items():
            chars.update(tool)
            for arg, values in args.items():
                chars.update(arg + "".join(values))
        return sorted(chars) + ["\x00"]

    def table(self) -> tuple[list[tuple], list[str], np.ndarray]:
        """(states, alphabet, next int32 [states, alphabet]) of the states reachable
        from free(''), which is states[0]."""
        alphabet = self.alphabet()
        states: list[tuple] = [("free", "")]
        index = {states[0]: 0}
        rows = []
        for state in states:  # grows while it is walked
            row = []
            for c in alphabet:
                nxt = self.step(state, c)
                if nxt is None:
                    row.append(_REJECT)
                    continue
                if nxt not in index:
                    index[nxt] = len(states)
                    states.append(nxt)
                row.append(index[nxt])
            rows.append(row)
        return states, alphabet, np.asarray(rows, np.int32)


def token_texts(tokenizer: Any, vocab_size: int) -> list[str]:
    """Each id's decoded text (ids past the tokenizer's vocabulary: '')."""
    known = min(vocab_size, tokenizer.vocab_size)
    return [tokenizer.decode([i]) for i in range(known)] + [""] * (vocab_size - known)


def build_constraint(
    enums: Mapping[str, Mapping[str, Sequence[str]]], texts: Sequence[str], name: str = ""
) -> TokenConstraint:
    """The token automaton of `enums` (see `enum_arguments`) over tokens with these texts.

    A token is run through the character automaton one character at a time (all
    tokens at once, per character position); it is allowed in a state unless a
    character is rejected. A token with no text (ids the tokenizer does not
    know) keeps the state, except inside an enum value, where it is not allowed.
    """
    states, alphabet, char_next = _CharAutomaton(enums).table()
    column = {c: i for i, c in enumerate(alphabet)}
    other = column["\x00"]
    num_states, width = char_next.shape
    # Padding past a token's end keeps the state; a rejected state stays rejected
    # (row num_states); an empty token is the one column it does not keep.
    reject_row = num_states
    pad, empty = width, width + 1
    step = np.full((num_states + 1, width + 2), reject_row, np.int32)
    step[:num_states, :width] = np.where(char_next < 0, reject_row, char_next)
    step[:, pad] = np.arange(num_states + 1)
    in_value = np.array([s[0] == "value" for s in states] + [True])
    step[:, empty] = np.where(in_value, reject_row, np.arange(num_states + 1))

    lengths = np.array([max(len(t), 1) for t in texts])
    chars = np.full((len(texts), lengths.max()), pad, np.int32)
    for i, text in enumerate(texts):
        if not text:
            chars[i, 0] = empty
        for j, c in enumerate(text):
            chars[i, j] = column.get(c, other)
    # Longest tokens first, so position j updates a prefix of the columns.
    order = np.argsort(-lengths, kind="stable")
    chars, sorted_lengths = chars[order], lengths[order]
    current = np.broadcast_to(np.arange(num_states)[:, None], (num_states, len(texts))).copy()
    for j in range(chars.shape[1]):
        n = int(np.sum(sorted_lengths > j))
        current[:, :n] = step[current[:, :n], chars[None, :n, j]]
    table = np.empty_like(current)
    table[:, order] = current
    table = np.where(table == reject_row, _REJECT, table).astype(np.int32)
    return TokenConstraint(table, start=0, name=name)


@functools.lru_cache(maxsize=8)
def _cached(key: str, tokenizer: Any, vocab_size: int) -> TokenConstraint | None:
    enums = json.loads(key)
    if not enums:
        return None
    return build_constraint(enums, token_texts(tokenizer, vocab_size), name=f"enum arguments {key}")


def enum_argument_constraint(
    tools: Sequence[Mapping[str, Any]], tokenizer: Any, vocab_size: int | None = None
) -> TokenConstraint | None:
    """The constraint for these tool schemas (None when no tool has an enum argument);
    built once per (schemas' enums, tokenizer, vocabulary) and shared."""
    key = json.dumps(enum_arguments(tools), sort_keys=True)
    return _cached(key, tokenizer, vocab_size or tokenizer.vocab_size)
