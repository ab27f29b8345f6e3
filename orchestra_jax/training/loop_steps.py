"""A GRPO run's parts and the steps both training loops share.

`setup_run` builds a `Run` (environment, judge, tokenizer, mesh, model, tool
configuration sampler, learner, rollout engine, batching, checkpointer) from its
config, with the config's typed sections (`experiment_config.Sections`), all the
steps read of it; the steps below are what the synchronous loop
(`training/grpo_loop.py`) and the asynchronous one (`training/async_loop.py`) each
call in their own order:

    train_task_iterator   the training task stream, a step's tasks at a time
    restore               the last checkpoint into learner, engine and iterator
    play_step             G graded episodes per task of a step
    score_step            rewards, advantages, filters        (training/rollouts.py)
    train_step            the learner's update on the kept samples  (rl/learner.py)
    sync_weights          the learner's weights to the engine
    end_step              trajectories, checkpoint, evaluation when due, metrics
    write_adapter         with LoRA, the final adapters as a PEFT folder
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import jax
import numpy as np

from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.agent.trajectory import write_jsonl
from orchestra_jax.chat.tokenizer import ChatTokenizer
from orchestra_jax.config_section import ExperimentConfig, parse_weighted
from orchestra_jax.data.pipeline import task_iterator
from orchestra_jax.data.splits import load_split
from orchestra_jax.envs.environment import Environment
from orchestra_jax.io import paths
from orchestra_jax.models.peft_adapter import save_adapter
from orchestra_jax.models.qwen3.config import Qwen3Config
from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM
from orchestra_jax.parallel import multihost
from orchestra_jax.rewards.judge import LLMJudge
from orchestra_jax.rewards.registry import GroupReward
from orchestra_jax.rl.batching import (
    BatchingConfig,
    TrainBatch,
    build_train_batch,
    pack_batch,
    place_minibatches,
)
from orchestra_jax.rl.learner import Learner
from orchestra_jax.rl.minibatch_order import reorder_samples
from orchestra_jax.rl.prefix_packing import pack_shared_prefixes
from orchestra_jax.rl.samples import samples_of
from orchestra_jax.rl.shared_prompts import build_shared_prompt_batch
from orchestra_jax.rollout.engine import RolloutEngine, SamplingParams, ServedEngine
from orchestra_jax.tools.config_sampler import ToolConfigSampler
from orchestra_jax.training import builders, experiment_config, host_rollouts, infra_failures, seeds
from orchestra_jax.training.checkpointing import Checkpointer
from orchestra_jax.training.experiment_config import Sections
from orchestra_jax.training.metrics import MetricsWriter
from orchestra_jax.training.rollouts import (
    Episodes,
    StepExperience,
    Timer,
    run_graded_episodes,
    score_groups,
)
from orchestra_jax.training.run_config import RunConfig
from orchestra_jax.training.run_sync import run_sync

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Run:
    """Everything a GRPO run holds between steps (built by `setup_run`)."""

    sections: Sections  # the config, typed: what the steps read of it
    config_record: dict[str, Any]  # the config as written, saved with each checkpoint
    workdir: str
    tokenizer: ChatTokenizer
    mesh: jax.sharding.Mesh
    model: Qwen3ForCausalLM
    model_config: Qwen3Config
    env: Environment
    sampler: ToolConfigSampler
    reward_fn: GroupReward
    sampling: SamplingParams  # training rollouts' (rollout.*, agent.max_new_tokens_per_turn)
    limits: LoopLimits  # the agent loop's (agent.*)
    judge: LLMJudge | None  # grades "judge" tasks (reward.judge); None: none configured
    learner: Learner
    engine: RolloutEngine
    batching: BatchingConfig
    checkpointer: Checkpointer
    # Several hosts with the JAX engine: its host-local parameters' shardings
    # (training/host_rollouts.py); None: the engine reads the learner's parameters.
    engine_shardings: Any = None


def workdir_of(config: ExperimentConfig) -> str:
    """The run's folder: `config.workdir` (a local path or a `gs://` URI, see
    `orchestra_jax/io/paths.py`), by default `runs/<variant>` (`RunConfig.run_dir`)."""
    return RunConfig.unchecked(RunConfig.top_level(config)).run_dir()


def judge_cache_path(config: ExperimentConfig, process: int | None = None) -> str:
    """Where this process's LLM judge verdicts are kept across restarts: one file per
    host (`judge_cache.jsonl` on process 0, `judge_cache.host<i>.jsonl` on the others),
    since an object store cannot take appends from several writers."""
    process = jax.process_index() if process is None else process
    name = "judge_cache.jsonl" if process == 0 else f"judge_cache.host{process}.jsonl"
    return paths.join(workdir_of(config), name)


def judge_cache_files(config: ExperimentConfig) -> list[str]:
    """Every host's judge cache file in the workdir (each host reads them all)."""
    return [os.fspath(p) for p in paths.as_path(workdir_of(config)).glob("judge_cache*.jsonl")]


def setup_run(config: ExperimentConfig) -> Run:
    """Builds every part of a run from its config (a `ConfigError` listing every
    problem where it is invalid)."""
    sections = experiment_config.sections(config)
    workdir = sections.run.run_dir()
    paths.check_writable(workdir)  # a gs:// workdir without credentials fails here, clearly
    # The environment and the judge first: an endpoint that is down fails in seconds.
    env = builders.build_env(config)
    judge = builders.build_judge(
        config, judge_cache_path(config), also_read=judge_cache_files(config)
    )
    tokenizer = builders.build_tokenizer(config)
    mesh = builders.build_mesh(config)
    model, model_config = builders.build_model(config, mesh, tokenizer)
    sampler = env.tool_config_sampler(
        seed=sections.run.seed,
        ranges=builders.sampler_ranges(config),
        **builders.tool_config_fields(config),
    )
    learner = Learner(
        model,
        builders.build_learner_config(config, total_steps=sections.run.num_steps, mesh=mesh),
        mesh=mesh,
    )
    engine_model, engine_shardings = model, None
    if jax.process_count() > 1 and sections.rollout.engine == "jax":
        engine_model, engine_shardings = host_rollouts.host_local_engine_model(
            model, mesh.shape["tensor"]
        )
    engine = builders.build_engine(config, engine_model, model_config)
    batching = builders.build_batching(config, learner.row_multiple())
    checkpointer = Checkpointer(
        paths.join(workdir, "checkpoints"),
        max_to_keep=sections.checkpoint.keep,
        save_interval_steps=sections.checkpoint.every_steps,  # 0: the final step only
    )
    return Run(
        sections=sections,
        config_record=config.to_dict() if hasattr(config, "to_dict") else dict(config),
        workdir=workdir,
        tokenizer=tokenizer,
        mesh=mesh,
        model=model,
        model_config=model_config,
        env=env,
        sampler=sampler,
        reward_fn=builders.build_reward(config),
        sampling=builders.sampling_params(config),
        limits=builders.loop_limits(config),
        judge=judge,
        learner=learner,
        engine=engine,
        batching=batching,
        checkpointer=checkpointer,
        engine_shardings=engine_shardings,
    )


def train_task_iterator(sections: Sections, *, whole_steps: bool = False):
    """The training task stream, a step's tasks at a time: this host's share of each
    step, or with `whole_steps` every task of each step (the same on every host)."""
    data = sections.data
    sources, _ = load_split(data, "train", sections.eval.num_tasks)
    shard = {"shard_index": 0, "shard_count": 1} if whole_steps else {}
    return task_iterator(
        sources,
        tasks_per_step=sections.rl.tasks_per_step,
        seed=sections.run.seed,
        **shard,
        stratify_by=data.stratify_by or None,
        stratum_weights=dict(parse_weighted(data.stratum_weights, "data.stratum_weights")),
    )


def restore(run: Run, iterator, *, sync_engine: bool = True) -> int:
    """Restores the last checkpoint into the learner, the rollout engine and the
    iterator; returns its step (0 where there is no checkpoint).

    The engine samples from its own copy of the weights, so it is synced here:
    a caller that only evaluates (experiments/evaluate.py) gets the checkpoint's
    policy, not the freshly initialised one the engine was built with. With
    `sync_engine=False` the caller loads them itself (evaluation on servers:
    `training/policy_push.py`).
    """
    step = run.checkpointer.latest_step()
    if step is None:
        if sync_engine and isinstance(run.engine, ServedEngine):  # servers start on their own
            run_sync(sync_weights(run, 0))
        return 0
    restored = run.checkpointer.restore(
        step,
        params=run.learner.params,
        opt_state=run.learner.opt_state,
        rng=jax.random.key(run.sections.run.seed),
    )
    run.learner.load_state(restored.params, restored.opt_state, step=restored.step)
    if sync_engine:
        run_sync(sync_weights(run, restored.step))
    if iterator is not None and restored.data_state is not None:
        iterator.set_state(restored.data_state)
    log.info("resumed from %s at step %d", run.checkpointer.directory, restored.step)
    return restored.step


async def collect_experience(run: Run, tasks, step: int) -> StepExperience:
    """Rollouts of one step, graded and scored (see `training/rollouts.py`); on several
    hosts, this host's share of the step, exchanged (`training/host_rollouts.py`)."""
    positions = host_rollouts.task_positions(run.sections.rl.tasks_per_step)
    trajectories = await play_step(run, tasks, step, positions)
    trajectories = host_rollouts.gather_step(trajectories, run.sections.rl.group_size)
    return score_step(run, trajectories)


async def play_step(run: Run, tasks, step: int, positions) -> list:
    """G graded episodes for each of step `step`'s `tasks`, at their places `positions`
    in the step (which, with the step, seed their tool configs and episodes)."""
    sections = run.sections
    tool_configs = [
        run.sampler.sample(task, seeds.step_tool_config_seed(sections.run.seed, step, i))
        for i, task in zip(positions, tasks)
    ]
    how = Episodes(
        env=run.env,
        engine=run.engine,
        tokenizer=run.tokenizer,
        sampling=run.sampling,
        limits=run.limits,
        group_size=sections.rl.group_size,
        tools_seed=seeds.step_backend_seed(sections.run.seed, step),
        sleep_scale=sections.tools.sleep_scale,
        judge=run.judge,
    )
    return await run_graded_episodes(
        tasks,
        tool_configs,
        how,
        seed=seeds.step_episode_seed(sections.run.seed, step),
        task_indices=positions,
    )


def score_step(run: Run, trajectories) -> StepExperience:
    """Rewards, advantages and filters of a step's graded episodes (`rl.*`); a step
    where more than `rl.max_infra_failure_fraction` of the episodes failed by
    infrastructure stops the run (`infra_failures.check_fraction`)."""
    rl = run.sections.rl
    infra_failures.check_fraction(
        trajectories, rl.max_infra_failure_fraction, what="the step's episodes"
    )
    return score_groups(
        trajectories,
        group_size=rl.group_size,
        reward_fn=run.reward_fn,
        adv_clip=rl.adv_clip,
        filter_reward_std=rl.filter_reward_std,
        format_filter=rl.format_filter,
        format_penalty=rl.format_penalty,
        filter_no_answer=rl.filter_no_answer,
        advantage=rl.advantage,
        advantage_boost=rl.advantage_boost,
        drop_no_answer=rl.drop_no_answer,
        train_message_turns=run.sections.env.tau2.train_message_turns,
        min_group_size_after_infra=rl.min_group_size_after_infra,
    )


def train_step(run: Run, experience: StepExperience) -> dict[str, float]:
    """The learner's updates on the kept episodes' samples (`rl.sample_unit`; skipped,
    and said so, when there are none): with rl.minibatch_size m, mini-batches of m
    samples in order, the remainder last (`Learner.minibatch_sizes`); otherwise
    rl.num_minibatches strided mini-batches. With rl.balance_partitions the samples are
    first put in the reference's order (`rl/minibatch_order.py`). With rl.pack each
    mini-batch's samples are packed into rows (`batching.pack_batch`; with
    rl.share_prefixes, samples that begin alike share one copy of their common start:
    `prefix_packing.pack_shared_prefixes`): the same mini-batches, losses and
    gradients as one sample a row."""
    rl = run.sections.rl
    samples = samples_of(rl.sample_unit, experience.kept)
    if not samples:
        return {"learner/skipped_no_signal": 1.0}
    if rl.minibatch_size:  # the reference's _balance_batch when rl.balance_partitions
        samples = reorder_samples(
            samples, rl.balance_partitions, rl.balance_group_size, rl.minibatch_size
        )
    sizes = run.learner.minibatch_sizes(len(samples))
    if rl.pack:  # each mini-batch packed into rows of its own (rl/batching.py pack_batch)
        n = len(sizes) if sizes is not None else run.learner.minibatches_for(len(samples))
        if sizes is not None:  # m, m, …, the remainder, in order
            bounds = np.cumsum([0, *sizes])
            groups = [range(bounds[i], bounds[i + 1]) for i in range(n)]
        else:  # sample j in mini-batch j mod n, as the unpacked batch's strided rows
            groups = [range(i, len(samples), n) for i in range(n)]
        batching = dataclasses.replace(
            run.batching, row_multiple=run.learner.row_multiple(num_minibatches=1)
        )
        pack = pack_shared_prefixes if rl.share_prefixes else pack_batch
        batch = pack(samples, config=batching, minibatches=groups)
        metrics = run.learner.train_step(batch, num_minibatches=n, minibatch_sizes=sizes)
    elif sizes is not None:  # m, m, …, the remainder: each mini-batch its samples in order
        batch = build_train_batch(
            samples, config=dataclasses.replace(run.batching, row_multiple=1, pack=False)
        )
        batch = place_minibatches(batch, sizes, run.learner.minibatch_rows(len(samples)))
        metrics = run.learner.train_step(batch, num_minibatches=len(sizes), minibatch_sizes=sizes)
    else:
        n = run.learner.minibatches_for(len(samples))
        batching = dataclasses.replace(
            run.batching, row_multiple=run.learner.row_multiple(num_minibatches=n)
        )
        build = build_shared_prompt_batch if rl.share_prompts else build_train_batch
        batch = build(samples, config=batching)
        metrics = run.learner.train_step(batch, num_minibatches=n)
    out = {f"learner/{k}": v for k, v in metrics.items()}
    out["learner/batch_rows"], out["learner/batch_len"] = batch.shape
    if isinstance(batch, TrainBatch):  # positions holding a token (shared prefixes once)
        out["learner/written_positions"] = float((np.asarray(batch.segment_ids) > 0).sum())
    out["learner/samples"] = float(len(samples))
    return out


async def sync_weights(run: Run, version: int) -> dict[str, float]:
    """The learner's weights to the engine as `version`; on servers, each server's load
    is verified by the client (`rollout/http/client.py`: version and sync probe)."""
    params = host_rollouts.engine_weights(run.learner.policy_params(), run.engine_shardings)
    await run.engine.update_weights(params, version=version)
    return sync_report(run.engine)


def sync_report(engine: RolloutEngine) -> dict[str, float]:
    """The last weight sync's probe metrics (`rollout/sync_logprob_max_abs_diff`) on
    engines that serve from servers; {} in process."""
    report = getattr(engine, "sync_metrics", None)
    return report() if report is not None else {}


def server_metrics(engine: Any) -> dict[str, float]:
    """`rollout/server/<i>/...`: what each inference server did since the last step
    (requests, tokens, errors, latency; `rollout/http/server_pool.py`), for engines that
    dispatch over servers; {} for the others."""
    take = getattr(engine, "take_metrics", None)
    return {f"rollout/server/{k}": v for k, v in take().items()} if take is not None else {}


def end_step(
    run: Run,
    step: int,
    experience: StepExperience,
    learner_metrics: dict[str, float],
    *,
    data_state: Any,
    timer: Timer,
    writer: MetricsWriter,
    evaluate=None,
    extra: dict[str, float] | None = None,
) -> None:
    """After step `step`'s update: trajectories, checkpoint (with the data iterator's
    state `data_state` after the step's tasks), evaluation when due, metrics."""
    sections = run.sections
    traj_every = sections.log.trajectories_every
    if traj_every and (step + 1) % traj_every == 0 and multihost.is_primary():
        write_jsonl(
            paths.join(run.workdir, "trajectories", f"step_{step + 1:06d}.jsonl"),
            experience.trajectories,
        )
    with timer("checkpoint"):
        run.checkpointer.save(
            step + 1,
            params=run.learner.params,
            opt_state=run.learner.opt_state,
            rng=jax.random.key(sections.run.seed),
            data_state=data_state,
            config=run.config_record,
            force=step + 1 == sections.run.num_steps,
        )
    eval_metrics = {}
    every = sections.eval.every_steps
    if (
        evaluate is not None
        and every
        and (step + 1) % every == 0
        and step + 1 < sections.run.num_steps
    ):
        with timer("eval"):
            eval_metrics = evaluate(step + 1)
    if run.judge is not None:
        run.judge.flush()  # its cache's new verdicts (on an object store: one upload)
    latencies = [sum(turn.tool_latency_s for turn in t.turns) for t in experience.trajectories]
    writer.write(
        step + 1,
        {
            **experience.metrics,
            **learner_metrics,
            **eval_metrics,
            **(extra or {}),
            **timer.pop(),
            **(run.judge.stats() if run.judge is not None else {}),
            **server_metrics(run.engine),
            "episode_tool_latency_s": float(np.mean(latencies)) if latencies else 0.0,
        },
    )


def adapter_dir(config: ExperimentConfig) -> str:
    """Where a LoRA run writes its final adapters in PEFT's format: <workdir>/adapter."""
    return paths.join(workdir_of(config), "adapter")


def write_adapter(run: Run) -> None:
    """With LoRA, the policy's adapters as a PEFT folder (`adapter_dir`), naming the
    base they adapt; serving engines and `experiments/evaluate.py --policies=hf:<base>+
    <adapter>` load it. Every host calls it; process 0 writes."""
    if not run.learner.lora:
        return
    model = run.sections.model
    base = model.hf_path or model.preset
    save_adapter(run.model, paths.join(run.workdir, "adapter"), base_model_name_or_path=base)
