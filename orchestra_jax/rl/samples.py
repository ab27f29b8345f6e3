"""What the learner trains on: the sample unit, picked by `rl.sample_unit`.

A sample unit turns the kept episodes of a step (each with its advantage A_i and
its training loss mask) into the learner's samples: anything with `token_ids`,
`loss_mask`, `rollout_logprobs` and `advantage`, as `rl/batching.py` reads them.

    episode   one sample per episode: its whole token sequence, the loss over
              every token it generated (a Trajectory is its own sample).
    turn      one sample per turn k of episode i: the ids the engine was given
              for that turn, then the ids it generated,

                  token_ids   = ids[s_k : s_k + p_k + n_k]
                  loss_mask   = 0 on the p_k prompt ids, the episode's training
                                mask on the n_k generated ids
                  advantage   = A_i

              with s_k = `Turn.prompt_start`, p_k = `Turn.prompt_tokens`, n_k =
              `Turn.num_generated_tokens`. A turn with no loss token left (a
              malformed turn under the format filter, an empty generation) gives
              no sample. With the "history" context a turn's prompt is the
              episode so far (earlier turns' tokens in it, masked); with
              "rebuild" it is the turn's own prompt.

`SAMPLE_UNITS` maps `rl.sample_unit` to a function `(episodes) -> samples`;
"package.module:attr" names one's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from orchestra_jax.registry import Registry

__all__ = ["SAMPLE_UNITS", "Sample", "episode_samples", "turn_samples"]

SAMPLE_UNITS: Registry[Any] = Registry("sample unit")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One learner sample cut from an episode (`turn` = its turn index)."""

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantage: float | None
    task_id: str = ""
    group_index: int = 0
    turn: int = 0


@SAMPLE_UNITS.register("episode")
def episode_samples(episodes: Sequence[Any]) -> list[Any]:
    """Each episode whole."""
    return list(episodes)


@SAMPLE_UNITS.register("turn")
def turn_samples(episodes: Sequence[Any]) -> list[Sample]:
    """One sample per turn with a loss token (module docstring), episode by episode."""
    out: list[Sample] = []
    for episode in episodes:
        for k, turn in enumerate(episode.turns):
            start, prompt = turn.prompt_start, turn.prompt_tokens
            end = start + prompt + turn.num_generated_tokens
            if end > len(episode.token_ids):
                raise ValueError(
                    f"episode {episode.task_id}/{episode.group_index} turn {k} ends at "
                    f"{end}, past its {len(episode.token_ids)} tokens"
                )
            mask = [0] * prompt + [int(m) for m in episode.loss_mask[start + prompt : end]]
            if not any(mask):
                continue
            out.append(
                Sample(
                    token_ids=list(episode.token_ids[start:end]),
                    loss_mask=mask,
                    rollout_logprobs=[0.0] * prompt
                    + [float(x) for x in episode.rollout_logprobs[start + prompt : end]],
                    advantage=episode.advantage,
                    task_id=episode.task_id,
                    group_index=episode.group_index,
                    turn=k,
                )
            )
    return out


def samples_of(unit: str, episodes: Sequence[Any]) -> list[Any]:
    """The learner's samples of `episodes` under the sample unit named `unit`."""
    return SAMPLE_UNITS.get(unit)(episodes)
