"""first_stop against a brute force over whole decodes (hand cases and fuzz)."""

import numpy as np
import pytest

from orchestra_jax.rollout.jax.stop_strings import first_stop

PIECES = ["a", "b", "ab", "ba", "", "é", "\n", "stop", "xy"]  # "" spells nothing (bytes)


def decode(ids):
    return "".join(PIECES[i] for i in ids)


def brute_force(tokens, stops):
    for i in range(len(tokens)):
        text = decode(tokens[: i + 1])
        for stop in stops:
            if stop in text:
                return i, stop
    return None


@pytest.mark.parametrize(
    "tokens, stops, expected",
    [
        ([0, 1, 0], ["ab"], (1, "ab")),
        ([2], ["ab"], (0, "ab")),
        ([0, 4, 4, 1], ["ab"], (3, "ab")),  # tokens that spell nothing in between
        ([7, 6], ["\n", "st"], (0, "st")),
        ([0, 0], ["b"], None),
        ([3, 0], ["aa", "ba"], (0, "ba")),
    ],
)
def test_hand_cases(tokens, stops, expected):
    assert first_stop(decode, tokens, stops) == expected


def test_incremental_checks_find_the_same_token():
    """Checked in chunks (as an engine does after each decode call), from `start` on."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        tokens = rng.integers(0, len(PIECES), 15).tolist()
        stops = ["".join(rng.choice(["a", "b", "x", "y"], rng.integers(1, 4)))]
        checked, found = 0, None
        while checked < len(tokens) and found is None:
            end = min(len(tokens), checked + int(rng.integers(1, 5)))
            found = first_stop(decode, tokens[:end], stops, start=checked)
            checked = end
        assert found == brute_force(tokens, stops), (tokens, stops)


def test_fuzz_against_whole_decodes():
    rng = np.random.default_rng(0)
    for _ in range(500):
        tokens = rng.integers(0, len(PIECES), rng.integers(0, 12)).tolist()
        stops = ["".join(rng.choice(["a", "b", "é", "x", "y"], rng.integers(1, 4)))]
        stops += ["".join(rng.choice(["a", "b"], 2))] * int(rng.integers(0, 2))
        # Only tokens whose own text does not contain the stop count (no stop before).
        assert first_stop(decode, tokens, stops) == brute_force(tokens, stops), (tokens, stops)
