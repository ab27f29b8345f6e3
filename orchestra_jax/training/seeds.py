"""Named random streams: every seed a run draws, and what it seeds.

A run's randomness is a pure function of its seeds, so a resumed run retraces
an uninterrupted one and a figure can be reproduced from its config. Each
stream is `agent.episode.derive_seed(root, ...)` of a root seed (`seed` for
training, `eval.seed` for the held-out test) and a tag or position:

  step_tool_config_seed(seed, step, i)   GRPO step `step`: task i's tool configuration
  step_episode_seed(seed, step)          GRPO step `step`: its episodes (sampling)
  step_backend_seed(seed, step)          GRPO step `step`: the simulated tools
  demo_tool_config_seed(seed, n)         warm start: demonstration n's tool configuration
  demo_episode_seed(seed, round)         warm start: a round's episodes and router plans
  eval_episode_seed(eval_seed)           held-out evaluation: episodes and sampling
  Stream.HELDOUT_PREFERENCES             held-out evaluation: the preferred tools
  Stream.SFT_BATCHES                     warm start: the order of its batches

The warm start's tags (7, 8) take the place of the step in GRPO's tuples of
the same shape, so GRPO step 7's tool configurations and step 8's episodes
share seeds with the warm start's first demonstrations; the values are kept so
that recorded runs replay exactly.
"""

from __future__ import annotations

import enum

from orchestra_jax.agent.episode import derive_seed


class Stream(enum.IntEnum):
    """Tags that tell a run's random streams apart (values fixed: runs replay)."""

    SFT_BATCHES = 5
    DEMO_TOOL_CONFIGS = 7
    DEMO_EPISODES = 8
    HELDOUT_PREFERENCES = 11
    EVAL_EPISODES = 99
    STEP_BACKENDS = 1 << 20  # in the task-index position: above any task count


def step_tool_config_seed(seed: int, step: int, task_index: int) -> int:
    """GRPO step `step`: the seed of task `task_index`'s tool configuration."""
    return derive_seed(seed, step, task_index)


def step_episode_seed(seed: int, step: int) -> int:
    """GRPO step `step`: the root of its episodes' seeds (`make_group_specs`)."""
    return derive_seed(seed, step)


def step_backend_seed(seed: int, step: int) -> int:
    """GRPO step `step`: the seed of the simulated tools (experts' draws)."""
    return derive_seed(seed, step, Stream.STEP_BACKENDS)


def demo_tool_config_seed(seed: int, index: int) -> int:
    """Warm start: the seed of demonstration `index`'s tool configuration."""
    return derive_seed(seed, Stream.DEMO_TOOL_CONFIGS, index)


def demo_episode_seed(seed: int, round_index: int) -> int:
    """Warm start: the seed of round `round_index`'s episodes, plans and tools:
    derive_seed(seed, tag) for round 0, derive_seed(seed, tag, round) after it."""
    if round_index:
        return derive_seed(seed, Stream.DEMO_EPISODES, round_index)
    return derive_seed(seed, Stream.DEMO_EPISODES)


def eval_episode_seed(eval_seed: int) -> int:
    """Held-out evaluation: the root of its episodes' seeds (`eval.seed`)."""
    return derive_seed(eval_seed, Stream.EVAL_EPISODES)
