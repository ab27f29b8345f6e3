"""A constraint on what an engine may sample: a finite automaton over token ids.

`TokenConstraint.next_state[s, v]` is the state after token v in state s, or
-1 when v is not allowed there; a request starts in `start` at its first
generated token. A sampler restricts each draw to the allowed tokens
(`sampling.sample_tokens(..., allowed=)`) and moves the state with the token
drawn; the reported log-probability stays the unrestricted one. Automata are
built by whoever knows what the text means (e.g. `agent/enum_arguments.py`,
the tool calls' enum arguments); engines only follow tables.

A table may cover fewer ids than a model's (a padded embedding's rows past the
tokenizer's vocabulary): an engine lets those ids keep a state that allows
every token and refuses them elsewhere.

Rules every table keeps (checked when built): the start state allows every
token (so an engine may sample the first token, at prefill, unmasked), and
every state reachable from it allows at least one token (a row never has
nothing to draw).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity
class TokenConstraint:
    """next_state int32 [S, V] (-1: not allowed); start in [0, S); name: what it constrains."""

    next_state: np.ndarray
    start: int
    name: str = ""

    def __post_init__(self):
        table = self.next_state
        if table.ndim != 2 or table.dtype != np.int32:
            raise ValueError(f"next_state must be int32 [S, V], got {table.dtype} {table.shape}")
        s = table.shape[0]
        if not 0 <= self.start < s:
            raise ValueError(f"start {self.start} is not a state (0..{s - 1})")
        if table.min() < -1 or table.max() >= s:
            raise ValueError("next_state entries must be -1 or a state")
        if (table[self.start] < 0).any():
            raise ValueError("the start state must allow every token")
        reachable = self.reachable()
        stuck = [int(i) for i in reachable if (table[i] < 0).all()]
        if stuck:
            raise ValueError(f"states {stuck[:5]} allow no token")

    @property
    def num_states(self) -> int:
        return self.next_state.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.next_state.shape[1]

    @functools.cached_property
    def allows_everything(self) -> np.ndarray:
        """bool [S]: the states where every token is allowed."""
        return np.all(self.next_state >= 0, axis=1)

    def widened(self, vocab_size: int) -> np.ndarray:
        """next_state over `vocab_size` >= its own ids: an id past the table keeps a
        state that allows every token and is refused elsewhere (see above)."""
        if vocab_size < self.vocab_size:
            raise ValueError(f"cannot narrow {self.vocab_size} ids to {vocab_size}")
        keep = np.where(self.allows_everything, np.arange(self.num_states), -1)
        pad = np.broadcast_to(keep[:, None], (self.num_states, vocab_size - self.vocab_size))
        return np.concatenate([self.next_state, pad.astype(np.int32)], axis=1)

    def reachable(self) -> np.ndarray:
        """The states reachable from `start`, sorted."""
        seen = np.zeros(self.num_states, bool)
        seen[self.start] = True
        frontier = [self.start]
        while frontier:
            nxt = np.unique(self.next_state[frontier])
            nxt = nxt[(nxt >= 0) & ~seen[np.maximum(nxt, 0)]]
            seen[nxt] = True
            frontier = nxt.tolist()
        return np.flatnonzero(seen)

    def advance(self, state: int, tokens: Sequence[int]) -> int:
        """The state after `tokens` from `state`; ValueError at a token not allowed.

        An id past the table keeps a state that allows every token (see above)."""
        for t in tokens:
            if t >= self.vocab_size:
                nxt = state if self.allows_everything[state] else -1
            else:
                nxt = int(self.next_state[state, t])
            if nxt < 0:
                raise ValueError(f"token {t} is not allowed in state {state} of {self.name!r}")
            state = nxt
        return state

    def allows(self, tokens: Sequence[int], state: int | None = None) -> bool:
        """Whether the automaton accepts `tokens` from `state` (default: the start)."""
        try:
            self.advance(self.start if state is None else state, tokens)
        except ValueError:
            return False
        return True
