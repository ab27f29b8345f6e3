"""End to end: two GRPO steps of the `micro` config, checkpoint, restore, resume."""

import json
import os
import re

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.configs import grpo_hle
from orchestra_jax.agent.trajectory import read_jsonl
from orchestra_jax.config_section import ConfigError
from orchestra_jax.rl.learner import make_schedule
from orchestra_jax.training import builders, grpo_loop, loop_steps
from orchestra_jax.training.experiment import run_experiment
from orchestra_jax.training.experiment_config import sections, validate


def micro_config(workdir, **overrides):
    config = grpo_hle.get_config("micro")
    config.workdir = str(workdir)
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    validate(config)
    return config


def _params(learner):
    return jax.tree.map(np.asarray, jax.device_get(learner.params))


class NoiseReward:
    """A seeded random reward, so every group has a ranking to learn from.

    A random tiny model never answers correctly, so the paper's reward is 0 for
    every episode and GRPO (rightly) skips the update. This test checks the
    plumbing (rollouts -> advantages -> update -> checkpoint), not learning;
    learning is what the demo shows.
    """

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def __call__(self, features, correct, preference):
        del correct, preference
        return self.rng.normal(size=len(features)).astype(np.float32)


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("micro")
    config = micro_config(workdir)
    run = loop_steps.setup_run(config)
    run.reward_fn = NoiseReward()
    before = _params(run.learner)
    grpo_loop.grpo_train(run)
    after = _params(run.learner)
    run.engine.close()
    return config, workdir, before, after


def test_parameters_change_and_loss_is_finite(two_steps):
    config, workdir, before, after = two_steps
    changed = [
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
    ]
    assert any(changed), "no parameter moved in two GRPO steps"
    lines = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [m["step"] for m in lines] == [1, 2]
    for line in lines:
        assert np.isfinite(line["learner/loss"]) and line["learner/skipped"] == 0
        for key in (
            "reward",
            "accuracy",
            "cost_usd",
            "latency_s",
            "time/rollout_s",
            "time/learner_s",
            "learner/pg_clip_frac_low",
        ):
            assert key in line, key


def test_every_curve_plotted_is_a_logged_metric(two_steps):
    from orchestra_jax.training.experiment import CURVES

    _, workdir, _, _ = two_steps
    lines = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    for key in CURVES:
        assert all(key in line for line in lines), f"curves.png plots {key!r}, never logged"


def test_policy_is_evaluated_every_eval_steps_apart_from_the_final_report(tmp_path):
    config = micro_config(tmp_path, **{"eval.every_steps": 1, "eval.num_tasks": 2})
    run_experiment(config)
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [m["step"] for m in lines] == [1, 2]
    # Step 1 is evaluated during training; the last step by the final evaluation.
    assert 0.0 <= lines[0]["eval/heldout_reward"] <= 1.0 and "time/eval_s" in lines[0]
    assert not any(k.startswith("eval/") for k in lines[1])
    during = json.loads((tmp_path / "eval_steps" / "eval_step_000001.json").read_text())
    assert during["steps"] == 1 and during["num_episodes"] == 2
    assert lines[0]["eval/accuracy"] == during["accuracy"]
    assert sorted(p.name for p in tmp_path.glob("eval_*.json")) == [
        "eval_grpo.json",
        "eval_warm_start.json",
    ]  # what eval_report.md compares


def test_loss_mask_covers_exactly_the_generated_tokens(two_steps):
    _, workdir, _, _ = two_steps
    trajs = read_jsonl(os.path.join(workdir, "trajectories", "step_000002.jsonl"))
    assert trajs
    for t in trajs:
        mask = np.asarray(t.loss_mask)
        assert not mask[: t.prompt_length].any(), "prompt tokens are trained"
        generated = sum(turn.num_generated_tokens for turn in t.turns)
        assert mask.sum() == generated
        # Trained spans are exactly the sampled turns, in order.
        ids = np.asarray(t.token_ids)
        spans, pos = [], t.prompt_length
        for turn in t.turns:
            spans.append(ids[pos : pos + turn.num_generated_tokens])
            assert mask[pos : pos + turn.num_generated_tokens].all()
            pos += turn.num_generated_tokens + turn.num_observation_tokens
        assert np.concatenate(spans).tolist() == ids[mask == 1].tolist()
        lp = np.asarray(t.rollout_logprobs)
        assert (lp[mask == 0] == 0).all() and (lp[mask == 1] <= 0).all()


def test_checkpoint_restores_the_same_parameters(two_steps):
    config, workdir, _, after = two_steps
    run = loop_steps.setup_run(config)
    iterator = loop_steps.train_task_iterator(run.sections)
    assert loop_steps.restore(run, iterator) == 2
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(_params(run.learner))):
        np.testing.assert_array_equal(a, b)
    # The model object the engine samples from holds the restored weights too.
    model_params = jax.tree.leaves(jax.device_get(nnx.state(run.model, nnx.Param)))
    for a, b in zip(jax.tree.leaves(after), model_params):
        np.testing.assert_array_equal(a, np.asarray(b))
    # And so does the engine, which samples from its own copy (evaluate.py
    # evaluates a checkpoint through it without training a step).
    assert run.engine.weight_version == 2
    engine_params = jax.tree.leaves(jax.device_get(run.engine._state))
    assert len(engine_params) == len(model_params)
    for a, b in zip(jax.tree.leaves(after), engine_params):
        np.testing.assert_array_equal(a, np.asarray(b))
    run.engine.close()


def test_constrained_enum_arguments_need_the_jax_engine():
    config = grpo_hle.get_config("micro")
    config.agent.constrain_enum_arguments = True
    validate(config)
    config.rollout.engine = "vllm"
    with pytest.raises(
        ConfigError, match="agent.constrain_enum_arguments needs rollout.engine='jax'"
    ):
        validate(config)


def test_config_errors_are_listed_together(tmp_path):
    config = grpo_hle.get_config("micro")
    config.rl.lr = -1.0
    config.rollout.engine = "trt"
    config.data.sources = "synthetic,nonsense"
    config.tools.sandbox = "docker"
    config.rl.format_filter = "drop"
    config.sft.schedule = "step"
    config.rl.schedule = "step"
    config.sft.demo_filter = "cheapest"
    config.sft.demo_best_of = 0
    config.eval.cost_scale_usd = 0.0
    config.rl.advantage = "rloo"
    config.agent.max_concurrent_episodes = -1
    config.data.stratify_by = "colour"
    config.data.stratum_weights = "logic:two"
    config.eval.seed = -1
    config.sft.ema_decay = 1.0
    with pytest.raises(ConfigError) as e:
        validate(config)
    message = str(e.value)
    for needle in (
        "rl.lr",
        "rollout.engine",
        "nonsense",
        "tools.sandbox",
        "rl.format_filter",
        "sft.schedule",
        "sft.demo_filter",
        "sft.demo_best_of",
        "eval.cost_scale_usd",
        "rl.advantage",
        "agent.max_concurrent_episodes",
        "rl.schedule",
        "data.stratify_by",
        "data.stratum_weights",
        "eval.seed",
        "sft.ema_decay",
    ):
        assert needle in message
    with pytest.raises(ValueError, match="unknown config variant"):
        grpo_hle.get_config("huge")


def test_data_stratify_by_reaches_the_training_iterator():
    config = grpo_hle.get_config("micro")
    config.data.num_train_tasks, config.rl.tasks_per_step = 90, 3

    def steps_with_every_domain():
        iterator = loop_steps.train_task_iterator(sections(config))
        return sum(len({task.domain for task in next(iterator)}) == 3 for _ in range(30))

    # The synthetic domains' shares are near, not exactly, a third each, so the
    # proportional interleave repeats a domain now and then; by chance, a step
    # of three holds all three 2 times in 9.
    config.data.stratify_by, config.data.stratum_weights = "", ""
    assert steps_with_every_domain() < 15
    config.data.stratify_by = "domain"
    assert steps_with_every_domain() >= 25
    config.data.stratum_weights = "logic:2"
    iterator = loop_steps.train_task_iterator(sections(config))
    logic = sum(task.domain == "logic" for _ in range(30) for task in next(iterator))
    assert 40 <= logic <= 50  # About half of 90, not a third.


def test_training_seed_keeps_the_world_and_the_heldout_test():
    from orchestra_jax.training import experiment

    def world(**overrides):
        config = micro_config("", **{"eval.num_tasks": 12, **overrides})
        env = builders.build_env(config)
        tasks = experiment.eval_tasks(config)
        configs = experiment.heldout_tool_configs(config, env, tasks)
        first_step = next(loop_steps.train_task_iterator(sections(config)))
        return (
            [(t.id, t.question, t.answer) for t in tasks],
            list(configs.values()),
            sorted(t.id for t in first_step),
        )

    tasks, tool_configs, first_step = world()
    other_tasks, other_tool_configs, other_first_step = world(seed=1)
    # Another training seed: the same held-out tasks, prices and preferences,
    # another order of the same training tasks.
    assert (other_tasks, other_tool_configs) == (tasks, tool_configs)
    assert other_first_step != first_step
    assert all(i.startswith("synthetic-0-train-") for i in other_first_step)
    assert world(**{"data.synthetic_seed": 1})[0] != tasks
    assert world(**{"eval.seed": 1})[1] != tool_configs  # Another tool preferred.


def test_charge_measured_time_reaches_the_episode_loop():
    from orchestra_jax.training import builders

    config = grpo_hle.get_config("micro")
    assert builders.loop_limits(config).charge_tool_failure_time is False  # demo-derived
    config.tools.charge_measured_time = True
    assert builders.loop_limits(config).charge_tool_failure_time is True


def test_rl_schedule_reaches_the_learner_and_not_the_warm_start():
    config = grpo_hle.get_config("micro")
    config.num_steps, config.rl.schedule, config.rl.warmup_steps = 10, "cosine", 0
    validate(config)
    schedule = make_schedule(builders.build_learner_config(config, total_steps=config.num_steps))
    assert float(schedule(0)) == pytest.approx(config.rl.lr)
    assert float(schedule(5)) == pytest.approx(config.rl.lr / 2)
    assert float(schedule(10)) == pytest.approx(0.0, abs=1e-12)
    assert builders.build_sft_learner_config(config).schedule == config.sft.schedule
    config.rl.warmup_steps = 10
    with pytest.raises(ConfigError, match="rl.schedule"):
        validate(config)


def test_format_penalty_without_the_penalty_filter_is_an_error():
    config = grpo_hle.get_config("micro")
    config.rl.format_filter = "turn"
    config.rl.format_penalty = -0.5
    with pytest.raises(ConfigError, match="rl.format_penalty"):
        validate(config)
    config.rl.format_filter = "penalty"
    validate(config)


@pytest.mark.parametrize("variant", grpo_hle.VARIANTS)
def test_every_variant_builds(variant):
    config = grpo_hle.get_config(variant)
    assert config.variant == variant
    if variant in ("demo", "micro"):
        validate(config)


def test_demo_policy_may_be_a_mixture_of_routers():
    config = grpo_hle.get_config("micro")
    config.sft.steps = 5
    config.sft.demo_policy = "always_cheapest+direct_strongest"
    validate(config)
    config.sft.demo_policy = "random+oracle"
    with pytest.raises(ConfigError, match="sft.demo_policy"):
        validate(config)


def test_checkpoint_every_steps_zero_checkpoints_the_final_step_only(tmp_path):
    config = micro_config(tmp_path, **{"checkpoint.every_steps": 0})
    run = loop_steps.setup_run(config)
    try:
        state = dict(params=run.learner.params, opt_state=run.learner.opt_state, rng=0)
        assert not run.checkpointer.save(1, **state)  # 0: no periodic checkpoint
        assert run.checkpointer.save(config.num_steps, **state, force=True)  # the final one
        run.checkpointer.wait_until_finished()
        assert run.checkpointer.all_steps() == [config.num_steps]
    finally:
        run.engine.close()


@pytest.mark.parametrize("field", ["checkpoint.every_steps", "eval.every_steps"])
def test_negative_intervals_are_config_errors(tmp_path, field):
    with pytest.raises(ConfigError, match=f"{re.escape(field)} must be >= 0, got -1"):
        micro_config(tmp_path, **{field: -1})
