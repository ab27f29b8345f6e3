"""What one episode runs (`EpisodeSpec`), G of them per task, and their seeds.

Seeds are derived, never drawn: episode (i, g) of a batch built with seed s has
seed derive_seed(s, i, g), and its turn t samples with turn_seed(that, t), so a
rollout replays exactly whatever else shares the engine's batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from orchestra_jax.tools.registry import make_tools


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """A task, its tool configuration and tools, which of the G samples, a seed.

    `tools` maps tool name -> `Tool`; a sequence of tools is accepted and keyed
    by their names. `state` is the environment's per-episode state
    (`Environment.reset(task)`), handed to the tools in `ToolContext.state`.
    `other_party` is the other side of the conversation
    (`Environment.other_party(task)`, an `agent.conversation.OtherParty`), or
    None for episodes between the policy and its tools only.
    """

    task: Any  # orchestra_jax.tasks.Task
    tool_config: Any  # tools.config.ToolConfig
    tools: Mapping[str, Any]
    group_index: int = 0
    seed: int = 0
    state: Any = None
    other_party: Any = None

    def __post_init__(self):
        if not isinstance(self.tools, Mapping):
            tools = cast(Sequence[Any], self.tools)
            object.__setattr__(self, "tools", {tool.name: tool for tool in tools})

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The schemas the policy is shown: the tools the environment offers beyond
        the tool configuration's (e.g. a τ² domain's tools) with their own schemas,
        then the configuration's (meta-tools with their price tables)."""
        configured = list(self.tool_config.tool_schemas())
        names = {schema["function"]["name"] for schema in configured}
        extra = [tool.schema() for name, tool in self.tools.items() if name not in names]
        return extra + configured


def derive_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers: SeedSequence(parts) -> 2 words -> int."""
    words = np.random.SeedSequence([int(p) & 0xFFFFFFFFFFFFFFFF for p in parts]).generate_state(2)
    return (int(words[0]) << 32 | int(words[1])) & (2**63 - 1)


def turn_seed(episode_seed: int, turn: int) -> int:
    """The sampling seed of one turn: derive_seed(episode_seed, turn)."""
    return derive_seed(episode_seed, turn)


def make_group_specs(
    tasks: Sequence[Any],
    tool_configs: Sequence[Any],
    group_size: int,
    seed: int,
    *,
    backends: Any = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    reset: Callable[[Any], Any] | None = None,
    other_party: Callable[[Any], Any] | None = None,
    task_indices: Sequence[int] | None = None,
) -> list[EpisodeSpec]:
    """G = `group_size` episodes per task, task by task (the order GRPO groups expect).

    `tool_configs[i]` belongs to `tasks[i]`; its tools are `tools[i]` when given,
    else `make_tools(tool_configs[i], backends)`. The G episodes of a task share
    its tools (tools keep per-episode state in their `ToolContext`); `reset(task)`,
    when given, makes each episode's own `state` (`Environment.reset`), and
    `other_party(task)` the other side of its conversation
    (`Environment.other_party`). Episode (i, g) gets seed
    derive_seed(seed, task_indices[i], g); task_indices default to 0, 1, … (a host
    playing part of a step passes its tasks' places in the step).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if len(tool_configs) != len(tasks):
        raise ValueError(f"{len(tasks)} tasks but {len(tool_configs)} tool configs")
    if tools is None:
        if backends is None:
            raise ValueError("make_group_specs needs backends= (to build the tools) or tools=")
        tools = [make_tools(config, backends) for config in tool_configs]
    elif len(tools) != len(tasks):
        raise ValueError(f"{len(tasks)} tasks but {len(tools)} tool sets")
    indices = range(len(tasks)) if task_indices is None else task_indices
    if len(indices) != len(tasks):
        raise ValueError(f"{len(tasks)} tasks but {len(indices)} task indices")
    return [
        EpisodeSpec(
            task=task,
            tool_config=config,
            tools=task_tools,
            group_index=g,
            seed=derive_seed(seed, i, g),
            state=None if reset is None else reset(task),
            other_party=None if other_party is None else other_party(task),
        )
        for i, task, config, task_tools in zip(indices, tasks, tool_configs, tools)
        for g in range(group_size)
    ]
