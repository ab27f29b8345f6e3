"""What the orchestrator can do in a τ² conversation: the domain's tools and an expert.

`DomainTool` is one of the domain's tools (tau2's own: name, schema, code). A
call runs in the episode's tau2 environment (`ToolContext.state`, a
`Tau2Episode`) through tau2's `Environment.get_response`, with tau2's error
semantics: a call that fails (bad arguments, a rule of the domain) returns
"Error: ..." to the policy and counts as a tool error. Domain tools cost
nothing and take no time, as in τ²-bench.

`ask_expert` is a meta-tool (`meta_tool_table.META_TOOLS` entry, one `model`
argument naming a priced alias, as the paper's meta-tools): the chosen expert
reads the domain policy, the domain's tools and the conversation so far, and
replies with the next step it recommends (a tool call, or a message to the
customer). Its reply is the observation; the policy decides what to do with
it. Cost = the expert's tokens at the alias's prices.
"""

from __future__ import annotations

import json
from typing import Any

from orchestra_jax.tools.base import ToolContext, ToolResult, error_result
from orchestra_jax.tools.config import ModelProfile
from orchestra_jax.tools.meta_tool_table import META_TOOLS, MetaToolSpec
from orchestra_jax.tools.meta_tools import MetaTool

ASK_EXPERT = MetaToolSpec(
    name="ask_expert",
    alias_prefix="expert",
    role="advise",
    role_prompt=(
        "You advise a customer-service agent who must follow the policy below. Read the "
        "policy, the agent's tools and the conversation so far, and reply with the agent's "
        "best next step and nothing else: either exactly one tool call, written as\n"
        '<tool_call>\n{"name": <tool name>, "arguments": <arguments object>}\n</tool_call>\n'
        "or the message the agent should send to the customer."
    ),
    description=(
        "Ask an expert model for the next step. The chosen model reads the policy, the "
        "tools and the conversation so far, and replies with the step it recommends: one "
        "tool call or a message to the customer."
    ),
    argument_wording="advise on the next step",
    result="reply",
)
if ASK_EXPERT.name not in META_TOOLS:
    META_TOOLS.register(ASK_EXPERT.name, ASK_EXPERT)

# The experts on offer, at the prices of the paper's release (USD per million
# tokens in/out). Latencies are the typical figures written into the tool's
# description (the synthetic world's for models of these sizes); live experts
# are charged the latency measured.
EXPERT_PROFILES = (
    ModelProfile("ask_expert", "gpt-5", 1.25, 10.0, 30.0, "is a frontier model"),
    ModelProfile("ask_expert", "gpt-5-mini", 0.25, 2.0, 15.0, "is a small frontier model"),
    ModelProfile("ask_expert", "Qwen3-32B", 0.8, 0.8, 8.0, "is a 32B open-weights model"),
)

# Roles in the transcript an expert reads.
SPEAKERS = {"user": "Customer", "assistant": "Agent", "tool": "Tool result"}


class DomainTool:
    """One tool of a τ² domain, run in the episode's tau2 environment (module docstring)."""

    def __init__(self, tau2_tool: Any):
        self.name = tau2_tool.name
        self._schema = tau2_tool.openai_schema

    def schema(self) -> dict[str, Any]:
        return self._schema

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        episode = ctx.state
        if episode is None or not hasattr(episode, "run_tool"):
            return error_result(f"{self.name}: this episode has no τ² environment", tool=self.name)
        _, message = episode.run_tool(self.name, arguments)
        return ToolResult(
            text=message.content,
            error=message.content if message.error else None,
            metadata={"tool": self.name, "domain": episode.domain},
        )


def transcript(messages: list[dict[str, Any]]) -> str:
    """The conversation after the system prompt, one `Speaker: text` block a message."""
    lines = [
        f"{SPEAKERS.get(m['role'], m['role'])}: {m.get('content') or ''}"
        for m in messages
        if m.get("role") != "system"
    ]
    return "\n\n".join(lines)


class AskExpertTool(MetaTool):
    """`ask_expert(model)`: the chosen expert's advice on the next step is the observation."""

    def __init__(self, tool_config: Any, backends: Any):
        super().__init__(tool_config, backends, ASK_EXPERT)

    def expert_request(self, ctx: ToolContext, family: str) -> tuple[list[dict[str, Any]], float]:
        """The policy, the tools and the conversation so far, at `tools.expert_temperature`."""
        del family
        episode = ctx.state
        policy = getattr(episode, "policy", "")
        tools = "\n".join(json.dumps(s, ensure_ascii=False) for s in episode.tool_schemas)
        messages = [
            {"role": "system", "content": ASK_EXPERT.role_prompt},
            {
                "role": "user",
                "content": f"Policy:\n{policy}\n\nTools:\n{tools}\n\n"
                f"Conversation so far:\n{transcript(ctx.messages)}",
            },
        ]
        return messages, self.backends.expert_temperature
