"""The record of one episode: exactly the tokens sampled, and what they cost.

A `Trajectory` is what GRPO consumes. Its three token arrays line up one to one:

    token_ids[i]        the i-th token of the whole conversation (prompt + turns)
    loss_mask[i]        1 if the policy sampled token i, else 0 (prompt, tool
                        results, the chat scaffolding between turns)
    rollout_logprobs[i] log p_rollout(token_ids[i] | prefix) if loss_mask[i] else 0.0

Turn k read the `turns[k].prompt_tokens` ids from `turns[k].prompt_start` on and
generated the `num_generated_tokens` that follow them: with the "history"
context every prompt starts at 0 (the sequence so far); with fresh prompts
("rebuild", agent/context.py) each turn's prompt and generated tokens follow
the previous turn's, so a trajectory is its turns' samples end to end.

Everything else (turns, calls, costs, the answer) is for rewards, metrics and the
viewer. Records round-trip through JSON lines with `write_jsonl` / `read_jsonl`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from orchestra_jax.infra_failure import InfraFailure
from orchestra_jax.io import paths

# "conversation": the other party ended it (`metadata["conversation_end"]` says why).
FINISH_REASONS = (
    "answer",
    "max_turns",
    "max_cost",
    "context",
    "no_tool_call",
    "error",
    "conversation",
)
# `Trajectory.features()` keys "first_call:tool:<name>": turns whose first valid call
# was that tool (`Turn.first_call_feature`).
FIRST_CALL_PREFIX = "first_call:"


@dataclasses.dataclass
class ToolCallRecord:
    """One `<tool_call>` block the policy wrote: parsed (`name`, `arguments`) or not (`error`)."""

    name: str | None
    arguments: dict[str, Any] | None
    raw: str = ""
    error: str | None = None
    feature: str | None = None  # "tool:<alias or tool>" for valid calls, see loop.call_feature


@dataclasses.dataclass
class ToolResultRecord:
    """What one call returned, as the policy read it (`text`), and what it cost.

    `metadata` is the tool's account of the call (model alias, backend, token
    usage, query, …; `ToolResult.metadata`), for metrics, audits and the viewer.
    `infra_failure` is set when a service behind the tool failed for good (an
    expert endpoint, the search backend): not the policy's failure
    (`orchestra_jax/infra_failure.py`).
    """

    text: str
    cost_usd: float = 0.0
    latency_s: float = 0.0
    error: str | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    infra_failure: InfraFailure | None = None


@dataclasses.dataclass
class Turn:
    """One assistant turn and the observation that followed it.

    `text` is the decoded generated tokens (stop token included), `observation`
    the masked text appended after them (tool results or an error message; empty
    when the episode ended on this turn). `generation_latency_s` is the engine's
    figure for this request; `tool_latency_s` is the slowest result of the turn,
    because the turn's calls run concurrently (under `agent.accounting="reference"`
    the sum of its calls' latencies up to its answer call, as the release counts it). `first_call_feature` is the
    feature ("tool:<alias or tool>") of the turn's first valid call: the first
    call, in the order written, that counts in `Trajectory.tool_call_counts`
    (parsed, an offered tool, a feature of the tool configuration) and ran
    without error; None when the turn has none.
    """

    text: str
    num_generated_tokens: int
    finish_reason: str  # the engine's: "stop", "length" or "abort"
    tool_calls: list[ToolCallRecord] = dataclasses.field(default_factory=list)
    tool_results: list[ToolResultRecord] = dataclasses.field(default_factory=list)
    observation: str = ""
    num_observation_tokens: int = 0
    prompt_tokens: int = 0  # context length the engine read for this turn
    # Where that context starts in the trajectory's token_ids (0: the sequence so far).
    prompt_start: int = 0
    generation_latency_s: float = 0.0
    tool_latency_s: float = 0.0
    format_valid: bool = True
    # The policy version (the learner's step) whose weights generated this turn, as
    # the engine reports it (`Completion.weight_version`); None when it does not.
    weight_version: int | None = None
    # Set when a weight update landed while the turn was generated (a partial
    # rollout): the version of its first tokens (`Completion.first_weight_version`).
    first_weight_version: int | None = None
    first_call_feature: str | None = None
    # In a conversation: the turn called no tool, so its text was a message to the
    # other party (`agent/conversation.py`).
    message_to_party: bool = False


@dataclasses.dataclass
class Trajectory:
    """One episode, token-exact. See the module docstring for the token arrays.

    `infra_failure` is set when a service the episode depended on (engine,
    expert, search, judge, user simulator, evaluator) failed for good: the
    episode is then not the policy's to answer for and is neither trained on nor
    scored (`orchestra_jax/infra_failure.py`).
    """

    task_id: str
    group_index: int
    seed: int
    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    prompt_length: int
    turns: list[Turn] = dataclasses.field(default_factory=list)
    final_answer: str | None = None
    finish_reason: str = "error"
    format_valid: bool = True
    tool_call_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    cost_usd: float = 0.0
    tool_cost_usd: float = 0.0
    orchestrator_cost_usd: float = 0.0
    latency_s: float = 0.0
    correct: bool | None = None
    reward: float | None = None
    advantage: float | None = None
    preference: dict[str, float] = dataclasses.field(default_factory=dict)
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    infra_failure: InfraFailure | None = None

    def __post_init__(self):
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n:
            raise ValueError(
                f"token_ids ({n}), loss_mask ({len(self.loss_mask)}) and rollout_logprobs "
                f"({len(self.rollout_logprobs)}) must have the same length"
            )
        if not 0 <= self.prompt_length <= n:
            raise ValueError(f"prompt_length {self.prompt_length} outside [0, {n}]")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason {self.finish_reason!r} not in {FINISH_REASONS}")

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the policy sampled (the loss-mask sum)."""
        return sum(self.loss_mask)

    @property
    def answered(self) -> bool:
        """The episode ended with an answer: an `answer` call returned one (finish
        reason "answer"), or, in a conversation, the other party ended it (finish
        reason "conversation": a stop signal or its step budget)."""
        return self.finish_reason in ("answer", "conversation")

    def loss_mask_without_invalid_turns(self) -> list[int]:
        """`loss_mask` with the sampled tokens of format-invalid turns set to 0.

        This is the reference's format filter: a malformed turn leaves the loss,
        the episode's other turns still train.
        """
        return self.loss_mask_without_turns(lambda turn: not turn.format_valid)

    def loss_mask_without_turns(self, drop: Callable[[Turn], bool]) -> list[int]:
        """`loss_mask` with the sampled tokens of every turn where `drop(turn)` set to 0.

        Turn k's sampled tokens are the next `turns[k].num_generated_tokens`
        positions of the mask (turns are sampled in order, observations and
        rebuilt prompts between them are masked).
        """
        sampled = [i for i, m in enumerate(self.loss_mask) if m]
        generated = sum(t.num_generated_tokens for t in self.turns)
        if generated != len(sampled):
            raise ValueError(
                f"trajectory {self.task_id}/{self.group_index}: turns generated "
                f"{generated} tokens but the loss mask has {len(sampled)}"
            )
        mask = list(self.loss_mask)
        start = 0
        for turn in self.turns:
            end = start + turn.num_generated_tokens
            if drop(turn):
                for i in sampled[start:end]:
                    mask[i] = 0
            start = end
        return mask

    def first_call_counts(self) -> dict[str, int]:
        """Per feature, the turns whose first valid call it was (`Turn.first_call_feature`)."""
        counts: dict[str, int] = {}
        for turn in self.turns:
            if turn.first_call_feature is not None:
                counts[turn.first_call_feature] = counts.get(turn.first_call_feature, 0) + 1
        return counts

    def features(self) -> dict[str, float]:
        """Reward features: `tool:<name>` call counts, `accuracy`, `cost`, `latency`,
        and `first_call:tool:<name>` (`first_call_counts`, tools used at least once).

        accuracy = 1.0 if correct else 0.0; cost = cost_usd (tools + orchestrator);
        latency = latency_s. Signs are raw (higher cost is a larger value); the
        reward decides how to orient them. Needs `correct` to be set.
        """
        if self.correct is None:
            raise ValueError(
                f"trajectory {self.task_id}/{self.group_index} is not graded yet "
                "(correct is None); grade it before asking for reward features"
            )
        out = {name: float(count) for name, count in self.tool_call_counts.items()}
        out["accuracy"] = 1.0 if self.correct else 0.0
        out["cost"] = float(self.cost_usd)
        out["latency"] = float(self.latency_s)
        for name, count in self.first_call_counts().items():
            out[FIRST_CALL_PREFIX + name] = float(count)
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        turns = []
        for t in data.pop("turns", []):
            t = dict(t)
            t["tool_calls"] = [ToolCallRecord(**c) for c in t.get("tool_calls", [])]
            t["tool_results"] = [_tool_result(r) for r in t.get("tool_results", [])]
            turns.append(Turn(**t))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Trajectory fields {sorted(unknown)}")
        data["infra_failure"] = _infra_failure(data.get("infra_failure"))
        return cls(turns=turns, **data)


def _infra_failure(data: dict[str, Any] | None) -> InfraFailure | None:
    return None if data is None else InfraFailure.from_dict(data)


def _tool_result(data: dict[str, Any]) -> ToolResultRecord:
    data = dict(data)
    data["infra_failure"] = _infra_failure(data.get("infra_failure"))
    return ToolResultRecord(**data)


def write_jsonl(path: str | os.PathLike, trajs: Iterable[Trajectory]) -> None:
    """Write one JSON object per trajectory; parent folders are created. `path` is
    local or a `gs://` URI (`orchestra_jax/io/paths.py`); a reader never sees half
    a file (`paths.write_text_atomic`)."""
    text = "".join(json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for t in trajs)
    paths.write_text_atomic(path, text)


def read_jsonl(path: str | os.PathLike) -> list[Trajectory]:
    """Read trajectories written by `write_jsonl`; a bad line names its number."""
    out = []
    with paths.as_path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Trajectory.from_dict(json.loads(line)))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{os.fspath(path)}:{lineno}: not a trajectory: {e}") from e
    return out
