"""The user of a τ² conversation: tau2's user simulator (or a script) behind `OtherParty`.

`Tau2Conversation` is the other party the agent loop talks to. It keeps tau2's
record of the conversation in the episode's `Tau2Episode` the way tau2's
half-duplex orchestrator does (greeting, messages, tool calls and results,
steps, errors, stop signals) and asks a *speaker* for each user message:

  SimulatedUser  tau2's own `UserSimulator` (its guidelines and the task's user
                 scenario) answering through litellm from any OpenAI-compatible
                 endpoint (`base_url`, `model`: e.g. the project's rollout
                 server on 127.0.0.1 hosting a tiny model); failed calls are
                 retried with exponential backoff, then the episode ends with
                 the error recorded
  ScriptedUser   the user's messages from a list (tests, CPU demos)

The conversation ends when the user's message holds one of tau2's stop
signals (###STOP###, ###TRANSFER###, ###OUT-OF-SCOPE###: "user_stop"), when
the policy's message holds ###STOP### ("agent_stop"), when a message is empty
("agent_error", "user_error"), or at tau2's step or error budget. A user's
tool calls (domains with user tools, e.g. `mock`) run in the episode's
environment, as tau2 runs them, and the user speaks again. The user's tokens,
dollars and seconds are reported in each `PartyReply`, never charged to the
policy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Protocol

from orchestra_jax.agent.conversation import PartyReply, PolicyTurn
from orchestra_jax.envs.tau2.episode import Tau2Episode
from orchestra_jax.infra_failure import ServiceError, endpoint_of, is_service_failure
from orchestra_jax.tools.experts.client import backoff_delay

AGENT_STOP = "###STOP###"
USER_STOPS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")


class PartyError(ServiceError):
    """The user could not speak (its endpoint failed for good)."""


class Speaker(Protocol):
    """Produces the user's next tau2 `UserMessage` in reply to `incoming` (tau2's
    greeting, the agent's message, or the results of the user's own tool calls)."""

    async def say(self, episode: Tau2Episode, incoming: Any) -> Any: ...


def agent_instructions(policy: str) -> str:
    """tau2's own agent system prompt (its `LLMAgent`'s instructions and the policy)."""
    from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT

    return SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION)


class Tau2Conversation:
    """The `OtherParty` of τ² episodes (see the module docstring)."""

    def __init__(self, speaker: Speaker):
        self.speaker = speaker

    @property
    def endpoint(self) -> str:
        """Who plays the user, as failures name it (`infra_failure.endpoint_of`)."""
        return endpoint_of(self.speaker)

    async def open(self, state: Tau2Episode) -> PartyReply:
        """The conversation so far as the policy sees it (tau2's greeting, or the task's
        initial message history), then whoever speaks next, as tau2's orchestrator
        decides from the last message: after an agent message the user answers; after
        an agent's tool call the environment answers; otherwise it is the policy's turn."""
        from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage

        reply = PartyReply(
            messages=[{"role": "system", "content": agent_instructions(state.policy)}]
        )
        reply.messages += [chat for m in state.messages if (chat := policy_view(m)) is not None]
        last = state.messages[-1]
        if isinstance(last, AssistantMessage) and not last.is_tool_call():
            await self._user_speaks(state, last, reply)
        elif isinstance(last, AssistantMessage):
            results = [state.environment.get_response(call) for call in last.tool_calls or []]
            state.messages.extend(results)
            state.errors += sum(bool(r.error) for r in results)
            state.count_step()
            reply.messages += [{"role": "tool", "content": r.content} for r in results]
        elif not (
            (isinstance(last, UserMessage) and not last.is_tool_call())
            or (isinstance(last, ToolMessage) and last.requestor == "assistant")
        ):
            raise ValueError(
                f"a τ² conversation cannot start after {type(last).__name__} "
                f"(requestor {getattr(last, 'requestor', None)!r}, tool calls "
                f"{bool(getattr(last, 'tool_calls', None))})"
            )
        reply.end = state.termination
        return reply

    async def respond(self, state: Tau2Episode, turn: PolicyTurn) -> PartyReply:
        """After a turn of tool calls: record them (the domain calls it made, its
        own or an acting expert's); after a message (the turn's, or one a tool
        relayed): the user answers."""
        from tau2.data_model.message import AssistantMessage

        reply = PartyReply()
        state.expert_acted = False
        if turn.tool_calls:
            state.record_agent_calls()
        if not turn.is_message or state.done:
            reply.end = state.termination
            return reply
        if not turn.message:
            state.end("agent_error")  # tau2 refuses an empty agent message
            reply.end = state.termination
            return reply
        message = AssistantMessage(role="assistant", content=turn.message)
        state.messages.append(message)
        if AGENT_STOP in turn.message:
            state.end("agent_stop")
        state.count_step()
        if not state.done:
            await self._user_speaks(state, message, reply)
        reply.end = state.termination
        return reply

    async def _user_speaks(self, state: Tau2Episode, incoming: Any, reply: PartyReply) -> None:
        """The user's next message into `reply` (and tau2's record), running the
        user's own tool calls first; stops and budgets set `state.termination`."""
        from tau2.data_model.message import MultiToolMessage

        while True:
            start = time.perf_counter()
            message = await self.speaker.say(state, incoming)
            _add_usage(reply, message, time.perf_counter() - start)
            text = message.content or ""
            calls = message.tool_calls or []
            if not text.strip() and not calls:
                state.end("user_error")  # tau2 refuses an empty user message
                return
            state.messages.append(message)
            if not calls and any(stop in text for stop in USER_STOPS):
                state.end("user_stop")
            state.count_step(to_environment=bool(calls))
            if state.done:
                return
            if not calls:
                reply.messages.append({"role": "user", "content": text})
                return
            results = [state.environment.get_response(call) for call in calls]
            state.messages.extend(results)
            state.errors += sum(bool(r.error) for r in results)
            state.count_step()
            if state.done:
                return
            incoming = (
                results[0]
                if len(results) == 1
                else MultiToolMessage(role="tool", tool_messages=results)
            )


def policy_view(message: Any) -> dict[str, Any] | None:
    """A tau2 message as the policy reads it (a chat message), or None for the user's
    own tool calls and their results, which the agent never sees."""
    role = getattr(message, "role", None)
    if role == "user":
        return None if message.tool_calls else {"role": "user", "content": message.content or ""}
    if role == "tool":
        return {"role": "tool", "content": message.content} if message.requestor != "user" else None
    if role != "assistant":
        return None
    chat: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        chat["tool_calls"] = [
            {"function": {"name": c.name, "arguments": c.arguments}} for c in message.tool_calls
        ]
    return chat


def _add_usage(reply: PartyReply, message: Any, seconds: float) -> None:
    usage = getattr(message, "usage", None) or {}
    reply.calls += 1
    reply.prompt_tokens += int(usage.get("prompt_tokens") or 0)
    reply.completion_tokens += int(usage.get("completion_tokens") or 0)
    reply.cost_usd += float(getattr(message, "cost", None) or 0.0)
    reply.latency_s += seconds


class ScriptedUser:
    """The user's messages from `lines`, in order; ###STOP### once they run out.

    A line is the message's text, or `{"name": ..., "arguments": {...}}`: a call
    of one of the user's own tools (domains with user tools, e.g. `mock`).
    """

    def __init__(self, lines: Sequence[str | dict[str, Any]]):
        self.lines = list(lines)

    async def say(self, episode: Tau2Episode, incoming: Any) -> Any:
        from tau2.data_model.message import ToolCall, UserMessage

        del incoming
        said = episode.user_state = (episode.user_state or 0) + 1  # lines said, this one too
        said -= 1
        line = self.lines[said] if said < len(self.lines) else AGENT_STOP
        if isinstance(line, str):
            return UserMessage(role="user", content=line, cost=0.0)
        call = ToolCall(
            id=f"user_call_{said}",
            name=line["name"],
            arguments=dict(line.get("arguments", {})),
            requestor="user",
        )
        return UserMessage(role="user", tool_calls=[call], cost=0.0)


# litellm's errors that another attempt cannot fix (the request itself is wrong).
FINAL_ERRORS = (
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "UnprocessableEntityError",
)


class SimulatedUser:
    """tau2's `UserSimulator` for one task, served by an OpenAI-compatible endpoint.

    Args:
      task, environment: tau2's task (its user scenario is the simulator's
        instructions) and an environment of its domain (the user's tools, if any).
      base_url: the endpoint root, e.g. "http://127.0.0.1:30000/v1".
      model: the served model's name.
      api_key: sent as the bearer key (servers without authentication take any).
      temperature: the simulator's sampling temperature (tau2's default is 0).
      max_tokens: the most tokens a user message may have (None: the server's limit).
      price_in / price_out: USD per million input / output tokens of the served
        model, registered with litellm so that tau2 prices the user's usage
        (recorded apart from the policy's cost).
      retries / backoff_s / max_backoff_s: attempts after a failed call, with
        `backoff_delay` between them; then the episode ends with the error.
      timeout_s: seconds per attempt.
    """

    def __init__(
        self,
        task: Any,
        environment: Any,
        *,
        base_url: str,
        model: str,
        api_key: str = "EMPTY",
        temperature: float = 0.0,
        max_tokens: int | None = None,
        price_in: float = 0.0,
        price_out: float = 0.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        timeout_s: float = 600.0,
    ):
        import litellm
        from tau2.user.user_simulator import UserSimulator

        if retries < 0 or timeout_s <= 0:
            raise ValueError("retries >= 0 and timeout_s > 0")
        tools = None
        if environment.user_tools is not None:
            tools = environment.get_user_tools(include=task.user_tools) or None
        self.base_url, self.model = base_url, model
        litellm.register_model(
            {
                model: {
                    "input_cost_per_token": price_in / 1e6,
                    "output_cost_per_token": price_out / 1e6,
                    "litellm_provider": "openai",
                    "mode": "chat",
                }
            }
        )
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.simulator = UserSimulator(
            llm=f"openai/{model}",
            instructions=str(task.user_scenario),
            tools=tools,
            llm_args={
                "api_base": base_url,
                "api_key": api_key,
                "temperature": temperature,
                "timeout": timeout_s,
                "num_retries": 0,  # retried here, with the episode's record kept intact
                **({} if max_tokens is None else {"max_tokens": max_tokens}),
            },
        )

    async def say(self, episode: Tau2Episode, incoming: Any) -> Any:
        from tau2.user.user_simulator_base import is_valid_user_history_message

        if episode.user_state is None:  # what the user saw of the task's history
            seen = [
                m
                for m in episode.messages
                if m is not incoming and is_valid_user_history_message(m)
            ]
            episode.user_state = self.simulator.get_init_state(message_history=seen)
        state = episode.user_state
        last_error = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(backoff_delay(attempt - 1, self.backoff_s, self.max_backoff_s))
            kept = len(state.messages)
            try:
                message, _ = await asyncio.to_thread(
                    self.simulator.generate_next_message, incoming, state
                )
                return message
            except Exception as e:
                del state.messages[kept:]  # the failed attempt leaves nothing behind
                if not is_service_failure(e):  # a bug, not the endpoint's: never retried
                    raise
                last_error = f"{type(e).__name__}: {e}"
                if type(e).__name__ in FINAL_ERRORS:
                    break
        raise PartyError(
            f"user simulator {self.model!r} at {self.base_url} failed after "
            f"{attempt + 1} attempt(s); last error: {last_error}"
        )
