"""A whole experiment: warm start → held-out eval → GRPO → held-out eval → report.

    1. warm start (config.sft.steps > 0, and no GRPO checkpoint yet): behaviour
       cloning of router demonstrations (training/warm_start.py);
    2. evaluate the warm-start policy on held-out tasks under the evaluation
       protocol (`eval.protocol`: held-out prices by default);
    3. GRPO to config.num_steps, resuming from the last checkpoint; every
       config.eval.every_steps steps (0: never) the current policy is evaluated
       the same way into <workdir>/eval_steps/ and its held-out reward, accuracy,
       cost, latency and preference score are logged as "eval/..." metrics;
    4. evaluate the trained policy and the baseline routers on the same tasks;
    5. eval_report.md, eval_pareto.png and training curves in the workdir.

Each stage that already left its result in the workdir is skipped on restart.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from typing import Any

import jax

from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.chat.tokenizer import ChatTokenizer
from orchestra_jax.config_section import ExperimentConfig, split_list
from orchestra_jax.data.pipeline import global_positions
from orchestra_jax.envs.environment import Environment
from orchestra_jax.eval.report import write_report
from orchestra_jax.eval.routers import RouterEngine
from orchestra_jax.io import paths
from orchestra_jax.parallel.multihost import is_primary
from orchestra_jax.rewards.judge import Judge, MatchFirst
from orchestra_jax.rl.learner import Learner
from orchestra_jax.rl.samples import samples_of
from orchestra_jax.rollout.engine import RolloutEngine
from orchestra_jax.tasks import Task
from orchestra_jax.tools.config import ToolConfig
from orchestra_jax.training import builders, grpo_loop, loop_steps, seeds, warm_start
from orchestra_jax.training.checkpointing import restore_params, save_params
from orchestra_jax.training.eval_protocols import eval_protocol
from orchestra_jax.training.evaluation import TOOL_TABLES, Evaluator, heldout_rewards
from orchestra_jax.training.host_rollouts import gather_step
from orchestra_jax.training.metrics import plot_metrics
from orchestra_jax.training.rollouts import Episodes
from orchestra_jax.training.run_sync import run_sync

log = logging.getLogger(__name__)

MAX_DEMO_ROUNDS = 8

CURVES = (
    "reward",
    "accuracy",
    "cost_usd",
    "learner/loss",
    "learner/pg_clip_frac_high",
    "learner/pg_clip_frac_low",
    "learner/grad_norm",
)


def heldout_data(config: ExperimentConfig) -> tuple[list[Task], list[dict[str, Any]]]:
    """The first `eval.num_tasks` held-out tasks (`data.eval_split` of the synthetic
    world; the held-out split of file sources, `data/splits.py`) and a read report
    per source (rows read, skipped, malformed, in the split)."""
    sources, reports = builders.build_task_sources(config, config.data.eval_split)
    return [t for s in sources for t in s.tasks][: config.eval.num_tasks], reports


def eval_tasks(config: ExperimentConfig) -> list[Task]:
    """The first `eval.num_tasks` held-out tasks (see `heldout_data`)."""
    return heldout_data(config)[0]


def heldout_tool_configs(
    config: ExperimentConfig, env: Environment, tasks: list[Task]
) -> dict[str, ToolConfig]:
    """task id -> its evaluation tool configuration: the table of the config's
    evaluation protocol (`eval.protocol`), drawn from `eval.seed` where it draws."""
    table = TOOL_TABLES.get(eval_protocol(config).tool_table)
    return table(env, tasks, seed=config.eval.seed, **builders.tool_config_fields(config))


def baseline_router(
    config: ExperimentConfig,
    router: str,
    tokenizer: ChatTokenizer,
    tool_configs: Mapping[str, ToolConfig],
) -> RouterEngine:
    """Baseline `router` playing `tool_configs`, its draws from `eval.seed`."""
    return RouterEngine(router, tokenizer, tool_configs, seed=config.eval.seed)


def build_evaluator(
    config: ExperimentConfig,
    env: Environment | None,
    tokenizer: ChatTokenizer,
    judge: Judge | None = None,
) -> Evaluator:
    """The experiment's held-out test (`eval.*`) under its evaluation protocol
    (`eval.protocol`, `training/eval_protocols.py`, applied here and nowhere else):
    its tasks, their tool configurations, the episodes' seed, sampling and limits,
    the judge of "judge" tasks behind the protocol's exact-match check.

    `env` is the run's environment, built from `config`; where the protocol changes
    env.* (τ²'s step budget), or `env` is None, the evaluation's own is built here.
    """
    protocol = eval_protocol(config)
    test = protocol.apply(config)
    if env is None or test.env.to_dict() != config.env.to_dict():
        env = builders.build_env(test)
    if judge is not None and getattr(judge, "answer_match", None) != protocol.answer_match:
        judge = MatchFirst(judge, protocol.answer_match)
    tasks, reports = heldout_data(test)
    episodes = Episodes(
        env=env,
        tokenizer=tokenizer,
        sampling=builders.eval_sampling_params(test),
        limits=builders.loop_limits(test),
        judge=judge,
    )
    return Evaluator(
        tasks,
        heldout_tool_configs(test, env, tasks),
        episodes,
        seed=seeds.eval_episode_seed(test.eval.seed),
        cost_scale=test.eval.cost_scale_usd,
        latency_scale=test.eval.latency_scale_s,
        workdir=loop_steps.workdir_of(test),
        max_infra_failure_fraction=test.rl.max_infra_failure_fraction,
        data_reports=reports,
        trials=test.eval.num_trials,
        protocol=protocol.name,
    )


EVAL_METRICS = (
    "heldout_reward",
    "accuracy",
    "mean_cost_usd",
    "mean_latency_s",
    "preference_score",
    "infra_failed",
)


def evaluate(
    evaluator: Evaluator,
    name: str,
    engine: RolloutEngine,
    *,
    extra: Mapping[str, Any] | None = None,
    workdir: str | None = None,
) -> dict[str, Any]:
    """`evaluator.evaluate` from synchronous code, logged in one line."""
    summary = run_sync(evaluator.evaluate(name, engine, extra=extra, workdir=workdir))
    log.info(
        "eval %-18s accuracy %.3f  cost $%.5f  latency %.1fs  held-out reward %.3f",
        name,
        summary["accuracy"],
        summary["mean_cost_usd"],
        summary["mean_latency_s"],
        summary["heldout_reward"],
    )
    return summary


def run_warm_start(config: ExperimentConfig, run: loop_steps.Run) -> None:
    """Behaviour cloning of `config.sft.demo_policy` on training tasks (step 1),
    on the demonstrations `config.sft.demo_filter` keeps, cut into `rl.sample_unit`'s
    samples (whole episodes or turns)."""
    demos = collect_demonstrations(config, run)
    learner = Learner(run.model, builders.build_sft_learner_config(config), mesh=run.mesh)
    batching = builders.build_batching(config, learner.row_multiple(config.sft.batch_size))

    def report(step, metrics):
        if step % 10 == 0 or step == config.sft.steps:
            log.info("warm start %d/%d  loss %.4f", step, config.sft.steps, metrics["loss"])

    warm_start.run_sft(
        learner,
        samples_of(config.rl.sample_unit, demos),  # what GRPO will train on: episodes or turns
        batch_size=config.sft.batch_size,
        steps=config.sft.steps,
        seed=config.seed,
        batching=batching,
        on_step=report,
        ema_decay=config.sft.ema_decay,
    )
    # The GRPO learner and engine were built on the same model object: refresh both.
    run.learner.load_state(learner.params, run.learner.opt_state, step=0)
    run_sync(loop_steps.sync_weights(run, 0))
    if config.rl.kl_coef:
        # The warm-start policy is GRPO's KL reference (the paper's is its initial
        # policy); saved so that a resumed run gets the same reference back.
        save_params(warm_start_dir(config), learner.params)
        run.learner.set_reference(learner.params)


def collect_demonstrations(config: ExperimentConfig, run: loop_steps.Run) -> list[Trajectory]:
    """`config.sft.num_demos` demonstrations that pass `config.sft.demo_filter`.

    Rounds of `num_demos` training tasks are played by the demonstrator until
    enough pass (at most `MAX_DEMO_ROUNDS` rounds); each round has its own tool
    configurations and seeds, so the result is deterministic in `config.seed`.
    With the "best" filter every task is played `sft.demo_best_of` times and the
    held-out reward's utility (the task's own cost and latency preferences)
    picks the episode kept. On several hosts each plays its share of a round and
    the hosts exchange the episodes, so every host keeps the same demonstrations.
    """
    tasks = loop_steps.train_task_iterator(run.sections, whole_steps=True)  # split below
    best_of = config.sft.demo_best_of if config.sft.demo_filter == "best" else 1
    utility = functools.partial(
        heldout_rewards,
        cost_scale=config.eval.cost_scale_usd,
        latency_scale=config.eval.latency_scale_s,
    )
    want, kept, played = config.sft.num_demos, [], 0
    for round_index in range(MAX_DEMO_ROUNDS):
        demo_tasks = []
        while len(demo_tasks) < want:
            demo_tasks.extend(next(tasks))
        demo_tasks = demo_tasks[:want]
        # On several hosts each plays its share of the round (the tasks at places
        # h, h + H, …, seeded by their places) and the hosts exchange the episodes.
        places = global_positions(jax.process_index(), jax.process_count(), want)
        configs = [
            run.sampler.sample(
                demo_tasks[i], seeds.demo_tool_config_seed(config.seed, round_index * want + i)
            )
            for i in places
        ]
        mine = run_sync(
            warm_start.router_demonstrations(
                config.sft.demo_policy,
                [demo_tasks[i] for i in places],
                configs,
                env=run.env,
                tokenizer=run.tokenizer,
                limits=builders.loop_limits(config),
                seed=seeds.demo_episode_seed(config.seed, round_index),
                group_size=best_of,
                judge=run.judge,
                task_indices=places,
            )
            if places
            else _no_episodes()
        )
        demos = gather_step(mine, best_of)
        played += len(demos)
        kept.extend(
            warm_start.keep_demonstrations(
                demos, config.sft.demo_filter, group_size=best_of, utility=utility
            )
        )
        if len(kept) >= want:
            break
    if not kept:
        raise RuntimeError(
            f"no {config.sft.demo_policy} demonstration of {played} passed "
            f"sft.demo_filter={config.sft.demo_filter!r}"
        )
    if len(kept) < want:
        log.warning(
            "only %d of %d demonstrations passed sft.demo_filter=%r after %d episodes",
            len(kept),
            want,
            config.sft.demo_filter,
            played,
        )
    log.info("warm start: %d demonstrations kept of %d played", min(len(kept), want), played)
    return kept[:want]


async def _no_episodes() -> list[Trajectory]:
    return []


def warm_start_dir(config: ExperimentConfig) -> str:
    return paths.join(loop_steps.workdir_of(config), "warm_start_params")


def restore_reference(config: ExperimentConfig, run: loop_steps.Run) -> None:
    """On resume after a warm start: the KL reference is the saved warm-start policy."""
    path = warm_start_dir(config)
    if not paths.as_path(path).is_dir():
        raise FileNotFoundError(
            f"{path} is missing: a run with a warm start and rl.kl_coef > 0 cannot resume "
            "without its KL reference (the warm-start policy)"
        )
    run.learner.set_reference(restore_params(path, run.learner.params))


def run_experiment(config: ExperimentConfig) -> dict[str, Any]:
    """Runs every stage of the module docstring; returns the evaluation summaries."""
    workdir = loop_steps.workdir_of(config)
    primary = is_primary()  # on several hosts, process 0 alone writes files
    paths.check_writable(workdir)  # a gs:// workdir without credentials fails here, clearly
    if primary:
        paths.write_text_atomic(
            paths.join(workdir, "config.json"), config.to_json_best_effort(indent=2, sort_keys=True)
        )
    run = loop_steps.setup_run(config)
    evaluator = build_evaluator(config, run.env, run.tokenizer, run.judge)
    summaries = {}
    fresh = run.checkpointer.latest_step() is None
    if fresh and config.sft.steps:
        log.info(
            "warm start: %d steps on %d %s demonstrations",
            config.sft.steps,
            config.sft.num_demos,
            config.sft.demo_policy,
        )
        run_warm_start(config, run)
    elif config.sft.steps and config.rl.kl_coef:
        restore_reference(config, run)
    if fresh and config.eval.num_tasks:
        summaries["warm_start"] = evaluate(evaluator, "warm_start", run.engine)

    def evaluate_during_training(step):
        # Kept apart from the final evaluations, which eval_report.md compares.
        summary = evaluate(
            evaluator,
            f"step_{step:06d}",
            run.engine,
            extra={"steps": step},
            workdir=paths.join(workdir, "eval_steps"),
        )
        return {f"eval/{k}": summary[k] for k in EVAL_METRICS if summary.get(k) is not None}

    grpo_loop.grpo_train(run, evaluate=evaluate_during_training if config.eval.num_tasks else None)
    if config.eval.num_tasks:
        summaries["grpo"] = evaluate(
            evaluator, "grpo", run.engine, extra={"steps": config.num_steps}
        )
        for router in split_list(config.eval.baselines):
            engine = baseline_router(config, router, run.tokenizer, evaluator.tool_configs)
            summaries[router] = evaluate(evaluator, router, engine, extra={"baseline": True})
            engine.close()
        try:
            if primary:
                md, png = write_report(workdir)
                log.info("evaluation report: %s, %s", md, png)
        except Exception:  # eval_*.json are written; the run's end must not be lost to a report
            log.exception("writing the evaluation report failed (eval_*.json are in %s)", workdir)
    metrics_file = paths.join(workdir, "metrics.jsonl")
    if primary and paths.as_path(metrics_file).exists():
        plot_metrics(metrics_file, paths.join(workdir, "curves.png"), list(CURVES))
    if run.judge is not None:
        run.judge.flush()
    run.engine.close()
    if primary:
        text = json.dumps(summaries, indent=2, sort_keys=True)
        paths.write_text_atomic(paths.join(workdir, "summary.json"), text)
    return summaries
