"""The GRPO loop: data → tool configs → rollouts → rewards → batches → update → sync.

    for step in range(restored step, num_steps):
      tasks        = next(Grain iterator)                       (tasks_per_step)
      configs      = ToolConfigSampler.sample(task, seed(step, i))
      trajectories = G episodes per task on the rollout engine, graded
      experience   = group rewards, advantages, filters         (training/rollouts.py)
      metrics      = learner.train_step(batch of the kept episodes' samples:
                     whole episodes or turns, rl/samples.py)     (rl/learner.py)
      engine.update_weights(new params)                         (weight sync)
      write metrics, trajectories; checkpoint every N steps

Every random choice of step s is a function of (config.seed, s) and the data
iterator's position, so a run killed at any point and restarted from its last
checkpoint takes the same path as one that never stopped (on CPU, bitwise).

The steps are `training/loop_steps.py`'s, shared with the asynchronous loop
(`training/async_loop.py`), which runs instead when `rl.max_staleness` > 0.
"""

from __future__ import annotations

from orchestra_jax.parallel import multihost
from orchestra_jax.training import loop_steps
from orchestra_jax.training.async_loop import async_train
from orchestra_jax.training.metrics import MetricsWriter
from orchestra_jax.training.rollouts import Timer
from orchestra_jax.training.run_sync import run_sync


def grpo_train(run: loop_steps.Run, *, progress=None, evaluate=None) -> int:
    """Runs GRPO from the last checkpoint to `num_steps`; returns the final step.

    `evaluate(step)`, when given, runs after every `eval.every_steps`-th
    step but the last (which the caller evaluates in full) and returns metrics
    logged with that step, e.g. the current policy's held-out reward.
    """
    sections = run.sections
    if sections.rl.max_staleness > 0:  # rollouts overlap learning: training/async_loop.py
        final = async_train(run, progress=progress, evaluate=evaluate)
        loop_steps.write_adapter(run)
        return final
    iterator = loop_steps.train_task_iterator(sections)
    start = loop_steps.restore(run, iterator)
    writer = MetricsWriter(
        run.workdir,
        total_steps=sections.run.num_steps,
        use_tensorboard=sections.log.tensorboard,
        resume_step=start,
        enabled=multihost.is_primary(),
    )
    timer = Timer()
    try:
        for step in range(start, sections.run.num_steps):
            with timer("data"):
                tasks = next(iterator)
            with timer("rollout"):
                experience = run_sync(loop_steps.collect_experience(run, tasks, step))
            with timer("learner"):
                learner_metrics = loop_steps.train_step(run, experience)
            with timer("weight_sync"):
                sync_metrics = run_sync(loop_steps.sync_weights(run, step + 1))
            loop_steps.end_step(
                run,
                step,
                experience,
                learner_metrics,
                data_state=iterator.get_state(),
                timer=timer,
                writer=writer,
                evaluate=evaluate,
                extra=sync_metrics,
            )
            if progress is not None:
                progress(step + 1, experience.metrics)
    finally:
        run.checkpointer.wait_until_finished()
        writer.close()
    loop_steps.write_adapter(run)
    return sections.run.num_steps
