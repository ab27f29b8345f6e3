"""One τ² conversation's state: tau2's environment for the task and its message record.

`Tau2Episode` is what `Tau2Environment.reset(task)` returns and the episode's
tools, its user and its grader share (`ToolContext.state`):

  environment   tau2's own `Environment` for the task's domain (tools and
                database), initialised from the task's initial state
  messages      the conversation as tau2's orchestrator records it: the
                agent's greeting, then user messages, agent messages, agent
                (and user) tool calls each followed by their tool messages.
                tau2's evaluator grades this list.
  steps/errors  tau2's step and tool-error counters, and `termination`, the
                reason the conversation ended (a tau2 `TerminationReason`
                value), or None while it goes on
  expert_acted  an expert took the current policy turn (`call_expert`); the
                turn's record clears it
  tool_lock     keeps the episode's domain tool calls, each run off the event
                loop (`tool_thread.run_off_loop`), one at a time and in order

Steps are counted as tau2's half-duplex orchestrator counts them: every
message passed on (a user message, an agent message, a batch of tool results)
is one step; after each step that does not wait for the environment,
`steps >= max_steps` ends the conversation with "max_steps" and
`errors >= max_errors` with "too_many_errors", overriding the step's own
reason, as tau2 does.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

# tau2's half-duplex orchestrator opens every conversation with this agent message.
GREETING = "Hi! How can I help you today?"


@dataclasses.dataclass
class Tau2Episode:
    """See the module docstring. `task` is tau2's `Task`, `environment` tau2's
    `Environment`; `policy` and `tool_schemas` are what the agent is shown."""

    domain: str
    task: Any
    environment: Any
    policy: str
    tool_schemas: list[dict[str, Any]]
    max_steps: int
    max_errors: int
    messages: list[Any] = dataclasses.field(default_factory=list)
    pending: list[tuple[Any, Any]] = dataclasses.field(default_factory=list)
    steps: int = 0
    errors: int = 0
    termination: str | None = None
    user_state: Any = None
    expert_acted: bool = False
    tool_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock, repr=False)

    @property
    def done(self) -> bool:
        return self.termination is not None

    def run_tool(self, name: str, arguments: dict[str, Any], *, requestor: str = "assistant"):
        """Runs one tool call in tau2's environment (tau2's error semantics: a failing
        call returns a tool message "Error: ..." flagged `error`); returns tau2's
        tool call and tool message. An agent's calls wait in `pending` until
        `record_agent_calls`."""
        from tau2.data_model.message import ToolCall

        call = ToolCall(
            id=f"call_{len(self.messages)}_{len(self.pending)}",
            name=name,
            arguments=dict(arguments),
            requestor=requestor,  # type: ignore[arg-type]
        )
        result = self.environment.get_response(call)
        if requestor == "assistant":
            self.pending.append((call, result))
        return call, result

    def record_agent_calls(self) -> int:
        """The policy turn's domain calls enter the record: one agent message with
        the calls (a step towards the environment), then their results (a step
        back). Returns how many calls there were (0: nothing recorded)."""
        from tau2.data_model.message import AssistantMessage

        if not self.pending:
            return 0
        calls, results = zip(*self.pending)
        self.pending = []
        self.messages.append(AssistantMessage(role="assistant", tool_calls=list(calls)))
        self.count_step(to_environment=True)
        self.messages.extend(results)
        self.errors += sum(bool(r.error) for r in results)
        self.count_step()
        return len(calls)

    def end(self, reason: str) -> None:
        """The step's own reason to end (a stop signal, an empty message)."""
        self.termination = reason

    def count_step(self, *, to_environment: bool = False) -> None:
        """One message passed on; the budgets are checked unless it goes to the
        environment (see the module docstring)."""
        self.steps += 1
        if to_environment:
            return
        if self.steps >= self.max_steps:
            self.termination = "max_steps"
        if self.errors >= self.max_errors:
            self.termination = "too_many_errors"
