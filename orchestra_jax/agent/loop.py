"""Multi-turn episodes over any `RolloutEngine`, token-in/token-out, many at once.

One episode:

    ids = encode(render([system, user], tools, add_generation_prompt=True))   mask 0
    for turn in range(max_turns):
        out = engine.generate(ids, stop at <|im_end|>)                          mask 1
        calls = parse_tool_calls(decode(out))
        results = run the valid calls concurrently (errors become observations)
        if a result carries a final answer: stop ("answer")
        ids += encode(tool_response_segment(results))                          mask 0

That is the "history" context (`LoopLimits.context`, agent/context.py). With a
policy of fresh prompts ("rebuild"), turn k > 0 instead reads a new prompt the
policy builds from the episode's turns so far, appended to the trajectory
(mask 0) at `Turn.prompt_start`, and no observation is appended: the
trajectory holds each turn's prompt and generated tokens end to end. In a
conversation the policy rebuilds every prompt, the first too, from the
conversation's messages so far (`ContextPolicy.prompt(..., messages=)`).

The sequence is built only by appending: what is trained is exactly what was
sampled, never a re-render of text. A re-render agrees only where Qwen3's
template is append-only (thinking on, raw assistant text, canonical non-empty
`<think>` blocks; see `chat/template.py` and `tests/test_agent_loop.py`).

Stops: `answer` ("answer"), the turn limit ("max_turns"), the cost budget
(`LoopLimits.max_cost_usd`, checked before each turn as the turn limit is: the
turn that crosses it completes, no further turn starts; "max_cost"), the context budget
or a server's context refusing the turn (a completion with finish reason
"context": the policy's stop, not a failure; "context"), a turn without a call when `stop_on_no_tool_call` ("no_tool_call"),
an engine or other-party failure ("error"), the other party ending the
conversation ("conversation", its reason in `metadata["conversation_end"]`). A
turn without a valid call otherwise gets an error observation and the episode
goes on.

Failures that are not the policy's (`orchestra_jax/infra_failure.py`) end the episode
with "error" and set `Trajectory.infra_failure`: the engine raising or
aborting a turn ("engine"; engines retry in their own clients), the other
party failing ("user_simulator"; it retries in its own client), and a tool
result that carries one (an expert endpoint or the search backend, failed after
their retries). Only a service's failure does so (`is_service_failure`: a
transport, server or timeout error); any other exception of the engine or the
party is a bug and propagates, stopping the run with its traceback. The
policy's own failures (malformed or unknown calls, bad arguments, context,
turns) never set it.

Conversations: where the episode has another party (`EpisodeSpec.other_party`,
e.g. a simulated user; `agent/conversation.py`), the prompt is the party's
opening, a turn without a `<tool_call>` is a message to the party, and the
party's answer is appended as a user turn (`user_message_segment`, mask 0);
a turn whose tool relayed a message to the party (an expert acting for the
agent) gets its tool results, then the party's answer. The sequence ends right after the last
sampled token (observations are appended only when another turn follows) and
never exceeds `max_context_tokens`; a prompt longer than that gives a turnless
"context" episode.

All episodes run as asyncio tasks; their generation requests are gathered into
engine batches by `GenerationBatcher`, so one episode's tools overlap other
episodes' generation and tools.

Accounting: tool_cost = sum of result costs; orchestrator_cost = sum over turns
of token_cost(context tokens read, tokens generated) at the config's
`orchestrator_price` (USD per million tokens, input and output alike); latency =
sum over turns of (generation latency + slowest tool of the turn), since a
turn's calls run concurrently. `LoopLimits.accounting="reference"` charges as the
release does instead, and `tool_calls="reference"` reads a QA turn's calls as it
does (`agent/reference_turns.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any, cast

from orchestra_jax.agent import tool_runner
from orchestra_jax.agent.batcher import GenerationBatcher
from orchestra_jax.agent.context import (
    ContextPolicy,
    HistoryContext,
    initial_messages,
    render_prompt,
)
from orchestra_jax.agent.conversation import (
    RELAYED_MESSAGE,
    PolicyTurn,
    add_usage,
    check_opening,
    message_text,
    party_message,
)
from orchestra_jax.agent.enum_arguments import enum_argument_constraint
from orchestra_jax.agent.episode import EpisodeSpec, derive_seed, make_group_specs, turn_seed
from orchestra_jax.agent.reference_turns import (
    ACCOUNTINGS,
    TOOL_CALL_READINGS,
    offered_models,
    reference_charges,
    reference_tool_calls,
)
from orchestra_jax.agent.trajectory import Trajectory, Turn
from orchestra_jax.chat.template import (
    generation_prompt,
    tool_response_segment,
    user_message_segment,
)
from orchestra_jax.chat.tool_calls import ToolCall, parse_tool_calls
from orchestra_jax.infra_failure import InfraFailure, endpoint_of, is_service_failure
from orchestra_jax.rollout.engine import Completion, GenerateRequest, SamplingParams
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.pricing import token_cost

__all__ = [
    "EpisodeSpec",
    "LoopLimits",
    "derive_seed",
    "make_group_specs",
    "run_episodes",
    "run_episodes_sync",
    "turn_seed",
]

IM_END = "<|im_end|>"


@dataclasses.dataclass(frozen=True)
class LoopLimits:
    """The limits and concurrency knobs of `run_episodes` (see its docstring)."""

    max_turns: int = 30
    # None: no budget. A number: no turn starts once the episode's cost (tools plus
    # the orchestrator's tokens) has reached it (finish reason "max_cost").
    max_cost_usd: float | None = None
    max_context_tokens: int = 32768
    max_new_tokens_per_turn: int = 2048
    tool_timeout_s: float = 60.0
    enable_thinking: bool = True
    stop_on_no_tool_call: bool = False
    # None: a turn's generation latency is the engine's measured wall time. A
    # number: generated tokens x this many seconds, the orchestrator's latency as
    # a model of its serving speed. Offline runs use it so that the latency
    # feature (hence the reward) does not depend on machine load, and a resumed
    # run reproduces an uninterrupted one exactly.
    seconds_per_generated_token: float | None = None
    # False: a tool that raises is charged no latency rather than its measured
    # wall time, for the same reason (`tools.charge_measured_time=False`).
    charge_tool_failure_time: bool = True
    # Episodes in flight at once (None: all). Engines that answer instantly
    # (routers) would otherwise send every episode's tool calls at once, and the
    # calls would queue for the sandbox's threads until they pass tool_timeout_s.
    max_concurrent_episodes: int | None = None
    # `GenerationBatcher`'s knobs: requests per engine call, how long the first
    # waiting request waits for others, engine calls in flight at once.
    max_batch_size: int = 256
    batch_wait_s: float = 0.005
    max_in_flight_batches: int = 64
    # How each turn's prompt is built (agent/context.py): the growing sequence
    # ("history") or a fresh prompt per turn ("rebuild", the reference's).
    context: ContextPolicy = HistoryContext()
    # How a QA turn's calls are read and charged (agent/reference_turns.py): the
    # project's ("project") or the reference release's ("reference").
    tool_calls: str = "project"
    accounting: str = "project"
    # True: a call's enum arguments (the tools' model aliases) are sampled only among
    # the values its tool allows (agent/enum_arguments.py); the JAX engine only.
    constrain_enum_arguments: bool = False

    def __post_init__(self):
        if self.tool_calls not in TOOL_CALL_READINGS:
            raise ValueError(f"tool_calls must be one of {TOOL_CALL_READINGS}")
        if self.accounting not in ACCOUNTINGS:
            raise ValueError(f"accounting must be one of {ACCOUNTINGS}")
        for name in ("max_turns", "max_context_tokens", "max_new_tokens_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_cost_usd is not None and not self.max_cost_usd > 0:
            raise ValueError(f"max_cost_usd must be > 0 or None, got {self.max_cost_usd}")
        if not self.tool_timeout_s > 0:
            raise ValueError(f"tool_timeout_s must be > 0, got {self.tool_timeout_s}")
        if self.seconds_per_generated_token is not None and self.seconds_per_generated_token < 0:
            raise ValueError("seconds_per_generated_token must be >= 0 or None")
        if self.max_concurrent_episodes is not None and self.max_concurrent_episodes < 0:
            raise ValueError(
                f"max_concurrent_episodes must be >= 0, got {self.max_concurrent_episodes}"
            )


def conversation_messages(spec: EpisodeSpec, opening: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System prompt and the other party's opening. An opening that starts with a
    system message (the conversation's instructions, e.g. a domain policy) puts it
    in place of the tool configuration's default head, before its preferences."""
    if opening and opening[0].get("role") == "system":
        system = spec.tool_config.system_prompt(head=opening[0]["content"])
        opening = opening[1:]
    else:
        system = spec.tool_config.system_prompt()
    return [{"role": "system", "content": system}, *opening]


class _Episode:
    """One episode's state; `run` drives it turn by turn."""

    def __init__(
        self,
        spec: EpisodeSpec,
        prompt_ids: list[int] | None,
        tokenizer: Any,
        limits: LoopLimits,
    ):
        self.spec, self.tokenizer, self.limits = spec, tokenizer, limits
        self.config = spec.tool_config
        self.schemas = spec.tool_schemas()
        self.constraint = (
            enum_argument_constraint(self.schemas, tokenizer)
            if limits.constrain_enum_arguments
            else None
        )
        self.party = spec.other_party
        self.party_usage: dict[str, float] = {}
        self.ctx = ToolContext(
            task=spec.task, messages=initial_messages(spec), seed=spec.seed, state=spec.state
        )
        self.traj: Trajectory = None  # type: ignore[assignment]  # set by _begin
        if prompt_ids is not None:
            self._begin(prompt_ids)

    def _begin(self, prompt_ids: list[int]) -> None:
        """The trajectory starts with the prompt (mask 0)."""
        spec, limits = self.spec, self.limits
        features = self.config.feature_names()
        self.traj = Trajectory(
            task_id=spec.task.id,
            group_index=spec.group_index,
            seed=spec.seed,
            token_ids=list(prompt_ids),
            loss_mask=[0] * len(prompt_ids),
            rollout_logprobs=[0.0] * len(prompt_ids),
            prompt_length=len(prompt_ids),
            finish_reason="max_turns",
            preference=dict(self.config.preference),
            tool_call_counts={f: 0 for f in features if f.startswith("tool:")},
            metadata={"domain": spec.task.domain, "enable_thinking": limits.enable_thinking},
        )

    def _append(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        """Extend ids, mask and logprobs together: sampled (with logprobs) or masked (None)."""
        t = self.traj
        t.token_ids.extend(int(i) for i in ids)  # engines may hand back numpy ints
        t.loss_mask.extend([0 if logprobs is None else 1] * len(ids))
        t.rollout_logprobs.extend([0.0] * len(ids) if logprobs is None else map(float, logprobs))

    def _request(
        self, turn_index: int, sampling: SamplingParams, room: int, prompt_ids: Sequence[int]
    ) -> GenerateRequest:
        stops = tuple(dict.fromkeys((*sampling.stop_token_ids, self.tokenizer.im_end_id)))
        return GenerateRequest(
            input_ids=list(prompt_ids),
            sampling=dataclasses.replace(
                sampling,
                max_new_tokens=min(self.limits.max_new_tokens_per_turn, room),
                stop_token_ids=stops,
                seed=turn_seed(self.spec.seed, turn_index),
            ),
            request_id=f"{self.spec.task.id}/{self.spec.group_index}/{turn_index}",
            affinity_key=f"{self.spec.task.id}/{self.spec.group_index}/{self.spec.seed}",
            constraint=self.constraint,
        )

    def _record_generation(self, completion: Completion, prompt_start: int) -> Turn:
        prompt_tokens = len(self.traj.token_ids) - prompt_start
        n = len(completion.output_ids)
        self._append(completion.output_ids, completion.logprobs)
        per_token = self.limits.seconds_per_generated_token
        latency = float(completion.latency_s) if per_token is None else n * per_token
        turn = Turn(
            text=self.tokenizer.decode(completion.output_ids),
            num_generated_tokens=n,
            finish_reason=completion.finish_reason or "abort",  # None is refused in run()
            prompt_tokens=prompt_tokens,
            prompt_start=prompt_start,
            generation_latency_s=latency,
            weight_version=completion.weight_version,
            first_weight_version=completion.first_weight_version,
        )
        self.traj.turns.append(turn)
        price = self.config.orchestrator_price
        self.traj.orchestrator_cost_usd += token_cost(prompt_tokens, n, price, price)
        if self.limits.accounting == "project":  # the reference's latency is its tools'
            self.traj.latency_s += turn.generation_latency_s
        return turn

    async def _act(self, turn: Turn, closed: bool) -> str | None:
        """Parse the turn's calls, run them, account for them; returns the final answer."""
        content = turn.text[: -len(IM_END)] if closed and turn.text.endswith(IM_END) else turn.text
        self.ctx.messages.append({"role": "assistant", "content": content})
        if self.limits.tool_calls == "reference" and self.party is None:
            offered = offered_models(list(self.spec.tools), self.spec.tool_config)
            calls: list[Any] = reference_tool_calls(turn.text, offered)
        else:
            calls = parse_tool_calls(turn.text, tools=self.schemas)
        turn.tool_calls = [tool_runner.record_call(c, self.traj.tool_call_counts) for c in calls]
        turn.tool_results, final_answer = await tool_runner.run_calls(
            calls,
            self.spec.tools,
            self.ctx,
            timeout_s=self.limits.tool_timeout_s,
            charge_failure_time=self.limits.charge_tool_failure_time,
        )
        # Valid format: at least one call (or, in a conversation, none: a message
        # to the other party), each parsed and naming an offered tool.
        turn.format_valid = (bool(calls) or self.party is not None) and all(
            isinstance(c, ToolCall) and c.name in self.spec.tools for c in calls
        )
        self.traj.format_valid &= turn.format_valid
        for call, result in zip(turn.tool_calls, turn.tool_results):
            if call.feature in self.traj.tool_call_counts and call.name in self.spec.tools:
                self.traj.tool_call_counts[call.feature] += 1
                if turn.first_call_feature is None and result.error is None:
                    turn.first_call_feature = call.feature
        if self.limits.accounting == "reference":
            cost, turn.tool_latency_s = reference_charges(turn.tool_calls, turn.tool_results)
        else:
            cost = sum(r.cost_usd for r in turn.tool_results)
            turn.tool_latency_s = max((r.latency_s for r in turn.tool_results), default=0.0)
        self.traj.tool_cost_usd += cost
        self.traj.latency_s += turn.tool_latency_s
        return final_answer

    def _observation(self, turn: Turn, said: str | None) -> tuple[str, list[dict[str, Any]]]:
        """The turn's observation: its segment of text and its chat messages. The
        tool results (when the turn called tools), then the other party's message
        `said` (when it spoke)."""
        thinking = self.limits.enable_thinking
        if said is not None and not turn.tool_calls:
            return user_message_segment(said, enable_thinking=thinking), [
                {"role": "user", "content": said}
            ]
        texts = [r.text for r in turn.tool_results] or [tool_runner.NO_TOOL_CALL_MESSAGE]
        segment = tool_response_segment(texts, enable_thinking=thinking)
        messages: list[dict[str, Any]] = [{"role": "tool", "content": text} for text in texts]
        if said is not None:  # a tool relayed a message: the party's answer follows
            segment = segment.removesuffix(generation_prompt(enable_thinking=thinking))
            segment += user_message_segment(said, enable_thinking=thinking).removeprefix("\n")
            messages.append({"role": "user", "content": said})
        return segment, messages

    def _observe(self, turn: Turn, closed: bool, said: str | None = None) -> bool:
        """Append the turn's observation (masked, `_observation`); False when it would
        leave no room to answer."""
        segment, messages = self._observation(turn, said)
        # A turn cut by the token budget has no <|im_end|>: close it (masked, not sampled).
        prefix = "" if closed else IM_END
        ids = ([] if closed else [self.tokenizer.im_end_id]) + self.tokenizer.encode(segment)
        if len(self.traj.token_ids) + len(ids) >= self.limits.max_context_tokens:
            return False
        self._append(ids, None)
        turn.observation, turn.num_observation_tokens = prefix + segment, len(ids)
        self.ctx.messages.extend(messages)
        return True

    async def _open(self) -> bool:
        """Starts a conversation: the other party's opening becomes the prompt.
        False when the conversation ended, or the party failed, before the first turn."""
        try:
            reply = await self.party.open(self.spec.state)
        except Exception as e:
            if not is_service_failure(e):
                raise  # a bug, not a service's failure: the run stops with its traceback
            self._begin(self._prompt(conversation_messages(self.spec, [])))
            self._fail("user_simulator", self.party, f"other party failed to open: {_text(e)}")
            return False
        check_opening(reply)
        add_usage(self.party_usage, reply)
        self.ctx.messages = conversation_messages(self.spec, list(reply.messages))
        context = self.limits.context
        if context.fresh_prompts:  # the policy builds every turn's prompt, the first too
            self._begin(
                context.prompt(
                    self.spec,
                    self.tokenizer,
                    [],
                    enable_thinking=self.limits.enable_thinking,
                    messages=self.ctx.messages,
                )
            )
        else:
            self._begin(self._prompt(self.ctx.messages))
        if reply.end is not None:
            self._end_conversation(reply.end)
            return False
        return True

    def _prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        return render_prompt(
            self.spec,
            self.tokenizer,
            enable_thinking=self.limits.enable_thinking,
            messages=messages,
        )

    async def _converse(self, turn: Turn) -> tuple[bool, str | None]:
        """Tells the other party about the turn; returns (conversation over, its message)."""
        relayed = next(
            (
                r.metadata[RELAYED_MESSAGE]
                for r in turn.tool_results
                if isinstance((r.metadata or {}).get(RELAYED_MESSAGE), str)
            ),
            None,
        )
        turn.message_to_party = not turn.tool_calls
        said_to_party = PolicyTurn(message_text(turn.text), turn.tool_calls, relayed)
        try:
            reply = await self.party.respond(self.spec.state, said_to_party)
        except Exception as e:
            if not is_service_failure(e):
                raise  # a bug, not a service's failure: the run stops with its traceback
            self._fail("user_simulator", self.party, f"other party failed: {_text(e)}")
            return True, None
        said = party_message(reply)  # a party breaking the protocol is a bug: it raises
        if reply.end is None and said_to_party.is_message and said is None:
            raise ValueError("the other party did not answer a message")
        if said is not None and not said_to_party.is_message:
            raise ValueError("the other party spoke after a turn of tool calls")
        add_usage(self.party_usage, reply)
        if reply.end is not None:
            self._end_conversation(reply.end)
            return True, None
        return False, said

    def _end_conversation(self, reason: str) -> None:
        self._finish("conversation")
        self.traj.metadata["conversation_end"] = reason

    def _finish(self, reason: str, error: str | None = None) -> None:
        self.traj.finish_reason = reason
        if error is not None:
            self.traj.metadata["error"] = error

    def _fail(self, kind: str, part: Any, message: str) -> None:
        """Ends the episode on a failure of the service `part` (not the policy's)."""
        self._fail_with(InfraFailure(kind=kind, endpoint=endpoint_of(part), message=message))

    def _fail_with(self, failure: InfraFailure) -> None:
        self._finish("error", failure.message)
        self.traj.infra_failure = failure

    async def run(self, batcher: GenerationBatcher, sampling: SamplingParams) -> Trajectory:
        start = time.perf_counter()
        if self.party is not None and not await self._open():
            return self._done(start)
        context = self.limits.context
        budget = self.limits.max_cost_usd
        for turn_index in range(self.limits.max_turns):
            if budget is not None and self._cost() >= budget:
                self._finish("max_cost")
                break
            start = 0  # where this turn's prompt starts in the trajectory
            if turn_index and context.fresh_prompts:
                ids = context.prompt(
                    self.spec,
                    self.tokenizer,
                    self.traj.turns,
                    enable_thinking=self.limits.enable_thinking,
                    **({} if self.party is None else {"messages": self.ctx.messages}),
                )
                if len(ids) >= self.limits.max_context_tokens:
                    self._finish("context")
                    break
                start = len(self.traj.token_ids)
                self._append(ids, None)
            room = self.limits.max_context_tokens - (len(self.traj.token_ids) - start)
            if room < 1:
                self._finish("context")
                break
            request = self._request(turn_index, sampling, room, self.traj.token_ids[start:])
            try:
                completion = await batcher.generate(request)
            except Exception as e:
                if not is_service_failure(e):
                    raise  # a bug, not a service's failure: the run stops with its traceback
                self._fail("engine", batcher.engine, _text(e))  # this episode's, not the run's
                break
            malformed = _malformed(completion, request)
            if malformed is not None:  # the engine's answer breaks the contract: its fault
                self._fail("engine", batcher.engine, malformed)
                break
            if completion.finish_reason == "context":  # the server's context is full:
                self._finish("context")  # the policy's context stop, as the budget's
                break
            turn = self._record_generation(completion, start)
            if completion.finish_reason == "abort":
                self._fail("engine", batcher.engine, f"engine aborted turn {turn_index}")
                break
            closed = list(completion.output_ids[-1:]) == [self.tokenizer.im_end_id]
            final_answer = await self._act(turn, closed)
            failure = next((r.infra_failure for r in turn.tool_results if r.infra_failure), None)
            if failure is not None:  # a service behind a tool failed for good
                self._fail_with(failure)
                break
            if final_answer is not None:
                self.traj.final_answer = final_answer
                self._finish("answer")
                break
            said = None
            if self.party is not None:
                over, said = await self._converse(turn)
                if over:
                    break
            elif not turn.tool_calls and self.limits.stop_on_no_tool_call:
                self._finish("no_tool_call")
                break
            if turn_index + 1 == self.limits.max_turns:
                break  # "max_turns": no observation, nothing would read it
            if context.fresh_prompts:  # the next turn's prompt is rebuilt from this one's
                if self.party is not None:  # results (a conversation: from its messages)
                    self.ctx.messages.extend(self._observation(turn, said)[1])
                continue
            if not self._observe(turn, closed, said):
                self._finish("context")
                break
        return self._done(start)

    def _cost(self) -> float:
        return self.traj.tool_cost_usd + self.traj.orchestrator_cost_usd

    def _done(self, start: float) -> Trajectory:
        self.traj.cost_usd = self._cost()
        self.traj.metadata["wall_s"] = time.perf_counter() - start
        if self.party_usage:  # the party's spending, apart from the policy's
            self.traj.metadata["other_party"] = dict(self.party_usage)
        return self.traj


def _text(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _malformed(completion: Completion, request: GenerateRequest) -> str | None:
    """What is wrong with an engine's completion of `request`, or None."""
    if completion.finish_reason is None:  # a stream's partial completion
        return "engine returned an unfinished completion"
    if len(completion.output_ids) > request.sampling.max_new_tokens:
        return (
            f"engine returned {len(completion.output_ids)} tokens, "
            f"over max_new_tokens={request.sampling.max_new_tokens}"
        )
    return None


async def run_episodes(
    specs: Sequence[EpisodeSpec],
    engine: Any,
    tokenizer: Any,
    *,
    sampling: SamplingParams,
    limits: LoopLimits = LoopLimits(),
) -> list[Trajectory]:
    """Run the episodes concurrently; trajectories come back in `specs` order.

    `sampling` gives temperature/top-p/top-k; per turn the loop sets
    max_new_tokens = min(limits.max_new_tokens_per_turn, room left in
    limits.max_context_tokens), adds `<|im_end|>` to the stop ids and sets
    seed = turn_seed(spec.seed, turn). A tool call gets `limits.tool_timeout_s`
    seconds.

    `limits.max_concurrent_episodes` (None or 0: all at once) runs at most that
    many episodes at a time, each slot starting the next episode when its own
    ends, so that episodes do not depend on the machine's load (see `LoopLimits`).
    """
    batcher = GenerationBatcher(
        engine,
        max_batch_size=limits.max_batch_size,
        max_wait_s=limits.batch_wait_s,
        max_in_flight=limits.max_in_flight_batches,
    )
    context = limits.context
    prompts: dict[tuple[int, str], list[int]] = {}  # turn 0's, once per (config, task)
    episodes = []
    for spec in specs:
        if spec.other_party is not None:  # the prompt is the party's opening
            episodes.append(_Episode(spec, None, tokenizer, limits))
            continue
        key = (id(spec.tool_config), spec.task.id)
        if key not in prompts:
            prompts[key] = context.prompt(
                spec, tokenizer, [], enable_thinking=limits.enable_thinking
            )
        episodes.append(_Episode(spec, prompts[key], tokenizer, limits))
    num_slots = min(limits.max_concurrent_episodes or len(episodes), len(episodes))
    results: list[Trajectory | None] = [None] * len(episodes)
    queue = iter(enumerate(episodes))  # shared by the slots: each takes the next episode

    async def slot() -> None:
        # The batcher counts slots as live episodes: a slot stays live while it
        # has episodes to run, so the batcher never waits for one not started.
        try:
            for index, episode in queue:
                results[index] = await episode.run(batcher, sampling)
        finally:
            batcher.episode_finished()

    for _ in range(num_slots):
        batcher.episode_started()  # all live before any runs: the first batch waits for all
    await asyncio.gather(*(slot() for _ in range(num_slots)))
    return cast(list[Trajectory], results)  # every slot ran until the queue was empty


def run_episodes_sync(*args, **kwargs) -> list[Trajectory]:
    """`run_episodes` from synchronous code (starts and closes an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_episodes(*args, **kwargs))
    raise RuntimeError(
        "run_episodes_sync called inside a running event loop; await run_episodes(...) instead"
    )
