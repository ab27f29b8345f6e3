"""The `Environment` protocol: a world of tasks an orchestrator is trained and tested in.

An environment gives everything about a task that is not the policy:

    tasks(split, n)               the tasks of a split ("train", "heldout", …)
    tool_config_sampler(...)      per-task tools, aliases, prices, preferences (training)
    eval_tool_configs(...)        held-out tool configurations (evaluation)
    tools(tool_config, task=…, seed=…)
                                  the tools an episode of `task` offers: {name:
                                  Tool}, each with its schema and the backend that
                                  runs it (those beyond the configuration's, e.g. a
                                  τ² domain's, are shown with their own schemas)
    reset(task)                   fresh per-episode state (e.g. a database the
                                  tools change); None for stateless worlds. Each
                                  episode's tools find it in `ToolContext.state`
    other_party(task)             the other side of the conversation (a simulated
                                  user, an `agent.conversation.OtherParty`), or
                                  None where the orchestrator only talks to tools
                                  (QA, the synthetic world)
    grade(task, answer, judge=…, state=…)
                                  is the episode right: its final answer, or (with
                                  `state`, the episode's state after it ran) what
                                  happened, e.g. a conversation's message history

`ENVIRONMENTS` maps `env.name` to a factory `(EnvInputs) -> Environment`
(`envs/inputs.py`: the typed sections an environment reads, not the whole
config); `training/builders.build_env` goes through it, and `env.name` may also be
"package.module:factory" for an environment in one's own module. Registered:
"synthetic" (the offline world, `envs/synthetic.py`), "qa" (question answering
on benchmark files with live experts, search and judge, `envs/qa.py`), "tau2" (τ²-bench
conversations, `envs/tau2/env.py`, needs the `tau2` extra) and "routed"
(several environments in one run, each task played by the one it names,
`envs/routing.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from orchestra_jax.agent.conversation import OtherParty
from orchestra_jax.registry import Registry
from orchestra_jax.rewards.judge import Judge, JudgeVerdict
from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import Tool
from orchestra_jax.tools.config import ToolConfig
from orchestra_jax.tools.config_sampler import SamplerRanges, ToolConfigSampler


@runtime_checkable
class Environment(Protocol):
    """What a run asks of a task world (see the module docstring)."""

    def tasks(self, split: str, n: int) -> list[Task]: ...

    def tool_config_sampler(
        self, seed: int = 0, ranges: SamplerRanges | None = None, **fields: Any
    ) -> ToolConfigSampler: ...

    def eval_tool_configs(
        self, ranges: SamplerRanges | None = None, **fields: Any
    ) -> dict[str, ToolConfig]: ...

    def tools(
        self,
        tool_config: ToolConfig,
        *,
        task: Task | None = None,
        seed: int = 0,
        sleep_scale: float = 0.0,
    ) -> dict[str, Tool]: ...

    def reset(self, task: Task) -> Any: ...

    def other_party(self, task: Task) -> OtherParty | None: ...

    async def grade(
        self,
        task: Task,
        final_answer: str | None,
        *,
        judge: Judge | None = None,
        state: Any = None,
    ) -> JudgeVerdict: ...


# `(envs/inputs.EnvInputs) -> Environment` (Any here: inputs.py imports this module).
EnvironmentFactory = Callable[[Any], Environment]

ENVIRONMENTS: Registry[EnvironmentFactory] = Registry("environment")
ENVIRONMENTS.register_lazy("synthetic", "orchestra_jax.envs.synthetic:from_config")
ENVIRONMENTS.register_lazy("qa", "orchestra_jax.envs.qa:from_config")
ENVIRONMENTS.register_lazy("tau2", "orchestra_jax.envs.tau2.env:from_config")
ENVIRONMENTS.register_lazy("routed", "orchestra_jax.envs.routing:from_config")
