"""Stop strings: where generated tokens first spell one of the request's stop strings.

Engines sample tokens; a stop string is text. After each batch of new tokens the
engine asks `first_stop` for the first token whose text completes a stop string,
keeps the tokens up to and including it and finishes the request ("stop").
Only a window of the last tokens is decoded per check: enough tokens before the
tested one to spell the longest stop string but one character (widened while
tokens spell nothing, as ids past a tokenizer's vocabulary do), so a long output
costs O(new tokens), not O(length^2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def first_stop(
    decode: Callable[[list[int]], str],
    tokens: Sequence[int],
    stops: Sequence[str],
    start: int = 0,
) -> tuple[int, str] | None:
    """(i, stop) for the first i >= start whose tokens[: i + 1] text contains a stop
    string; None if there is none.

    `stop` is the first of `stops` (in their order) present at that token. Tokens
    before `start` must have been checked already (no stop string in their text).
    """
    if not stops:
        return None
    longest = max(len(s) for s in stops)
    for i in range(start, len(tokens)):
        width = longest
        while True:
            low = max(0, i - width)
            if low == 0 or len(decode(list(tokens[low:i]))) >= longest - 1:
                break
            width *= 2
        text = decode(list(tokens[low : i + 1]))
        for stop in stops:
            if stop in text:
                return i, stop
    return None
