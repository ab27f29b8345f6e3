"""GRPO batches that keep one copy of each group's prompt, run once per step.

The G episodes of a GRPO group start with the same prompt (system message, tool
schemas with their prices, the question): in the demo ~670 of ~900 tokens,
eight times over. A `SharedPromptBatch` stores that prompt once per group. The
learner's forward (`shared_prompt_hidden_states`) runs the prompts first,
writing their keys and values into a KV cache, then runs every episode's own
positions against its group's cached prompt. Gradients flow back through the
cache into the prompt positions, so log-probs, loss and gradients are those of
the whole episodes, while the prompt's layers run once instead of G times and
no episode attends to another's tokens.

Layout (g groups, m episodes a group, prompt bucket P, completion bucket C):

    prompt_ids, prompt_positions, prompt_segment_ids   [g, P]
    completions   a TrainBatch (rl/batching.py) whose arrays are [g, m, C]
                  and loss_index [g, m, K]

In the shifted alignment of `rl/batching.py`, an episode's prompt is its
positions before its first loss position; episodes whose prompts are
identical (fed tokens and predicted tokens alike) form a group, whatever their
task ids say, so an episode nobody shares a prompt with is a group of one.
Episode j of group i holds its positions from p_i on, with `positions` p_i,
p_i + 1, ... Padding has segment id 0 (and loss mask 0); groups with fewer than
m episodes are padded with empty episodes, and the group count to
`row_multiple` · 2^k as in `build_train_batch`, so micro-batches (groups of
`micro_batch_size`) and the batch's split over devices work as for TrainBatch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orchestra_jax.rl.batching import (
    BatchingConfig,
    TrainBatch,
    bucket_length,
    bucket_rows,
    loss_positions,
    shifted_sequences,
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SharedPromptBatch:
    """A learner batch of g groups, each one prompt and m episodes continuing it."""

    prompt_ids: Any  # int32 [g, P]
    prompt_positions: Any  # int32 [g, P]: 0, 1, ... on the prompt, 0 on padding
    prompt_segment_ids: Any  # int32 [g, P]: 1 on the prompt, 0 on padding
    completions: TrainBatch  # [g, m, C] arrays (module docstring)

    @property
    def shape(self) -> tuple[int, int]:
        """(groups, padded positions a group holds: P + m · C)."""
        g, prompt = self.prompt_ids.shape
        _, m, length = self.completions.input_ids.shape
        return g, prompt + m * length

    def num_loss_tokens(self) -> int:
        return self.completions.num_loss_tokens()


def loss_rows(batch: TrainBatch | SharedPromptBatch) -> TrainBatch:
    """The rows that carry the loss, as [B, T] arrays: a TrainBatch itself, or a
    SharedPromptBatch's episodes with the group axis folded into the rows."""
    if isinstance(batch, TrainBatch):
        return batch
    return jax.tree.map(lambda x: x.reshape(-1, x.shape[-1]), batch.completions)


def shared_prompt_hidden_states(model, batch: SharedPromptBatch) -> tuple[jax.Array, TrainBatch]:
    """(final hidden states [g · m, C, H] of every episode position, `loss_rows(batch)`).

    Each position sees its group's prompt and the earlier positions of its own
    episode, exactly the keys it sees in the unshared episode.
    """
    rows = loss_rows(batch)
    groups, prompt_len = batch.prompt_ids.shape
    per_group = rows.input_ids.shape[0] // groups
    cache = model.init_cache(groups, prompt_len + rows.input_ids.shape[1])
    # Prompt padding has segment 0, so its keys are never written (see Qwen3ForCausalLM).
    _, cache = model.hidden_states(
        batch.prompt_ids,
        batch.prompt_positions,
        segment_ids=batch.prompt_segment_ids,
        cache=cache,
        kv_len=prompt_len,
    )
    # Every episode reads a copy of its group's prompt cache; its own keys then
    # fill the slots from p_i on, which the prompt left empty.
    cache = cache.take_rows(jnp.repeat(jnp.arange(groups), per_group))
    hidden, _ = model.hidden_states(
        rows.input_ids, rows.positions, segment_ids=rows.segment_ids, cache=cache
    )
    return hidden, rows


def _prompt_length(seq: dict[str, np.ndarray]) -> int:
    """Positions before the first loss position, leaving the episode at least one."""
    loss = np.flatnonzero(seq["loss_mask"] > 0)
    last = len(seq["input_ids"]) - 1
    return min(int(loss[0]), last) if len(loss) else last


def build_shared_prompt_batch(
    trajectories: Sequence[Any],
    advantages: Sequence[float] | None = None,
    config: BatchingConfig | None = None,
) -> SharedPromptBatch:
    """Groups trajectories by prompt into one bucketed `SharedPromptBatch`
    (arguments as for `build_train_batch`; `config.pack` does not apply)."""
    config = config or BatchingConfig()
    if config.pack:
        raise ValueError("shared-prompt batches keep one episode a row; pack=False")
    seqs = shifted_sequences(trajectories, advantages)
    groups: dict[tuple, list[int]] = {}
    for i, seq in enumerate(seqs):
        p = _prompt_length(seq)
        key = (p, seq["input_ids"][:p].tobytes(), seq["target_ids"][:p].tobytes())
        groups.setdefault(key, []).append(i)
    prompts = [key[0] for key in groups]
    members = list(groups.values())
    prompt_len = bucket_length(max(max(prompts), 1), config.seq_buckets)
    completion_len = bucket_length(
        max(len(seqs[i]["input_ids"]) - p for p, run in zip(prompts, members) for i in run),
        config.seq_buckets,
    )
    num_groups = bucket_rows(len(members), config.row_multiple)
    per_group = bucket_rows(max(len(run) for run in members), 1)

    prompt = {
        name: np.zeros((num_groups, prompt_len), np.int32)
        for name in ("prompt_ids", "prompt_positions", "prompt_segment_ids")
    }
    shape = (num_groups, per_group, completion_len)
    out: dict[str, np.ndarray] = {
        name: np.zeros(shape, np.int32)
        for name in ("input_ids", "positions", "segment_ids", "target_ids")
    }
    out.update(
        {name: np.zeros(shape, np.float32) for name in ("loss_mask", "advantages", "old_logprobs")}
    )
    for g, (p, run) in enumerate(zip(prompts, members)):
        prompt["prompt_ids"][g, :p] = seqs[run[0]]["input_ids"][:p]
        prompt["prompt_positions"][g, :p] = np.arange(p)
        prompt["prompt_segment_ids"][g, :p] = 1
        for j, i in enumerate(run):
            n = len(seqs[i]["input_ids"]) - p
            for name, values in seqs[i].items():
                out[name][g, j, :n] = values[p:]
            out["positions"][g, j, :n] = np.arange(p, p + n)
            out["segment_ids"][g, j, :n] = 1
    index = loss_positions(out["loss_mask"].reshape(-1, completion_len))
    out["loss_index"] = index.reshape(num_groups, per_group, -1)
    return SharedPromptBatch(completions=TrainBatch(**out), **prompt)
