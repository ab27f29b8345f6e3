"""Several environments in one run: each task is played by the environment it names.

`RoutedEnvironment(members)` holds environments by name (their `env.name`s).
A task names its environment in `metadata["env"]` (the τ² reader writes
"tau2"); a task that names none goes to the first member, the default. So
one GRPO run can mix, say, QA tasks and τ² conversations:

    env.name = "routed"
    env.members = "synthetic,tau2"          # the default first
    data.sources = "synthetic:1,tau2:1"

Every per-task question (tools, state, other party, grading, the tool
configuration a task is sampled) goes to the task's member. Held-out tool
configurations (`eval_tool_configs`, which names no task) are the default
member's: evaluate another member's tasks with `env.name` set to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestra_jax.agent.conversation import OtherParty
from orchestra_jax.envs.environment import ENVIRONMENTS, Environment
from orchestra_jax.envs.inputs import EnvInputs
from orchestra_jax.rewards.judge import Judge, JudgeVerdict
from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import Tool
from orchestra_jax.tools.config import ToolConfig
from orchestra_jax.tools.config_sampler import SamplerRanges, ToolConfigSampler

ROUTE_FIELD = "env"  # the task metadata key naming a task's environment


class RoutedSampler:
    """Samples each task's tool configuration with its environment's sampler."""

    def __init__(self, samplers: Mapping[str, ToolConfigSampler], route):
        self.samplers, self.route = dict(samplers), route

    def sample(self, task: Task, rng_or_seed: Any = None) -> ToolConfig:
        return self.samplers[self.route(task)].sample(task, rng_or_seed)


class RoutedEnvironment:
    """The `Environment` of a mixture (see the module docstring)."""

    def __init__(self, members: Mapping[str, Environment]):
        if not members:
            raise ValueError("a routed environment needs at least one member")
        self.members = dict(members)
        self.default = next(iter(self.members))

    def route(self, task: Task) -> str:
        """The name of the member that plays `task` (ValueError for an unknown one)."""
        name = task.metadata.get(ROUTE_FIELD) or self.default
        if name not in self.members:
            raise ValueError(
                f"task {task.id!r} names environment {name!r}, which is not among "
                f"env.members {list(self.members)}"
            )
        return name

    def member(self, task: Task) -> Environment:
        return self.members[self.route(task)]

    def tasks(self, split: str, n: int) -> list[Task]:
        return self.members[self.default].tasks(split, n)

    def tool_config_sampler(
        self, seed: int = 0, ranges: SamplerRanges | None = None, **fields: Any
    ) -> RoutedSampler:
        samplers = {
            name: env.tool_config_sampler(seed=seed, ranges=ranges, **fields)
            for name, env in self.members.items()
        }
        return RoutedSampler(samplers, self.route)

    def eval_tool_configs(
        self, ranges: SamplerRanges | None = None, **fields: Any
    ) -> dict[str, ToolConfig]:
        return self.members[self.default].eval_tool_configs(ranges=ranges, **fields)

    def tools(
        self,
        tool_config: ToolConfig,
        *,
        task: Task | None = None,
        seed: int = 0,
        sleep_scale: float = 0.0,
    ) -> dict[str, Tool]:
        if task is None:
            raise ValueError("a routed environment picks the tools by task: pass task=")
        return self.member(task).tools(tool_config, task=task, seed=seed, sleep_scale=sleep_scale)

    def reset(self, task: Task) -> Any:
        return self.member(task).reset(task)

    def other_party(self, task: Task) -> OtherParty | None:
        return self.member(task).other_party(task)

    async def grade(
        self,
        task: Task,
        final_answer: str | None,
        *,
        judge: Judge | None = None,
        state: Any = None,
    ) -> JudgeVerdict:
        return await self.member(task).grade(task, final_answer, judge=judge, state=state)


def from_config(inputs: EnvInputs) -> RoutedEnvironment:
    """Each of `env.members` built from the same inputs."""
    names = inputs.env.member_names()
    if not names:
        raise ValueError("env.name='routed' needs env.members (e.g. 'synthetic,tau2')")
    if "routed" in names or len(set(names)) != len(names):
        raise ValueError(f"env.members must be distinct environments, got {names}")
    return RoutedEnvironment({name: ENVIRONMENTS.get(name)(inputs) for name in names})
