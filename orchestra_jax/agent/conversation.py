"""The other party of a conversation (e.g. a simulated user), as the agent loop meets it.

Where a task's environment has another party (`Environment.other_party(task)`),
an episode is a conversation:

    opening = await party.open(state)             the talk before the policy's first turn
    prompt  = render([system, *opening.messages], tools, generation prompt)       mask 0
    each policy turn (sampled, mask 1):
      with <tool_call>s: the calls run (domain tools, meta-tools), then
          party.respond(state, turn) may end the conversation (a step budget);
          otherwise the tool results follow (`tool_response_segment`, mask 0)
      without one: the turn is a message to the party (reasoning and
          <|im_end|> removed, `message_text`): party.respond(state, turn) answers
          with the party's next message (`user_message_segment`, mask 0) or ends
          the conversation (a stop signal, a step budget)
      with a call whose result relays a message (metadata `RELAYED_MESSAGE`,
          e.g. an expert acting for the agent): the calls' results, then the
          party's answer to that message, follow (mask 0)

`state` is the episode's own state (`Environment.reset(task)`), shared with
its tools, so the party can see what the tools did in the turn. A party that
fails for good (after its own retries) raises; the loop then ends the episode
with finish reason "error" and keeps everything sampled so far. What the party
spends (its tokens, dollars, seconds) is recorded in the trajectory's
`metadata["other_party"]`, never in the policy's cost or latency.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from orchestra_jax.agent.trajectory import ToolCallRecord

THINK_CLOSE = "</think>"
IM_END = "<|im_end|>"
# A tool result's metadata key: the message the tool said to the other party for
# the policy (`PolicyTurn.relayed`).
RELAYED_MESSAGE = "message_to_party"
USAGE_FIELDS = ("calls", "prompt_tokens", "completion_tokens", "cost_usd", "latency_s")


@dataclasses.dataclass
class PolicyTurn:
    """One policy turn as the other party sees it.

    Attributes:
      content: what the policy wrote, its reasoning and `<|im_end|>` removed.
      tool_calls: the turn's calls, parsed or not; empty when the turn is a
        message to the party.
      relayed: a message one of the turn's tools said to the party on the
        policy's behalf (`RELAYED_MESSAGE` in a result's metadata, e.g. an
        expert that acts for the agent); None when no tool did.
    """

    content: str
    tool_calls: Sequence[ToolCallRecord] = ()
    relayed: str | None = None

    @property
    def is_message(self) -> bool:
        """True when the turn says something to the party: it calls no tool, or a
        tool relayed a message."""
        return not self.tool_calls or self.relayed is not None

    @property
    def message(self) -> str:
        """What is said to the party: the relayed message, else the turn's content."""
        return self.content if self.relayed is None else self.relayed


@dataclasses.dataclass
class PartyReply:
    """What the other party does after the opening or after a policy turn.

    Attributes:
      messages: chat messages the policy reads next. From `open`: the whole
        opening (e.g. the agent's greeting and the user's first message),
        ending with a user message or tool results; a first system message
        there is the conversation's instructions (see `agent/loop.py`). From
        `respond`: nothing (after a turn of tool calls) or one user message.
      end: why the conversation ends here ("user_stop", "agent_stop",
        "max_steps", ...); None while it goes on.
      calls / prompt_tokens / completion_tokens / cost_usd / latency_s: what
        producing this reply cost the party (model calls, tokens, USD, seconds).
    """

    messages: list[dict[str, str]] = dataclasses.field(default_factory=list)
    end: str | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0

    def usage(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in USAGE_FIELDS}


@runtime_checkable
class OtherParty(Protocol):
    """The other side of a conversation (see the module docstring)."""

    async def open(self, state: Any) -> PartyReply: ...

    async def respond(self, state: Any, turn: PolicyTurn) -> PartyReply: ...


def message_text(generated: str) -> str:
    """A turn's text as said to the other party: without `<|im_end|>` and without
    the reasoning (everything up to the last `</think>`), stripped."""
    text = generated.removesuffix(IM_END)
    if THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1]
    return text.strip()


def add_usage(totals: dict[str, float], reply: PartyReply) -> None:
    """Adds `reply`'s usage to running `totals` (a dict over `USAGE_FIELDS`)."""
    for name, value in reply.usage().items():
        totals[name] = totals.get(name, 0) + value


def check_opening(reply: PartyReply) -> None:
    """An opening must end with a user message or tool results (the policy answers
    them), unless it ends the conversation."""
    last = reply.messages[-1].get("role") if reply.messages else None
    if reply.end is None and last not in ("user", "tool"):
        raise ValueError(
            "the other party's opening must end with a user message or tool results, "
            f"got {reply.messages!r}"
        )


def party_message(reply: PartyReply) -> str | None:
    """The one user message of a `respond` reply, or None; ValueError for anything else."""
    if not reply.messages:
        return None
    if len(reply.messages) != 1 or reply.messages[0].get("role") != "user":
        raise ValueError(
            f"the other party must answer with at most one user message, got {reply.messages!r}"
        )
    content = reply.messages[0].get("content")
    if not isinstance(content, str):
        raise ValueError(f"the other party's message must be text, got {content!r}")
    return content
