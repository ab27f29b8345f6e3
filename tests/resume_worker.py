"""A GRPO run of the `micro` config that can kill itself: the subject of
test_training_resume and test_multihost.

    python tests/resume_worker.py WORKDIR NUM_STEPS [KILL_AFTER_STEP]
    python -m launch.local_hosts --num_hosts 2 --devices_per_host 4 -- \
        python tests/resume_worker.py WORKDIR NUM_STEPS [KILL_AFTER_STEP]

RESUME_WORKER_MAX_STALENESS=k in the environment trains asynchronously
(`rl.max_staleness`); RESUME_WORKER_TURNS=1 with the reference's rebuilt
prompts and turn samples, two samples an update.

With KILL_AFTER_STEP it sends itself SIGKILL right after that step's metrics
are written (its checkpoint may still be in flight), like a preempted job;
with a fourth argument `saved`, once that step's checkpoint is on disk.
Under launch/local_hosts.py each process joins the job as one host.
"""

import os
import signal
import sys

import numpy as np


def ranked_reward(features, correct, preference):
    """Episode i of a group scores i: a fixed, resume-safe ranking with real gradients
    (a random tiny model never answers correctly, so the paper's reward is all 0)."""
    del correct, preference
    return np.arange(len(features), dtype=np.float32)


def main(workdir, num_steps, kill_after=None, wait_for_checkpoint=False):
    import logging

    logging.basicConfig(level=logging.INFO)
    from orchestra_jax.parallel import distributed

    distributed.initialize()  # a no-op outside launch/local_hosts.py
    from experiments.configs import grpo_hle
    from orchestra_jax.training import grpo_loop, loop_steps

    config = grpo_hle.get_config("micro")
    config.workdir = workdir
    config.num_steps = num_steps
    config.agent.seconds_per_generated_token = 0.02  # latency independent of machine load
    config.rl.max_staleness = int(os.environ.get("RESUME_WORKER_MAX_STALENESS", "0"))
    if os.environ.get("RESUME_WORKER_TURNS") == "1":
        config.agent.context, config.rl.sample_unit = "rebuild", "turn"
        config.rl.minibatch_size, config.rl.share_prompts, config.rl.warmup_steps = 2, False, 0
    run = loop_steps.setup_run(config)
    run.reward_fn = ranked_reward

    def progress(step, metrics):
        del metrics
        if kill_after is not None and step == kill_after:
            if wait_for_checkpoint:
                run.checkpointer.wait_until_finished()
            os.kill(os.getpid(), signal.SIGKILL)

    grpo_loop.grpo_train(run, progress=progress)
    run.engine.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]) if len(sys.argv) > 3 else None,
        len(sys.argv) > 4 and sys.argv[4] == "saved",
    )
