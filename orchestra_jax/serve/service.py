"""One orchestration per request, every request on one shared engine.

`Orchestrator.answer(request, on_step)` plays one episode of the agent loop
(`agent/loop.run_episodes` on one `EpisodeSpec`) for the request's question, with
the request's own tools (`env.tools`), state and `ToolContext`, and returns what
the HTTP layer sends (docs/serving.md). Each turn is one `engine.generate` call on
the shared engine, whose continuous batching (the JAX engine's slots, the vLLM and
SGLang schedulers) mixes the turns of every request in flight; the loop's own
micro-batcher sees one episode and sends each turn at once.

Steps are reported as they happen through `on_step`: a `turn` when the engine
returned the orchestrator's turn, a `call` when one of its tool calls finished
(or failed, or timed out). A cancelled `answer` (the client went away) cancels its
tool calls and its engine calls (the JAX engine frees their rows; the HTTP engines
close their requests, which the servers abort); code already running in the
sandbox ends at its own wall-time limit.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestra_jax.agent.episode import EpisodeSpec
from orchestra_jax.agent.loop import LoopLimits, run_episodes
from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.serve.request import BadRequest, Defaults, OrchestrationRequest
from orchestra_jax.tasks import Task
from orchestra_jax.tools.config import ToolConfig
from orchestra_jax.tools.pricing import token_cost

RESULT_CHARS = 300  # how much of a call's result a step and `usage.calls` show
BUDGET_STOPS = ("max_turns", "max_cost", "context")  # finish_reason "length"
Step = dict[str, Any]


class _Progress:
    """One request's running account: turns so far, cost so far, where steps go."""

    def __init__(self, on_step: Callable[[Step], None] | None, price: float):
        self.on_step, self.price = on_step, price
        self.turns = 0
        self.cost_usd = 0.0
        # `call` steps sent, by (turn, tool): the calls that never reached a tool (a
        # call that did not parse, an unknown tool) are the rest, sent at the end.
        self.reported: collections.Counter[tuple[int, str | None]] = collections.Counter()

    def emit(self, step: Step) -> None:
        if step["type"] == "call":
            self.reported[(step["turn"], step["tool"])] += 1
        if self.on_step is not None:
            self.on_step({**step, "cost_usd_so_far": self.cost_usd})


class _ReportingEngine:
    """The shared engine as one request sees it: each completion is reported as a
    `turn` step, and the request's engine calls can be cancelled together."""

    def __init__(self, engine: Any, progress: _Progress):
        self._engine, self._progress = engine, progress
        self._calls: set[asyncio.Task] = set()

    def __getattr__(self, name: str) -> Any:  # endpoint, urls, … name the real engine
        return getattr(self._engine, name)

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Any]:
        call = asyncio.ensure_future(self._engine.generate(requests))
        self._calls.add(call)
        try:
            completions = await call
        finally:
            self._calls.discard(call)
        progress = self._progress
        for request, completion in zip(requests, completions):
            prompt, n = len(request.input_ids), len(completion.output_ids)
            progress.cost_usd += token_cost(prompt, n, progress.price, progress.price)
            progress.emit(
                {
                    "type": "turn",
                    "turn": progress.turns,
                    "prompt_tokens": prompt,
                    "completion_tokens": n,
                    "latency_s": float(completion.latency_s),
                }
            )
            progress.turns += 1
        return completions

    def cancel(self) -> None:
        """Cancels the request's engine calls in flight (their slots are freed)."""
        for call in list(self._calls):
            call.cancel()


def _model_of(name: str | None, arguments: Mapping[str, Any] | None, config: ToolConfig):
    model = (arguments or {}).get("model")
    aliases = {a.alias for a in config.aliases}
    return model if isinstance(model, str) and model in aliases else None


class _ReportingTool:
    """A tool whose finished calls are reported as `call` steps."""

    def __init__(self, tool: Any, progress: _Progress, config: ToolConfig):
        self._tool, self._progress, self._config = tool, progress, config
        self.name = tool.name

    def schema(self) -> dict[str, Any]:
        return self._tool.schema()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tool, name)

    async def __call__(self, arguments: dict[str, Any], ctx: Any) -> Any:
        progress = self._progress
        step = {
            "type": "call",
            "turn": progress.turns - 1,
            "tool": self.name,
            "model": _model_of(self.name, arguments, self._config),
            "arguments": arguments,
        }
        start = time.perf_counter()
        try:
            result = await self._tool(arguments, ctx)
        except asyncio.CancelledError:  # the loop's timeout, or the request ended
            step.update(cost_usd=0.0, latency_s=time.perf_counter() - start, result="")
            progress.emit({**step, "error": "cancelled: timed out or the request ended"})
            raise
        except Exception as e:
            step.update(cost_usd=0.0, latency_s=time.perf_counter() - start, result="")
            progress.emit({**step, "error": f"{type(e).__name__}: {e}"})
            raise
        cost = float(getattr(result, "cost_usd", 0.0) or 0.0)
        progress.cost_usd += cost
        text = getattr(result, "text", "")
        progress.emit(
            {
                **step,
                "cost_usd": cost,
                "latency_s": float(getattr(result, "latency_s", 0.0) or 0.0),
                "error": getattr(result, "error", None),
                "result": text[:RESULT_CHARS] if isinstance(text, str) else "",
            }
        )
        return result


@dataclasses.dataclass
class Prepared:
    """A request's episode before it runs (`Orchestrator.prepare`)."""

    request: OrchestrationRequest
    spec: EpisodeSpec
    sampling: SamplingParams
    limits: LoopLimits
    progress: _Progress


@dataclasses.dataclass
class Answer:
    """What one orchestration gives back (docs/serving.md's response fields)."""

    content: str
    finish_reason: str  # "stop" or "length"
    usage: dict[str, Any]
    orchestration: dict[str, Any]


def calls_of(traj: Trajectory, config: ToolConfig) -> list[dict[str, Any]]:
    """`usage.calls`: one entry per call of the episode, in order."""
    calls = []
    for t, turn in enumerate(traj.turns):
        for call, result in zip(turn.tool_calls, turn.tool_results):
            calls.append(
                {
                    "turn": t,
                    "tool": call.name,
                    "model": _model_of(call.name, call.arguments, config),
                    "arguments": call.arguments,
                    "cost_usd": result.cost_usd,
                    "latency_s": result.latency_s,
                    "error": result.error or call.error,
                    "result": result.text[:RESULT_CHARS],
                }
            )
    return calls


def _no_answer(traj: Trajectory, request: OrchestrationRequest) -> str:
    reason = traj.finish_reason
    if reason == "max_cost":
        return (
            f"No answer: the orchestration stopped at its cost budget (max_cost_usd="
            f"{request.max_cost_usd:g}; ${traj.cost_usd:.6f} spent) before answering."
        )
    if reason == "max_turns":
        return f"No answer: the orchestration used its {request.max_turns} turns."
    if reason == "context":
        return "No answer: the orchestration filled its context before answering."
    if reason == "error":
        return f"No answer: {traj.metadata.get('error', 'a service failed')}"
    return f"No answer: the orchestration ended ({reason}) without one."


def answer_of(traj: Trajectory, request: OrchestrationRequest) -> Answer:
    """The response fields of a played episode."""
    prompt = sum(t.prompt_tokens for t in traj.turns)
    completion = sum(t.num_generated_tokens for t in traj.turns)
    failure = traj.infra_failure
    error = None
    if failure is not None:
        error = {"kind": failure.kind, "endpoint": failure.endpoint, "message": failure.message}
    elif traj.finish_reason == "error":
        error = {"kind": "engine", "endpoint": None, "message": traj.metadata.get("error")}
    final = traj.final_answer
    return Answer(
        content=final if final is not None else _no_answer(traj, request),
        finish_reason="length" if traj.finish_reason in BUDGET_STOPS else "stop",
        usage={
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "cost_usd": traj.cost_usd,
            "latency_s": traj.latency_s,
            "calls": calls_of(traj, request.tool_config),
        },
        orchestration={
            "stop_reason": traj.finish_reason,
            "turns": len(traj.turns),
            "error": error,
            "tool_cost_usd": traj.tool_cost_usd,
            "orchestrator_cost_usd": traj.orchestrator_cost_usd,
        },
    )


def _task_id(request: OrchestrationRequest, seed: int) -> str:
    """The episode's task id (simulated experts and tools seed on it): fixed by the
    seed and the question where the request gives a seed, so the same request
    repeats; random otherwise."""
    if request.seed is None:
        return f"request-{secrets.token_hex(8)}"
    digest = hashlib.sha256(f"{seed}\0{request.question}".encode()).hexdigest()
    return f"request-{digest[:16]}"


def _report_unreached_calls(traj: Trajectory, prepared: Prepared) -> None:
    """`call` steps for the episode's calls that no tool ran (one that did not parse,
    an unknown tool), so the streamed calls are `usage.calls`; sent when the episode
    ends, before the answer."""
    reported = collections.Counter(prepared.progress.reported)
    unreached = []
    for entry in calls_of(traj, prepared.request.tool_config):
        key = (entry["turn"], entry["tool"])
        if reported[key] > 0:
            reported[key] -= 1
        else:
            unreached.append(entry)
    for entry in unreached:
        prepared.progress.emit({"type": "call", **entry})


class Orchestrator:
    """A policy's engine, its tokenizer, the environment's tools and the loop's
    settings, shared by every request (see the module docstring).

    `tool_config` is the default tool configuration (its preference the default
    preference); `sampling` and `limits` the evaluation's (`builders.
    eval_sampling_params`, `builders.loop_limits`).
    """

    def __init__(
        self,
        *,
        engine: Any,
        tokenizer: Any,
        env: Any,
        tool_config: ToolConfig,
        sampling: SamplingParams,
        limits: LoopLimits,
        name: str,
        extra: Mapping[str, Any] | None = None,
    ):
        self.engine, self.tokenizer, self.env = engine, tokenizer, env
        self.sampling, self.limits, self.name = sampling, limits, name
        self.extra = dict(extra or {})
        self.defaults = Defaults(
            tool_config=tool_config,
            max_turns=limits.max_turns,
            max_new_tokens_per_turn=limits.max_new_tokens_per_turn,
        )

    def describe(self) -> dict[str, Any]:
        """`GET /v1/orchestrator`'s body, less the server's limits."""
        config = self.defaults.tool_config
        return {
            "model": self.name,
            "features": config.feature_names(),
            "tools": list(config.tools),
            "aliases": [
                {
                    "alias": a.alias,
                    "tool": a.tool,
                    "price_in": a.price_in,
                    "price_out": a.price_out,
                    "latency_s": a.latency_s,
                }
                for a in config.aliases
            ],
            "defaults": {
                "preference": dict(config.preference),
                "max_turns": self.defaults.max_turns,
                "max_cost_usd": None,
                "allowed_tools": list(config.tools),
            },
        }

    def _settings(self, request: OrchestrationRequest) -> tuple[SamplingParams, LoopLimits]:
        changes = {
            k: v
            for k, v in (("temperature", request.temperature), ("top_p", request.top_p))
            if v is not None
        }
        try:
            sampling = dataclasses.replace(self.sampling, **changes)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        limits = dataclasses.replace(
            self.limits,
            max_turns=request.max_turns,
            max_cost_usd=request.max_cost_usd,
            max_new_tokens_per_turn=request.max_new_tokens_per_turn
            or self.limits.max_new_tokens_per_turn,
            max_concurrent_episodes=None,
        )
        return sampling, limits

    def prepare(self, request: OrchestrationRequest) -> Prepared:
        """The request's episode, ready to run: its task, tools, state, sampling and
        limits. BadRequest (413) where its prompt leaves no room for a turn."""
        sampling, limits = self._settings(request)
        seed = request.seed if request.seed is not None else secrets.randbits(63)
        task = Task(id=_task_id(request, seed), question=request.question, answer="")
        config = request.tool_config
        progress = _Progress(None, config.orchestrator_price)
        tools = self.env.tools(config, task=task, seed=seed)
        spec = EpisodeSpec(
            task=task,
            tool_config=config,
            tools={name: _ReportingTool(tool, progress, config) for name, tool in tools.items()},
            seed=seed,
            state=self.env.reset(task),
        )
        prompt = limits.context.prompt(
            spec, self.tokenizer, [], enable_thinking=limits.enable_thinking
        )
        room = limits.max_context_tokens - limits.max_new_tokens_per_turn
        if len(prompt) > room:
            raise BadRequest(
                f"the prompt (system prompt, tools and question) is {len(prompt)} tokens; the "
                f"context leaves room for {room} (agent.max_context_tokens less one turn)",
                status=413,
                param="messages",
            )
        return Prepared(request, spec, sampling, limits, progress)

    async def run(
        self, prepared: Prepared, on_step: Callable[[Step], None] | None = None
    ) -> Answer:
        """Plays the prepared episode; its steps go to `on_step` as they happen."""
        prepared.progress.on_step = on_step
        engine = _ReportingEngine(self.engine, prepared.progress)
        try:
            [traj] = await run_episodes(
                [prepared.spec],
                engine,
                self.tokenizer,
                sampling=prepared.sampling,
                limits=prepared.limits,
            )
        except BaseException:
            engine.cancel()  # the request ended: its engine calls go too
            raise
        _report_unreached_calls(traj, prepared)
        return answer_of(traj, prepared.request)

    async def answer(
        self, request: OrchestrationRequest, on_step: Callable[[Step], None] | None = None
    ) -> Answer:
        """`run(prepare(request), on_step)`."""
        return await self.run(self.prepare(request), on_step)
