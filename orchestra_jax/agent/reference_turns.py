"""A QA turn read and charged as the reference release does (`agent.tool_calls`,
`agent.accounting` "reference"; files under the release's `training/`, gen =
`lead_agent/llm_agent/generation_quick3.py`).

Reading (`postprocess_predictions`, gen 2104-2129): the turn's text is split at
every `<tool_call>` and then at every `</tool_call>`; each piece that is a JSON
object with exactly the keys `name` and `arguments`, names an offered tool, and
(for a meta-tool) whose `model` is one of the tool's aliases, is a call; a piece
naming a tool already named is dropped, even when the first was invalid. `<think>` is not set apart, so a call
written while thinking counts, and so does a bare JSON call outside the tags.
Invalid calls are dropped without an observation; the turn is well-formed when at
least one call is left. Only those calls run.

Charges (`execute_predictions` 2041-2074, `run_llm_loop` 1282, 1337): a turn's
tool cost and latency are the sums over its calls in order, up to its `answer`
call, which ends the turn (its `break` comes before the sums: the answer's own cost
and latency are never added); the orchestrator's generation time is not latency;
its tokens are charged input and output (`token_cost`; the release's Qwen3-8B
prices are 0.2 and 0.2 per million, so one `ToolConfig.orchestrator_price`).

`TOOL_CALL_READINGS` and `ACCOUNTINGS` name the choices of `agent.tool_calls` and
`agent.accounting`; "project" is the default of each (`agent/loop.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestra_jax.agent.trajectory import ToolCallRecord, ToolResultRecord
from orchestra_jax.chat.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall
from orchestra_jax.tools.meta_tool_table import is_meta_tool

TOOL_CALL_READINGS = ("project", "reference")
ACCOUNTINGS = ("project", "reference")
ANSWER_TOOL = "answer"


def offered_models(tool_names: Sequence[str], tool_config: Any) -> dict[str, list[str] | None]:
    """Each offered tool's valid `model` arguments: a meta-tool's aliases in
    `tool_config`, None (any arguments) for a plain tool."""
    return {
        name: [a.alias for a in tool_config.aliases_for(name)] if is_meta_tool(name) else None
        for name in tool_names
    }


def reference_tool_calls(text: str, offered: Mapping[str, Sequence[str] | None]) -> list[ToolCall]:
    """The calls the release reads in `text` (module docstring), in the order written;
    `offered` maps each offered tool to its valid `model` arguments (`offered_models`)."""
    calls: list[ToolCall] = []
    called: set[str] = set()
    for component in text.split(TOOL_CALL_OPEN):
        for piece in component.split(TOOL_CALL_CLOSE):
            try:
                call = json.loads(piece)
            except (ValueError, RecursionError):
                continue
            if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
                continue
            name, arguments = call["name"], call["arguments"]
            if not isinstance(name, str) or name not in offered or name in called:
                continue
            called.add(name)  # before the arguments are checked: a bad first call blocks
            models = offered[name]
            if not isinstance(arguments, dict):
                continue
            if models is not None and arguments.get("model") not in models:
                continue
            calls.append(ToolCall(name, arguments, piece))
    return calls


def reference_charges(
    calls: Sequence[ToolCallRecord], results: Sequence[ToolResultRecord]
) -> tuple[float, float]:
    """(cost, latency) of a turn's calls as the release sums them: each call's in
    order, stopping at the first `answer` call that returned (not counted)."""
    cost = latency = 0.0
    for call, result in zip(calls, results, strict=True):
        if call.name == ANSWER_TOOL and result.error is None:
            break
        cost += result.cost_usd
        latency += result.latency_s
    return cost, latency
