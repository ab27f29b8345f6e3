"""The record of one episode: exactly the tokens sampled, and what they cost.

A `Trajectory` is what GRPO consumes. Its three token arrays line up one to one:

    token_ids[i]        the i-th token of the whole conversation (prompt + turns)
    loss_mask[i]        1 if the policy sampled token i, else 0 (prompt, tool
                        results, the chat scaffolding between turns)
    rollout_logprobs[i] log p_rollout(token_ids[i] | prefix) if loss_mask[i] else 0.0

Everything else (turns, calls, costs, the answer) is for rewards, metrics and the
viewer. Records round-trip through JSON lines with `write_jsonl` / `read_jsonl`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from typing import Any

from orchestra_jax.io import paths

# "conversation": the other party ended it (`metadata["conversation_end"]` says why).
FINISH_REASONS = ("answer", "max_turns", "context", "no_tool_call", "error", "conversation")


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
    """

    text: str
    cost_usd: float = 0.0
    latency_s: float = 0.0
    error: str | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Turn:
    """One assistant turn and the observation that followed it.

    `text` is the decoded generated tokens (stop token included), `observation`
    the masked text appended after them (tool results or an error message; empty
    when the episode ended on this turn). `generation_latency_s` is the engine's
    figure for this request; `tool_latency_s` is the slowest result of the turn,
    because the turn's calls run concurrently.
    """

    text: str
    num_generated_tokens: int
    finish_reason: str  # the engine's: "stop", "length" or "abort"
    tool_calls: list[ToolCallRecord] = dataclasses.field(default_factory=list)
    tool_results: list[ToolResultRecord] = dataclasses.field(default_factory=list)
    observation: str = ""
    num_observation_tokens: int = 0
    prompt_tokens: int = 0  # context length the engine read for this turn
    generation_latency_s: float = 0.0
    tool_latency_s: float = 0.0
    format_valid: bool = True
    # The policy version (the learner's step) whose weights generated this turn, as
    # the engine reports it (`Completion.weight_version`); None when it does not.
    weight_version: int | None = None
    # Set when a weight update landed while the turn was generated (a partial
    # rollout): the version of its first tokens (`Completion.first_weight_version`).
    first_weight_version: int | None = None


@dataclasses.dataclass
class Trajectory:
    """One episode, token-exact. See the module docstring for the token arrays."""

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

    def loss_mask_without_invalid_turns(self) -> list[int]:
        """`loss_mask` with the sampled tokens of format-invalid turns set to 0.

        Turn k's sampled tokens are the next `turns[k].num_generated_tokens`
        positions of the mask (turns are sampled in order, observations between
        them are masked). This is the reference's format filter: a malformed
        turn leaves the loss, the episode's other turns still train.
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
            if not turn.format_valid:
                for i in sampled[start:end]:
                    mask[i] = 0
            start = end
        return mask

    def features(self) -> dict[str, float]:
        """Reward features: `tool:<name>` call counts, `accuracy`, `cost`, `latency`.

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
            t["tool_results"] = [ToolResultRecord(**r) for r in t.get("tool_results", [])]
            turns.append(Turn(**t))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Trajectory fields {sorted(unknown)}")
        return cls(turns=turns, **data)


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
