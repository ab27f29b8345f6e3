"""Run one turn's tool calls concurrently; every failure becomes an observation.

The policy's text is hostile input and tools are fallible, so nothing here
raises: a malformed or unknown call, a tool that raises, and a tool that does
not answer within `timeout_s` each become a `ToolResultRecord` whose `text` is
an error message the model reads in its next turn. A result whose service
failed for good carries its `infra_failure` on, for the loop to end the episode.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from orchestra_jax.agent.trajectory import ToolCallRecord, ToolResultRecord
from orchestra_jax.chat.tool_calls import ToolCall, ToolCallError

NO_TOOL_CALL_MESSAGE = (
    "Error: no tool call found. Call one of the listed tools as "
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>.'
)


def call_feature(name: str, arguments: Mapping[str, Any], features: Collection[str]) -> str:
    """Feature name of a call: `tool:<alias>` for meta-tools, else `tool:<name>`.

    Meta-tools (`search`, `enhance_reasoning`, `answer`) name the model alias
    they route to in their `model` argument; the alias is what the user's
    preference vector and the reward count (`tool:search-1`, `tool:answer-math-2`).
    So: `tool:<model>` when that is one of the config's `features`, else `tool:<name>`.
    """
    model = arguments.get("model")
    if isinstance(model, str) and f"tool:{model}" in features:
        return f"tool:{model}"
    return f"tool:{name}"


def record_call(call: ToolCall | ToolCallError, features: Collection[str]) -> ToolCallRecord:
    """The JSON-friendly record of a parsed (or unparseable) call."""
    if isinstance(call, ToolCallError):
        return ToolCallRecord(name=None, arguments=None, raw=call.raw, error=call.message)
    return ToolCallRecord(
        name=call.name,
        arguments=dict(call.arguments),
        raw=call.raw,
        feature=call_feature(call.name, call.arguments, features),
    )


def json_safe(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`metadata` as plain JSON values (what is not JSON becomes its `str`)."""
    return json.loads(json.dumps(dict(metadata), default=str))


async def run_call(
    tool: Any,
    arguments: dict[str, Any],
    ctx: Any,
    *,
    timeout_s: float,
    charge_failure_time: bool = True,
) -> tuple[ToolResultRecord, str | None]:
    """Await `tool(arguments, ctx)` for at most `timeout_s` seconds.

    Returns the result record and the final answer (`answer` tool only). A
    timeout is charged `timeout_s` of latency, the time the episode waited. A
    tool that raises or returns no `ToolResult` is charged the wall time it
    took, or nothing with `charge_failure_time=False` (runs whose rewards must
    not depend on machine load, like `Backends.charge_measured_time=False`).
    """
    start = time.perf_counter()

    def failure_latency() -> float:
        return time.perf_counter() - start if charge_failure_time else 0.0

    try:
        result = await asyncio.wait_for(tool(arguments, ctx), timeout=timeout_s)
    except asyncio.TimeoutError:
        message = f"tool {tool.name!r} did not answer within {timeout_s:g} s"
        return ToolResultRecord(text=f"Error: {message}", latency_s=timeout_s, error=message), None
    except Exception as e:  # a buggy tool must not end the run; the model sees why
        message = f"tool {tool.name!r} failed: {type(e).__name__}: {e}"
        return ToolResultRecord(
            text=f"Error: {message}", latency_s=failure_latency(), error=message
        ), None
    if not isinstance(getattr(result, "text", None), str):
        message = f"tool {tool.name!r} returned {type(result).__name__}, not a ToolResult"
        return ToolResultRecord(
            text=f"Error: {message}", latency_s=failure_latency(), error=message
        ), None
    record = ToolResultRecord(
        text=result.text,
        cost_usd=float(result.cost_usd),
        latency_s=float(result.latency_s),
        error=result.error,
        metadata=json_safe(getattr(result, "metadata", None) or {}),
        infra_failure=getattr(result, "infra_failure", None),
    )
    return record, result.final_answer


async def run_calls(
    calls: Sequence[ToolCall | ToolCallError],
    tools: Mapping[str, Any],
    ctx: Any,
    *,
    timeout_s: float,
    charge_failure_time: bool = True,
) -> tuple[list[ToolResultRecord], str | None]:
    """Run the valid calls concurrently; one result per call, in call order.

    Invalid calls (`ToolCallError`) and names not in `tools` are answered with
    an error result without running anything. Returns the results and the first
    final answer among them (None when no `answer` call succeeded).
    """

    async def one(call):
        if isinstance(call, ToolCallError):
            return ToolResultRecord(text=f"Error: {call.message}", error=call.message), None
        tool = tools.get(call.name)
        if tool is None:
            message = f"unknown tool {call.name!r}; available tools: {sorted(tools)}"
            return ToolResultRecord(text=f"Error: {message}", error=message), None
        return await run_call(
            tool,
            dict(call.arguments),
            ctx,
            timeout_s=timeout_s,
            charge_failure_time=charge_failure_time,
        )

    outcomes = await asyncio.gather(*(one(call) for call in calls))
    answers = [answer for _, answer in outcomes if answer is not None]
    return [record for record, _ in outcomes], (answers[0] if answers else None)
