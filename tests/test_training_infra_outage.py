"""A short GRPO run through the training loop with an expert outage injected: the
failed episodes are counted and named, and the update is the one the other
episodes alone would make (in turn with turn samples, and overlapped by the
asynchronous loop with mini-batches)."""

import json
import os

import jax
import numpy as np
import pytest

from orchestra_jax.eval.routers import RouterEngine
from orchestra_jax.tools.experts.client import ExpertError
from orchestra_jax.tools.experts.simulated import SimulatedExpert
from orchestra_jax.training import grpo_loop, loop_steps
from orchestra_jax.training.rollouts import score_groups
from tests.resume_worker import ranked_reward
from tests.test_training_e2e import _params, micro_config

DOWN = "http://expert.test/v1"
GROUP = 4


def outage_run(tmp_path, monkeypatch, **overrides):
    """A micro run whose policy answers at once through the strongest expert, and
    whose expert is down for the first episode of each task to call it."""
    config = micro_config(
        tmp_path,
        **{"rl.group_size": GROUP, "log.tensorboard": False, "num_steps": 2, **overrides},
    )
    run = loop_steps.setup_run(config)
    run.engine.close()
    engine = RouterEngine("direct_strongest", run.tokenizer, {}, seed=0)
    sample = run.sampler.sample

    def sample_and_tell_the_router(task, seed=None):
        tool_config = sample(task, seed)
        engine.tool_configs[task.id] = tool_config
        engine._plans.clear()  # a task met again has a new configuration
        return tool_config

    run.sampler.sample = sample_and_tell_the_router
    run.engine = engine
    run.reward_fn = ranked_reward  # episode i of a group scores i: real advantages
    failed_seeds: dict[str, int] = {}
    complete = SimulatedExpert.complete

    async def down_for_one_episode_a_task(self, messages, *, ctx=None, **kwargs):
        if failed_seeds.setdefault(ctx.task.id, ctx.seed) == ctx.seed:
            raise ExpertError(f"expert {self.name!r} at {DOWN}: HTTP 503", endpoint=DOWN)
        return await complete(self, messages, ctx=ctx, **kwargs)

    monkeypatch.setattr(SimulatedExpert, "complete", down_for_one_episode_a_task)
    trained = []
    train_step = loop_steps.train_step

    def recording_train_step(run, experience):
        trained.append(experience)
        failed_seeds.clear()  # the next step's tasks fail once each again
        return train_step(run, experience)

    monkeypatch.setattr(loop_steps, "train_step", recording_train_step)
    return run, trained


@pytest.mark.parametrize(
    "overrides",
    [
        {"rl.max_staleness": 0, "rl.sample_unit": "turn"},  # in turn, a sample per turn
        {"rl.max_staleness": 1, "rl.num_minibatches": 2},  # overlapped, two mini-batches
    ],
    ids=["in_turn", "async"],
)
def test_an_expert_outage_is_counted_and_the_rest_learns_unchanged(
    tmp_path, monkeypatch, overrides
):
    run, trained = outage_run(tmp_path, monkeypatch, **overrides)
    before = jax.tree.leaves(_params(run.learner))
    grpo_loop.grpo_train(run)
    lines = [json.loads(x) for x in open(os.path.join(tmp_path, "metrics.jsonl"))]
    assert [line["step"] for line in lines] == [1, 2] and len(trained) == 2
    for line, experience in zip(lines, trained):
        trajs = experience.trajectories
        failed = [t for t in trajs if t.infra_failure is not None]
        assert len(failed) >= 1 and all(t.infra_failure.kind == "expert" for t in failed)
        assert all(t.infra_failure.endpoint == DOWN for t in failed)
        assert line["rollout/infra_failed"] == line["rollout/infra_failed/expert"] == len(failed)
        assert line[f"rollout/infra_failed_at/{DOWN}"] == len(failed)
        assert line["rollout/infra_failed/engine"] == 0.0
        # Nothing of a failed episode is trained; the rest is scored as groups without it.
        assert not any(t.infra_failure for t in experience.kept)
        rest = [t for t in trajs if t.infra_failure is None]
        for start in range(0, len(trajs), GROUP):
            group = [t for t in trajs[start : start + GROUP] if t.infra_failure is None]
            alone = score_groups(
                group,
                group_size=len(group),
                reward_fn=ranked_reward,
                adv_clip=run.sections.rl.adv_clip,
                filter_reward_std=run.sections.rl.filter_reward_std,
                format_filter=run.sections.rl.format_filter,
            )
            assert [t.advantage for t in group] == pytest.approx(alone.advantages.tolist())
        # The router answers on turn 0: one sample per episode under either unit.
        assert line["learner/samples"] == len(experience.kept) == len(rest)
        assert line["learner/skipped"] == 0.0
    after = jax.tree.leaves(_params(run.learner))
    assert any(not np.array_equal(b, a) for b, a in zip(before, after))  # it learned
