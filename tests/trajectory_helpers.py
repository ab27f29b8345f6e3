"""Trajectories for tests that read only an episode's outcome (reward, correctness,
cost, plan), not its tokens."""

from __future__ import annotations

from typing import Any

from orchestra_jax.agent.trajectory import Trajectory


def graded_episode(task_id: str, **fields: Any) -> Trajectory:
    """Episode 0 of `task_id`: one prompt token and one sampled token, with `fields`
    (reward, correct, cost_usd, turns, metadata, …) set or overriding these."""
    return Trajectory(
        **{
            "task_id": task_id,
            "group_index": 0,
            "seed": 0,
            "token_ids": [1, 2],
            "loss_mask": [0, 1],
            "rollout_logprobs": [0.0, 0.0],
            "prompt_length": 1,
            **fields,
        }
    )
