"""Supervised warm start: behaviour cloning of demonstration episodes.

Demonstrations are real episodes: a router (`eval/routers.py`) plays its plan
through the same agent loop, tools and tokenizer as the policy, so the tokens
are exactly those the policy will later produce and read. The loss is
cross-entropy on the demonstrator's tokens only (loss mask 1), never on the
prompt or on tool results.

Any jsonl of chat conversations works too (`experiments/sft.py --demos=...`):
each conversation is rendered with the chat template and the assistant turns
are trained on (`conversation_example`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.chat.template import render
from orchestra_jax.envs.environment import Environment
from orchestra_jax.eval.routers import RouterEngine
from orchestra_jax.rewards.judge import Judge
from orchestra_jax.rl.batching import BatchingConfig, build_train_batch
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.tasks import Task
from orchestra_jax.tools.config import ToolConfig
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes
from orchestra_jax.training.seeds import Stream

log = logging.getLogger(__name__)


async def router_demonstrations(
    router: str,
    tasks: Sequence[Task],
    tool_configs: Sequence[ToolConfig],
    *,
    env: Environment,
    tokenizer: Any,
    limits: LoopLimits,
    seed: int,
    group_size: int = 1,
    judge: Judge | None = None,
    task_indices: Sequence[int] | None = None,
) -> list[Trajectory]:
    """`group_size` demonstration episodes per task, task by task, played by `router`
    (each with its own plan: a router's plan depends on the task and the episode's
    group index), graded by `env` (with `judge` for "judge" tasks).

    `seed` seeds the plans, the tools and the episodes (episode seeds by the tasks'
    places `task_indices`, default 0, 1, …); routers decode greedily.
    """
    engine = RouterEngine(
        router, tokenizer, {t.id: c for t, c in zip(tasks, tool_configs)}, seed=seed
    )
    how = Episodes(
        env=env,
        engine=engine,
        tokenizer=tokenizer,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=limits.max_new_tokens_per_turn),
        limits=limits,
        group_size=group_size,
        tools_seed=seed,
        judge=judge,
    )
    return await run_graded_episodes(tasks, tool_configs, how, seed=seed, task_indices=task_indices)


DEMO_FILTERS = ("none", "correct", "best")
DEFAULT_DEMO_BEST_OF = 4  # "best": episodes played per task


def keep_demonstrations(
    demos: Sequence[Trajectory],
    demo_filter: str,
    *,
    group_size: int = 1,
    utility: Callable[[Sequence[Trajectory]], np.ndarray] | None = None,
) -> list[Trajectory]:
    """The demonstrations worth imitating.

    "none": all of them but those that failed by infrastructure
    (`Trajectory.infra_failure`: what the demonstrator did there is cut short by
    a service, not chosen). "correct": only the episodes graded correct (rejection-
    sampled behaviour cloning: a random demonstrator's successes teach which tools
    suit which task, its failures teach nothing). "best": `demos` holds
    `group_size` consecutive episodes per task; of each task's correct ones, the
    one of highest `utility` (the first on ties; none if no episode is correct).
    With the user's own utility (cost and latency weighed by the task's
    preferences) this is best-of-n rejection sampling: the demonstrator's cheapest
    way to the right answer, so the warm start also learns what to spend.
    """
    if demo_filter == "none":
        return [d for d in demos if d.infra_failure is None]
    if demo_filter == "correct":
        return [d for d in demos if d.correct]
    if demo_filter == "best":
        if utility is None:
            raise ValueError("demo filter 'best' needs a utility function")
        if group_size < 1 or len(demos) % group_size:
            raise ValueError(f"{len(demos)} demonstrations do not form groups of {group_size}")
        scores = np.asarray(utility(demos), np.float64)
        kept = []
        for start in range(0, len(demos), group_size):
            solved = [i for i in range(start, start + group_size) if demos[i].correct]
            if solved:
                kept.append(demos[max(solved, key=lambda i: (scores[i], -i))])
        return kept
    raise ValueError(f"unknown demo filter {demo_filter!r}; choose one of {DEMO_FILTERS}")


def conversation_example(
    messages: Sequence[dict], tokenizer, *, tools=None, enable_thinking: bool = True
) -> Trajectory:
    """A chat conversation as a trajectory whose loss mask covers the assistant turns.

    The final assistant message is the target: `render(messages)` minus
    `render(messages[:-1], add_generation_prompt=True)`, up to its `<|im_end|>`.
    Earlier assistant turns are prompt (masked): Qwen3's template rewrites them
    (it strips their reasoning), so they are not what the model would generate.
    """
    messages = list(messages)
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("a demonstration must end with an assistant message")
    prompt = render(
        messages[:-1], tools=tools, add_generation_prompt=True, enable_thinking=enable_thinking
    )
    full = render(messages, tools=tools, enable_thinking=enable_thinking)
    if not full.startswith(prompt):
        raise ValueError(
            "the final assistant turn does not continue the rendered prompt "
            "(render with enable_thinking matching the data)"
        )
    # The "\n" after <|im_end|> belongs to the next turn, not to what is generated.
    target = full[len(prompt) :].removesuffix("\n")
    prompt_ids = tokenizer.encode(prompt)
    target_ids = tokenizer.encode(target)
    ids = prompt_ids + target_ids
    return Trajectory(
        task_id="sft",
        group_index=0,
        seed=0,
        token_ids=ids,
        loss_mask=[0] * len(prompt_ids) + [1] * len(target_ids),
        rollout_logprobs=[0.0] * len(ids),
        prompt_length=len(prompt_ids),
        finish_reason="answer",
    )


def sft_batches(
    examples: Sequence[Trajectory],
    *,
    batch_size: int,
    steps: int,
    seed: int,
    batching: BatchingConfig,
) -> Iterator[Any]:
    """`steps` batches of `batch_size` examples, reshuffled every epoch (seeded)."""
    if not examples:
        raise ValueError("no demonstrations to train on")
    rng = np.random.default_rng([seed, Stream.SFT_BATCHES])
    order: list[int] = []
    for _ in range(steps):
        while len(order) < batch_size:
            order.extend(rng.permutation(len(examples)).tolist())
        chosen, order = order[:batch_size], order[batch_size:]
        yield build_train_batch([examples[i] for i in chosen], [0.0] * batch_size, batching)


@jax.jit
def _ema_update(average: Any, params: Any, decay: jax.Array) -> Any:
    return jax.tree.map(
        lambda a, p: decay * a + (1 - decay) * p.astype(jnp.float32), average, params
    )


def parameter_ema(updates: Iterator[Any], decay: float) -> Any:
    """The exponential moving average of a sequence of parameter trees, debiased.

    Zero-initialised and divided by 1 − decay^n after n trees, as Adam's moments
    are, so the weights on the trees sum to 1 and the last tree weighs 1 − decay
    (relative). Kept in float32 whatever the parameters' dtype: one float32 copy
    of the model, sharded as the parameters are.
    """
    average, n, d = None, 0, jnp.float32(decay)
    for params in updates:
        if average is None:
            average = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        average, n = _ema_update(average, params, d), n + 1
    if average is None:
        raise ValueError("no parameters to average")
    return jax.tree.map(lambda a: a / (1 - decay**n), average)


def run_sft(
    learner,
    examples: Sequence[Trajectory],
    *,
    batch_size: int,
    steps: int,
    seed: int,
    batching: BatchingConfig,
    on_step=None,
    ema_decay: float = 0.0,
) -> list[dict[str, float]]:
    """`steps` supervised updates; returns each step's metrics.

    `ema_decay` > 0 leaves the learner with the moving average of its parameters
    over the steps (`parameter_ema`) instead of the last step's. At a constant
    learning rate the last step's parameters carry the last few batches' noise
    (a choice the demonstrations make one way or another at random swings with
    them); the average keeps the demonstrations' lean
    (docs/notes/2026-11-24-demo-one-test-and-warm-start-average.md).
    """
    history = []

    def updated_params():
        for step, batch in enumerate(
            sft_batches(examples, batch_size=batch_size, steps=steps, seed=seed, batching=batching),
            start=1,
        ):
            metrics = learner.sft_step(batch)
            history.append(metrics)
            if on_step is not None:
                on_step(step, metrics)
            yield learner.params

    if not ema_decay:
        for _ in updated_params():
            pass
        return history
    average = parameter_ema(updated_params(), ema_decay)
    learner.load_state(
        jax.tree.map(lambda a, p: a.astype(p.dtype), average, learner.params),
        learner.opt_state,
        step=learner.step,
    )
    return history
