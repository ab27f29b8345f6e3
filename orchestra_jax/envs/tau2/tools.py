"""What the orchestrator can do in a τ² conversation: the domain's tools and an expert.

`DomainTool` is one of the domain's tools (tau2's own: name, schema, code). A
call runs in the episode's tau2 environment (`ToolContext.state`, a
`Tau2Episode`) through tau2's `Environment.get_response`, with tau2's error
semantics: a call that fails (bad arguments, a rule of the domain) returns
"Error: ..." to the policy and counts as a tool error. Domain tools cost
nothing and take no time, as in τ²-bench. A call runs off the event loop
(`tool_thread.run_off_loop`: other episodes go on meanwhile), so the agent's
per-call time limit holds: a call past it is that call's error, interrupted.

`ask_expert` is a meta-tool (`meta_tool_table.META_TOOLS` entry, one `model`
argument naming a priced alias, as the paper's meta-tools): the chosen expert
reads the domain policy, the domain's tools and the conversation so far, and
replies with the next step it recommends (a tool call, or a message to the
customer). Its reply is the observation; the policy decides what to do with
it. Cost = the expert's tokens at the alias's prices.

`call_expert` (`env.tau2.expert_mode="act"`, the same priced aliases) hands the
turn to the chosen expert: it reads tau2's agent prompt (instructions and
policy) and the conversation as tau2's agent sees it, as OpenAI chat messages,
with the domain's tools as OpenAI `tools`, and its reply is the agent's action:

  tool calls (at most `MAX_EXPERT_CALLS`)   run in the episode's tau2
            environment as the agent's calls (recorded in tau2's message record
            with the turn); the observation lists each call and its result
  a message (no tool call)   said to the user for the agent (the result's
            metadata `RELAYED_MESSAGE`, `agent/conversation.py`); the user's
            answer follows the observation
  neither   an error observation; nothing is done

One expert acts per policy turn: a second `call_expert` of the same turn is an
error (its tokens still charged). Cost and latency as `ask_expert`'s.
"""

from __future__ import annotations

import json
from typing import Any

from orchestra_jax.agent.conversation import RELAYED_MESSAGE, message_text
from orchestra_jax.chat.template import to_json
from orchestra_jax.envs.tool_thread import run_off_loop
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
CALL_EXPERT = MetaToolSpec(
    name="call_expert",
    alias_prefix="expert",
    role="act",
    role_prompt="",  # the expert reads tau2's own agent prompt (`agent_instructions`)
    description=(
        "Hand this turn to an expert model. The chosen model reads the policy, the tools "
        "and the conversation so far and takes the turn for you: its tool calls run, or "
        "its message is sent to the customer."
    ),
    argument_wording="take this turn",
    result="reply",
)
for _spec in (ASK_EXPERT, CALL_EXPERT):
    if _spec.name not in META_TOOLS:
        META_TOOLS.register(_spec.name, _spec)
# `env.tau2.expert_mode` -> the meta-tool the experts are offered through.
EXPERT_TOOLS = {"advise": ASK_EXPERT.name, "act": CALL_EXPERT.name}
# The most tool calls of one expert reply that are run (tau2's `generate` in the
# reference keeps six).
MAX_EXPERT_CALLS = 6

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
        _, message = await run_off_loop(
            episode.run_tool, self.name, arguments, lock=episode.tool_lock
        )
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


def expert_view(message: Any) -> dict[str, Any] | None:
    """A tau2 message as an OpenAI chat message for an acting expert (tau2's agent's
    view: the user's own tool calls and their results left out), or None."""
    role = getattr(message, "role", None)
    if role == "user":
        return None if message.tool_calls else {"role": "user", "content": message.content or ""}
    if role == "tool":
        if message.requestor == "user":
            return None
        return {"role": "tool", "tool_call_id": message.id, "content": message.content or ""}
    if role != "assistant":
        return None
    chat: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        chat["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": to_json(call.arguments)},
            }
            for call in message.tool_calls
        ]
    elif chat["content"] is None:
        chat["content"] = ""
    return chat


def reply_calls(reply: Any) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) of an expert reply's OpenAI `tool_calls`, in order; calls
    without a name or whose arguments are not a JSON object are left out."""
    calls = []
    for item in reply.tool_calls:
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                continue
        if isinstance(arguments, dict):
            calls.append((function["name"], arguments))
    return calls


class CallExpertTool(MetaTool):
    """`call_expert(model)`: the chosen expert takes the turn (module docstring)."""

    def __init__(self, tool_config: Any, backends: Any):
        super().__init__(tool_config, backends, CALL_EXPERT)

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if not hasattr(ctx.state, "run_tool"):
            return error_result(f"{self.name}: this episode has no τ² environment", tool=self.name)
        return await super().__call__(arguments, ctx)

    def expert_request(self, ctx: ToolContext, family: str) -> tuple[list[dict[str, Any]], float]:
        """tau2's agent prompt and the conversation as tau2's agent sees it."""
        from orchestra_jax.envs.tau2.user import agent_instructions

        del family
        episode = ctx.state
        messages = [{"role": "system", "content": agent_instructions(episode.policy)}]
        messages += [chat for m in episode.messages if (chat := expert_view(m)) is not None]
        return messages, self.backends.expert_temperature

    def expert_tools(self, ctx: ToolContext) -> list[dict[str, Any]]:
        """Every tool of the domain (those withheld from the policy too)."""
        return list(ctx.state.tool_schemas)

    async def finish(self, reply, ctx, cost, meta, family=""):
        del family
        episode, alias = ctx.state, meta["model"]
        calls, message = reply_calls(reply)[:MAX_EXPERT_CALLS], message_text(reply.text)

        def failed(text: str) -> ToolResult:
            return ToolResult(
                text=f"Error: {text}",
                error=text,
                cost_usd=cost,
                latency_s=reply.latency_s,
                metadata=meta,
            )

        if episode.expert_acted:
            return failed(f"{self.name}: an expert already took this turn")
        if calls:
            episode.expert_acted = True
            lines = []
            for name, arguments in calls:
                _, result = await run_off_loop(
                    episode.run_tool, name, arguments, lock=episode.tool_lock
                )
                lines.append(f"{name}({to_json(arguments)}) returned: {result.content}")
            meta["action"] = [{"name": n, "arguments": a} for n, a in calls]
            text = f"{alias} made tool calls for you:\n" + "\n".join(lines)
        elif message:
            episode.expert_acted = True
            meta["action"] = "message"
            meta[RELAYED_MESSAGE] = message
            text = f"{alias} said to the customer for you: {message}"
        else:
            return failed(f"{self.name}: {alias} made no tool call and wrote no message")
        return ToolResult(text=text, cost_usd=cost, latency_s=reply.latency_s, metadata=meta)
