"""Plain tools: named functions the orchestrator calls directly.

Unlike the meta-tools, a plain tool has no model alias; its feature name is
"tool:<name>". Two kinds share one registry keyed by name (`PLAIN_TOOLS`):
  * "python": the orchestrator writes code; it runs in the sandbox and is
    billed per second (`ToolConfig.code_price_per_s`);
  * any function registered with `register_function_tool` (its return value,
    a string or a `ToolResult`, is the observation; it costs nothing unless
    it returns a `ToolResult` with a cost).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from orchestra_jax.registry import Registry
from orchestra_jax.tools import pricing
from orchestra_jax.tools.base import ToolContext, ToolResult, error_result, function_schema
from orchestra_jax.tools.meta_tool_table import is_meta_tool

MAX_OBSERVATION_CHARS = 4000


def format_sandbox_result(result: Any) -> str:
    """Sandbox output as an observation: stdout, stderr, and how it ended."""
    parts = []
    if result.stdout:
        parts.append(result.stdout[-MAX_OBSERVATION_CHARS:].rstrip())
    if result.stderr:
        parts.append("stderr:\n" + result.stderr[-MAX_OBSERVATION_CHARS:].rstrip())
    if result.timed_out:
        parts.append("(stopped: wall-time limit reached)")
    elif result.exit_code != 0:
        parts.append(f"(exit code {result.exit_code})")
    if result.output_truncated:
        parts.append("(output truncated)")
    return "\n".join(parts) if parts else "(no output)"


class FunctionTool:
    """A Python function (sync or async) behind the `Tool` protocol."""

    def __init__(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        fn: Callable[..., Any],
        required: list[str] | None = None,
    ):
        self.name = name
        self._schema = function_schema(
            name, description, parameters, list(parameters) if required is None else required
        )
        self.fn = fn

    def schema(self) -> dict[str, Any]:
        return self._schema

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        params = self._schema["function"]["parameters"]
        missing = [r for r in params["required"] if r not in arguments]
        unknown = [a for a in arguments if a not in params["properties"]]
        if missing or unknown:
            return error_result(
                f"{self.name}: missing arguments {missing}, unknown arguments {unknown}",
                tool=self.name,
            )
        try:
            if inspect.iscoroutinefunction(self.fn):
                out = await self.fn(**arguments)
            else:
                out = await asyncio.to_thread(self.fn, **arguments)
        except Exception as e:  # a failing tool is an observation, not a crash
            return error_result(f"{self.name} failed: {type(e).__name__}: {e}", tool=self.name)
        return (
            out
            if isinstance(out, ToolResult)
            else ToolResult(text=str(out), metadata={"tool": self.name})
        )


class PythonTool:
    """`python(code)`: runs orchestrator-written code in the sandbox.

    cost = duration_s * code_price_per_s; latency = duration_s (measured;
    both 0 where `Backends.charge_measured_time` is off).
    The output is also appended to ctx.notes.
    """

    name = "python"

    def __init__(self, tool_config: Any, backends: Any):
        self.config, self.backends = tool_config, backends

    def schema(self) -> dict[str, Any]:
        return python_schema()

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return error_result("python needs a non-empty string argument 'code'", tool=self.name)
        result = await asyncio.to_thread(
            self.backends.run_code, code, timeout_s=self.config.code_timeout_s
        )
        text = format_sandbox_result(result)
        ctx.notes.append(text)
        seconds = self.backends.charged_seconds(result.duration_s)
        return ToolResult(
            text=text,
            cost_usd=pricing.code_cost(seconds, self.config.code_price_per_s),
            latency_s=seconds,
            metadata={
                "tool": self.name,
                "code": code,
                "output": text,
                "stdout": "" if result.timed_out else result.stdout,
                "exit_code": result.exit_code,
                "timed_out": result.timed_out,
            },
        )


def python_schema() -> dict[str, Any]:
    return function_schema(
        "python",
        "Run Python code in a sandbox (no network, no files outside a "
        "scratch folder; standard library, numpy and sympy) and return what it "
        "prints. Billed per second of execution.",
        {"code": {"type": "string", "description": "The program to run."}},
        ["code"],
    )


@dataclasses.dataclass(frozen=True)
class PlainTool:
    """A registered plain tool: its schema, and how a task's tool is made."""

    schema: Callable[[], dict[str, Any]]
    make: Callable[[Any, Any], Any]  # (tool_config, backends) -> Tool


PLAIN_TOOLS: Registry[PlainTool] = Registry("plain tool")
PLAIN_TOOLS.register("python", PlainTool(python_schema, PythonTool))


def register_tool(tool: FunctionTool) -> None:
    """Makes `tool.name` usable in `ToolConfig.tools` (raises if the name is taken)."""
    if tool.name in PLAIN_TOOLS or is_meta_tool(tool.name):
        raise ValueError(f"tool name {tool.name!r} is already registered")
    PLAIN_TOOLS.register(tool.name, PlainTool(tool.schema, lambda config, backends: tool))


def register_function_tool(
    name: str,
    description: str,
    parameters: dict[str, Any],
    fn: Callable[..., Any],
    required: list[str] | None = None,
) -> None:
    """Makes `name`, calling `fn`, usable in `ToolConfig.tools` (raises if taken)."""
    register_tool(FunctionTool(name, description, parameters, fn, required))


def is_plain_tool(name: str) -> bool:
    return name in PLAIN_TOOLS


def plain_tool_names() -> list[str]:
    return PLAIN_TOOLS.names()


def plain_tool_schema(name: str) -> dict[str, Any]:
    return PLAIN_TOOLS.get(name).schema()


def make_plain_tool(name: str, tool_config: Any, backends: Any) -> Any:
    if name not in PLAIN_TOOLS:
        raise KeyError(f"unknown plain tool {name!r}; known: {plain_tool_names()}")
    return PLAIN_TOOLS.get(name).make(tool_config, backends)
