"""One step's experience: episodes for a batch of tasks, graded, rewarded, advantaged.

    tasks ─▶ ToolConfig per task ─▶ G episodes per task (agent loop, concurrent)
          ─▶ the environment grades each final answer ─▶ group reward
          ─▶ group advantages (+ boost) ─▶ filters (reward std, format, no valid
             answer in the group, episodes without an answer)
          ─▶ kept trajectories

Episodes are ordered task by task (G consecutive per task), the layout every
group function of `rl/grpo.py` and `rewards/registry.py` expects.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orchestra_jax.agent.loop import LoopLimits, make_group_specs, run_episodes
from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.envs.environment import Environment
from orchestra_jax.infra_failure import InfraError
from orchestra_jax.rewards.judge import Judge
from orchestra_jax.rewards.outcome import is_valid_answer
from orchestra_jax.rewards.registry import group_rewards
from orchestra_jax.rl import grpo
from orchestra_jax.rl.grpo import FORMAT_FILTERS
from orchestra_jax.rollout.engine import RolloutEngine, SamplingParams
from orchestra_jax.tasks import Task
from orchestra_jax.tools.config import ToolConfig
from orchestra_jax.training import infra_failures


@dataclasses.dataclass
class StepExperience:
    """Graded episodes of one step and what GRPO makes of them."""

    trajectories: list[Trajectory]
    rewards: np.ndarray  # [N], per episode
    advantages: np.ndarray  # [N], 0 where not kept
    keep: np.ndarray  # [N] bool: the episode is trained on
    metrics: dict[str, float]
    # Per episode, the loss mask to train with when it differs from the recorded
    # one (format_filter="turn" masks malformed turns); None: the recorded mask.
    train_masks: list[list[int] | None] | None = None

    @property
    def kept(self) -> list[Trajectory]:
        """The kept episodes as the learner sees them (with their training masks)."""
        masks = self.train_masks or [None] * len(self.trajectories)
        return [
            t if m is None else dataclasses.replace(t, loss_mask=m)
            for t, k, m in zip(self.trajectories, self.keep, masks)
            if k
        ]


async def grade_all(
    trajectories: Sequence[Trajectory],
    tasks: Mapping[str, Task],
    env: Environment,
    *,
    judge: Judge | None = None,
    states: Sequence[Any] | None = None,
) -> None:
    """Sets `correct` on every trajectory: `env.grade` (concurrently, for LLM judges),
    given each episode's state (`states[i]` for trajectory i) where there is one.
    A grader's report (`JudgeVerdict.info`) goes to `metadata["grade"]`.

    An episode that already failed by infrastructure is not graded, and one whose
    grader fails so (an `InfraError`: the judge, τ²'s evaluator, after their
    retries) is marked (`Trajectory.infra_failure`); both get correct = False,
    which nothing scores (`score_groups`, evaluation summaries)."""
    states = [None] * len(trajectories) if states is None else states

    async def grade(traj: Trajectory, state: Any) -> None:
        if traj.infra_failure is None:
            try:
                verdict = await env.grade(
                    tasks[traj.task_id], traj.final_answer, judge=judge, state=state
                )
            except InfraError as e:
                traj.infra_failure = e.failure
            else:
                traj.correct = bool(verdict.correct)
                if verdict.info is not None:
                    traj.metadata["grade"] = verdict.info
                return
        traj.correct = False

    await asyncio.gather(*(grade(t, state) for t, state in zip(trajectories, states)))


@dataclasses.dataclass(frozen=True)
class Episodes:
    """How to play a batch of tasks: G episodes each, on which engine and tools.

    `engine` may be left out of a template (an evaluator's) and set per use.
    `tools_seed` seeds the environment's tools (simulated experts' draws) and
    `sleep_scale` makes simulated tools really wait (`Environment.tools`).
    """

    env: Environment
    tokenizer: Any
    sampling: SamplingParams
    limits: LoopLimits
    engine: RolloutEngine | None = None
    group_size: int = 1
    tools_seed: int = 0
    sleep_scale: float = 0.0
    judge: Judge | None = None


async def run_graded_episodes(
    tasks: Sequence[Task],
    tool_configs: Sequence[ToolConfig],
    how: Episodes,
    *,
    seed: int,
    task_indices: Sequence[int] | None = None,
) -> list[Trajectory]:
    """`how.group_size` episodes per task with its ToolConfig and tools, then graded.

    Episode (i, g) has seed derive_seed(seed, task_indices[i], g) (task_indices:
    the tasks' places in the step, default 0, 1, …), its own state
    `env.reset(task)` and, in environments with a conversation partner, its
    own `env.other_party(task)`; it is graded from its final answer and its
    state.
    """
    env = how.env
    if how.engine is None:
        raise ValueError("Episodes.engine is not set: which policy plays the episodes?")
    tools = [
        env.tools(config, task=task, seed=how.tools_seed, sleep_scale=how.sleep_scale)
        for task, config in zip(tasks, tool_configs)
    ]
    specs = make_group_specs(
        tasks,
        tool_configs,
        how.group_size,
        seed,
        tools=tools,
        reset=env.reset,
        other_party=env.other_party,
        task_indices=task_indices,
    )
    trajectories = await run_episodes(
        specs, how.engine, how.tokenizer, sampling=how.sampling, limits=how.limits
    )
    await grade_all(
        trajectories,
        {t.id: t for t in tasks},
        env,
        judge=how.judge,
        states=[spec.state for spec in specs],
    )
    return trajectories


def score_groups(
    trajectories: Sequence[Trajectory],
    *,
    group_size: int,
    reward_fn,
    adv_clip: float | None,
    filter_reward_std: float,
    format_filter: str = "turn",
    format_penalty: float = grpo.DEFAULT_FORMAT_PENALTY,
    filter_no_answer: bool = False,
    advantage: str = "grpo",
    advantage_boost: float = 0.0,
    drop_no_answer: bool = False,
    train_message_turns: bool = True,
    min_group_size_after_infra: int = 2,
) -> StepExperience:
    """Rewards, advantages and filters for graded trajectories (group by group).

    Advantages: the registered estimator `advantage` ("grpo" divides by the
    group's reward std, "dr_grpo" only centres), clipped to ±`adv_clip`, then
    raised by `advantage_boost` where at least 1 (`grpo.boost_advantages`).
    Kept episodes: groups whose reward std exceeds `filter_reward_std` (a group
    where every episode scores the same teaches nothing); with
    `filter_no_answer`, minus groups where no episode gave a valid answer; with
    `drop_no_answer`, minus every episode that did not answer
    (`Trajectory.answered`), its group's rewards and advantages unchanged.
    Malformed tool calls (`format_filter`): "turn" (the reference) trains on an
    episode's well-formed turns only, "episode" drops every episode with a
    malformed turn, "off" trains on everything, "penalty" trains on everything
    with the reward of a malformed episode replaced by `format_penalty`.
    `train_message_turns` False leaves a conversation's message turns (turns
    that called no tool and spoke to the other party, `Turn.message_to_party`)
    out of the loss: their sampled tokens get training mask 0.

    Episodes that failed by infrastructure (`Trajectory.infra_failure`) are not
    scored: every statistic of their group (reward normalisation, mean, std,
    filters) is that of the group's other episodes, as if they had not been
    played; a group left with fewer than `min_group_size_after_infra` episodes
    is dropped. They get reward and advantage None and are never kept.
    """
    if format_filter not in FORMAT_FILTERS:
        raise ValueError(f"format_filter must be one of {FORMAT_FILTERS}, got {format_filter!r}")
    n = len(trajectories)
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} trajectories do not split into groups of {group_size}")
    failed = [t.infra_failure is not None for t in trajectories]
    # Groups by how many of their episodes remain: groups of one size are scored together.
    by_size: dict[int, list[int]] = collections.defaultdict(list)
    dropped_groups = 0
    for start in range(0, n, group_size):
        rest = [i for i in range(start, start + group_size) if not failed[i]]
        by_size[len(rest)].extend(rest)
        dropped_groups += len(rest) < min_group_size_after_infra
    rewards = np.zeros(n, np.float32)
    advantages = np.zeros(n, np.float32)
    keep = np.zeros(n, bool)
    for size, places in sorted(by_size.items()):
        if size == 0:
            continue
        group = [trajectories[i] for i in places]
        rewards[places] = group_rewards(group, size, reward_fn)
        if format_filter == "penalty":
            rewards[places] = grpo.format_penalty_rewards(
                rewards[places], [t.format_valid for t in group], format_penalty
            )
        if size < min_group_size_after_infra:
            continue
        advantages[places], keep[places] = _advantages_and_keep(
            group,
            rewards[places],
            size,
            adv_clip=adv_clip,
            filter_reward_std=filter_reward_std,
            format_filter=format_filter,
            filter_no_answer=filter_no_answer,
            advantage=advantage,
            advantage_boost=advantage_boost,
            drop_no_answer=drop_no_answer,
        )
    train_masks = training_masks(
        trajectories,
        drop_invalid=format_filter == "turn",
        drop_messages=not train_message_turns,
    )
    advantages = np.where(keep, advantages, 0.0).astype(np.float32)
    for traj, r, a, f in zip(trajectories, rewards, advantages, failed):
        traj.reward, traj.advantage = (None, None) if f else (float(r), float(a))
    scored = [i for i in range(n) if not failed[i]]
    metrics = (
        episode_metrics([trajectories[i] for i in scored], rewards[scored], keep[scored])
        if scored
        else {}
    )
    metrics["kept_fraction"] = float(np.mean(keep)) if n else 0.0
    metrics.update(infra_failures.metrics(trajectories))
    metrics["rollout/infra_groups_dropped"] = float(dropped_groups)
    return StepExperience(list(trajectories), rewards, advantages, keep, metrics, train_masks)


def _advantages_and_keep(
    trajectories: Sequence[Trajectory],
    rewards: np.ndarray,
    group_size: int,
    *,
    adv_clip: float | None,
    filter_reward_std: float,
    format_filter: str,
    filter_no_answer: bool,
    advantage: str,
    advantage_boost: float,
    drop_no_answer: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """`score_groups`' advantages and kept episodes of groups of `group_size` episodes."""
    advantages = grpo.ADVANTAGES.get(advantage)(rewards, group_size, clip=adv_clip or None)
    advantages = np.asarray(grpo.boost_advantages(advantages, advantage_boost), np.float32)
    # np.array (a writable copy): the filters return read-only JAX buffers.
    keep = np.array(
        grpo.reward_std_filter(rewards, group_size, threshold=filter_reward_std), dtype=bool
    )
    if format_filter == "episode":
        keep &= np.asarray(grpo.format_filter([t.format_valid for t in trajectories]), bool)
    if filter_no_answer:
        keep &= np.asarray(
            grpo.answer_filter([is_valid_answer(t.final_answer) for t in trajectories], group_size),
            bool,
        )
    if drop_no_answer:
        keep &= np.asarray(grpo.answered_filter([t.answered for t in trajectories]), bool)
    return advantages, keep


def training_masks(
    trajectories: Sequence[Trajectory], *, drop_invalid: bool, drop_messages: bool
) -> list[list[int] | None] | None:
    """Per episode, the loss mask to train with where it differs from the recorded
    one: format-invalid turns (`drop_invalid`) and message turns (`drop_messages`)
    masked; None where no turn is dropped (None for all: none anywhere)."""

    def dropped(turn) -> bool:
        return (drop_invalid and not turn.format_valid) or (drop_messages and turn.message_to_party)

    masks = [
        t.loss_mask_without_turns(dropped) if any(dropped(u) for u in t.turns) else None
        for t in trajectories
    ]
    return masks if any(m is not None for m in masks) else None


def episode_metrics(
    trajectories: Sequence[Trajectory], rewards: np.ndarray, keep: np.ndarray
) -> dict[str, float]:
    """Per-step means the metrics writer logs (reward, accuracy, cost, tool mix, …)."""
    n = len(trajectories)
    correct = np.array([bool(t.correct) for t in trajectories], np.float64)
    calls: collections.Counter = collections.Counter()
    for t in trajectories:
        calls.update({k.removeprefix("tool:"): v for k, v in t.tool_call_counts.items()})
    total_calls = max(1, sum(calls.values()))
    gen = np.array([t.num_generated_tokens for t in trajectories], np.float64)
    results = [r for t in trajectories for turn in t.turns for r in turn.tool_results]
    out = {
        "reward": float(np.mean(rewards)),
        "accuracy": float(correct.mean()),
        "cost_usd": float(np.mean([t.cost_usd for t in trajectories])),
        "latency_s": float(np.mean([t.latency_s for t in trajectories])),
        "format_valid": float(np.mean([t.format_valid for t in trajectories])),
        "turn_format_valid": float(
            np.mean([turn.format_valid for t in trajectories for turn in t.turns] or [1.0])
        ),
        "answered": float(np.mean([is_valid_answer(t.final_answer) for t in trajectories])),
        "turns": float(np.mean([len(t.turns) for t in trajectories])),
        "tool_calls": sum(calls.values()) / n,
        "generated_tokens": float(gen.mean()),
        "sequence_tokens": float(np.mean([len(t.token_ids) for t in trajectories])),
        "kept_fraction": float(np.mean(keep)),
        # Failed tool calls per episode; expert_errors: endpoints that failed after retries.
        "tool_errors": sum(r.error is not None for r in results) / n,
        "expert_errors": sum(bool(r.metadata.get("expert_failed")) for r in results) / n,
    }
    for name, count in sorted(calls.items()):
        out[f"tool_mix/{name}"] = count / total_calls
    by_domain: dict[str, list[float]] = collections.defaultdict(list)
    for t, c in zip(trajectories, correct):
        by_domain[t.metadata.get("domain", "all")].append(c)
    for domain, values in sorted(by_domain.items()):
        out[f"accuracy/{domain}"] = float(np.mean(values))
    return out


class Timer:
    """Accumulates wall time per named phase: `with timer("rollout"): ...`."""

    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)

    def __call__(self, name: str):
        timer = self

        class _Phase:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                timer.seconds[name] += time.perf_counter() - self.start

        return _Phase()

    def pop(self) -> dict[str, float]:
        out = {f"time/{k}_s": v for k, v in self.seconds.items()}
        self.seconds.clear()
        return out
