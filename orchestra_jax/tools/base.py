"""The tool protocol: what the agent loop calls and what comes back.

Every tool is an async callable `tool(arguments, ctx) -> ToolResult`. It never
raises for bad model input: a bad argument or a failing backend becomes a
`ToolResult` with `error` set, which the agent loop shows the model as an
observation.

Accounting (the paper's): `cost_usd` is what the call cost in US dollars
(expert tokens x the alias's price per million tokens, search queries and
documents, seconds of code execution); `latency_s` is the call's latency in
seconds, either measured (real backends) or simulated (offline experts). The
agent loop sums them per episode; wall-clock time of the episode is a separate
quantity.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from orchestra_jax.infra_failure import InfraFailure
from orchestra_jax.tasks import Task


@dataclasses.dataclass
class ToolResult:
    """The outcome of one tool call.

    Attributes:
      text: what the orchestrator sees inside `<tool_response>`.
      cost_usd: the call's cost in USD.
      latency_s: the call's (measured or simulated) latency in seconds.
      error: a message when the call failed (the text then explains it too).
      metadata: extras for logs and metrics (model alias, backend, tokens, query,
        code, …). Never read by the orchestrator.
      final_answer: set only by the `answer` tool: the episode's final answer.
        The agent loop ends the episode when a result carries a final answer.
      infra_failure: set when a service behind the tool failed for good (an
        expert endpoint, the search backend; `orchestra_jax/infra_failure.py`): the
        agent loop ends the episode, which is not the policy's failure.
    """

    text: str
    cost_usd: float = 0.0
    latency_s: float = 0.0
    error: str | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    final_answer: str | None = None
    infra_failure: InfraFailure | None = None

    @property
    def is_final(self) -> bool:
        """True when this result ends the episode (the `answer` tool succeeded)."""
        return self.final_answer is not None


@dataclasses.dataclass
class ToolContext:
    """The episode state a tool may read and extend.

    Attributes:
      task: the task being solved (simulated experts read its gold answer).
      messages: the conversation so far as OpenAI-style messages
        (`{"role": ..., "content": ...}`); experts read it.
      documents: texts retrieved so far in this episode; `search` appends.
      notes: other intermediate results (code outputs of `enhance_reasoning`).
      seed: the episode's seed; simulated tools derive their randomness from it
        so an episode replays identically.
      state: the environment's per-episode state (`Environment.reset(task)`,
        e.g. a database the tools read and change); None for stateless worlds.
    """

    task: Task
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    documents: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seed: int = 0
    state: Any = None


@runtime_checkable
class Tool(Protocol):
    """A callable tool with an OpenAI function schema."""

    name: str

    def schema(self) -> dict[str, Any]:
        """`{"type": "function", "function": {"name", "description", "parameters"}}`."""
        ...

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


def error_result(message: str, **metadata: Any) -> ToolResult:
    """A failed call: the model sees `Error: message`; nothing was charged."""
    return ToolResult(text=f"Error: {message}", error=message, metadata=metadata)


def function_schema(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    """Builds an OpenAI function-tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(required),
            },
        },
    }
