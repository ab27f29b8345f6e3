"""Warm start: which demonstrations are imitated, and GRPO's KL reference is the
warm-start policy, also on resume."""

import jax
import numpy as np
import pytest

from experiments.configs import grpo_hle
from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.rl.batching import build_train_batch
from orchestra_jax.training import experiment, loop_steps, warm_start
from tests.trajectory_helpers import graded_episode


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _config(tmp_path):
    config = grpo_hle.get_config("micro")
    config.workdir = str(tmp_path)
    config.sft.steps, config.sft.num_demos, config.sft.batch_size = 2, 4, 2
    config.sft.lr = 1e-2
    config.rl.kl_coef = 0.1
    return config


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_reference_is_the_warm_start_policy_and_survives_a_restart(tmp_path, lora_rank):
    config = _config(tmp_path)
    config.lora.rank = lora_rank  # LoRA: the reference is the base + the warm start's adapters
    run = loop_steps.setup_run(config)
    initial = _leaves(run.learner.params)
    experiment.run_warm_start(config, run)
    warm = _leaves(run.learner.params)
    assert any(not np.array_equal(a, b) for a, b in zip(initial, warm)), "SFT changed nothing"
    for ref, w in zip(_leaves(run.learner.ref_params), warm):
        np.testing.assert_array_equal(ref, w)
    assert any(np.abs(ref).max() > 0 for ref in _leaves(run.learner.ref_params))  # not off
    # The reference survives a GRPO step, which donates the parameters' buffers.
    episode = Trajectory(
        task_id="t",
        group_index=0,
        seed=0,
        token_ids=list(range(1, 17)),
        loss_mask=[0] * 8 + [1] * 8,
        rollout_logprobs=[0.0] * 8 + [-1.0] * 8,
        prompt_length=8,
        finish_reason="answer",
        advantage=1.0,
    )
    run.learner.train_step(build_train_batch([episode] * 2, config=run.batching))
    for ref, w in zip(_leaves(run.learner.ref_params), warm):
        np.testing.assert_array_equal(ref, w)

    restarted = loop_steps.setup_run(config)  # a new process would start from the initial model
    experiment.restore_reference(config, restarted)
    for ref, w in zip(_leaves(restarted.learner.ref_params), warm):
        np.testing.assert_array_equal(ref, w)
    for engine in (run.engine, restarted.engine):
        engine.close()


def test_missing_reference_is_a_clear_error(tmp_path):
    config = _config(tmp_path)
    run = loop_steps.setup_run(config)
    with pytest.raises(FileNotFoundError, match="KL reference"):
        experiment.restore_reference(config, run)
    run.engine.close()


def _graded(correct, task_id="t", cost=0.0):
    return graded_episode(task_id, finish_reason="answer", correct=correct, cost_usd=cost)


def test_demo_filter_keeps_solved_episodes_only():
    demos = [_graded(True), _graded(False), _graded(None), _graded(True)]
    assert warm_start.keep_demonstrations(demos, "none") == demos
    assert warm_start.keep_demonstrations(demos, "correct") == [demos[0], demos[3]]
    with pytest.raises(ValueError, match="unknown demo filter"):
        warm_start.keep_demonstrations(demos, "cheapest")


def test_best_demo_filter_keeps_each_tasks_solved_episode_of_highest_utility():
    a = [_graded(True, "a", 0.05), _graded(False, "a", 0.0), _graded(True, "a", 0.01)]
    b = [_graded(False, "b"), _graded(None, "b"), _graded(False, "b")]  # unsolved: no demo
    c = [_graded(True, "c", 0.02), _graded(True, "c", 0.02), _graded(False, "c", 0.0)]
    demos = a + b + c

    def utility(episodes):  # cheaper is better, whether or not the episode was solved
        return np.array([-e.cost_usd for e in episodes])

    kept = warm_start.keep_demonstrations(demos, "best", group_size=3, utility=utility)
    # a: the cheaper solved one, not the cheapest (unsolved) one; c: the first on a tie.
    assert [id(k) for k in kept] == [id(a[2]), id(c[0])]
    with pytest.raises(ValueError, match="groups of 4"):
        warm_start.keep_demonstrations(demos, "best", group_size=4, utility=utility)
    with pytest.raises(ValueError, match="utility"):
        warm_start.keep_demonstrations(demos, "best", group_size=3)


def _collect_seeded(config):
    """Demonstrations of `config`, after checking that a second fresh run collects
    the same ones: same tokens, and (tools.charge_measured_time=False) the same
    costs and latencies, charged to the seed, not the clock."""
    collected = []
    for _ in range(2):
        run = loop_steps.setup_run(config)
        collected.append(experiment.collect_demonstrations(config, run))
        run.engine.close()
    demos, again = collected
    assert [d.token_ids for d in again] == [d.token_ids for d in demos]
    assert [(d.cost_usd, d.latency_s) for d in again] == [(d.cost_usd, d.latency_s) for d in demos]
    return demos


def test_correct_demonstrations_are_collected_until_enough_pass(tmp_path):
    config = _config(tmp_path)
    config.sft.demo_filter = "correct"
    config.sft.num_demos = 6
    demos = _collect_seeded(config)
    assert demos and len(demos) <= 6 and all(d.correct for d in demos)


def test_best_demonstrations_are_solved_one_per_task_and_seeded(tmp_path):
    config = _config(tmp_path)
    config.sft.demo_filter = "best"
    config.sft.demo_best_of = 3
    config.sft.num_demos = 4
    demos = _collect_seeded(config)
    assert demos and len(demos) <= 4 and all(d.correct for d in demos)
    assert len({d.task_id for d in demos}) == len(demos)  # one per task


def test_parameter_ema_is_the_debiased_moving_average():
    import jax.numpy as jnp

    trees = [{"w": jnp.array([v], jnp.bfloat16)} for v in (1.0, 2.0, 4.0)]
    average = warm_start.parameter_ema(iter(trees), 0.5)
    # Weights 1/8, 1/4, 1/2 (decay^(n-i) (1 - decay)), divided by their sum 7/8.
    assert average["w"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(average["w"]), [(1 / 8 + 2 / 4 + 4 / 2) / (7 / 8)])
    np.testing.assert_allclose(
        np.asarray(warm_start.parameter_ema(iter(trees[:1]), 0.9)["w"]), [1.0], rtol=1e-6
    )
    with pytest.raises(ValueError, match="no parameters"):
        warm_start.parameter_ema(iter([]), 0.5)


class CountingLearner:
    """Each SFT step adds 1 to every parameter: after step k they equal k."""

    def __init__(self):
        import jax.numpy as jnp

        self.params, self.opt_state, self.step = {"w": jnp.zeros(2, jnp.bfloat16)}, "adam", 0

    def sft_step(self, batch):
        self.params, self.step = {"w": self.params["w"] + 1}, self.step + 1
        return {"loss": 0.0}

    def load_state(self, params, opt_state=None, *, step=0):
        self.params, self.opt_state, self.step = params, opt_state, step


@pytest.mark.parametrize("decay, expected", [(0.0, 3.0), (0.5, (1 / 8 + 2 / 4 + 3 / 2) / (7 / 8))])
def test_sft_ends_on_the_last_or_the_averaged_parameters(decay, expected):
    from orchestra_jax.rl.batching import BatchingConfig

    demo = Trajectory(
        task_id="t",
        group_index=0,
        seed=0,
        token_ids=list(range(1, 9)),
        loss_mask=[0] * 4 + [1] * 4,
        rollout_logprobs=[0.0] * 8,
        prompt_length=4,
        finish_reason="answer",
    )
    learner = CountingLearner()
    history = warm_start.run_sft(
        learner,
        [demo],
        batch_size=1,
        steps=3,
        seed=0,
        batching=BatchingConfig(seq_buckets=(8,)),
        ema_decay=decay,
    )
    assert len(history) == 3 and learner.step == 3 and learner.opt_state == "adam"
    assert learner.params["w"].dtype == np.dtype("bfloat16")  # The average is cast back.
    np.testing.assert_allclose(
        np.asarray(learner.params["w"], np.float32), [expected] * 2, rtol=1e-2
    )


def test_sft_ema_decay_reaches_the_warm_start(tmp_path, monkeypatch):
    config = _config(tmp_path)
    config.sft.ema_decay = 0.9
    seen = {}
    real = warm_start.run_sft

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(warm_start, "run_sft", spy)
    run = loop_steps.setup_run(config)
    experiment.run_warm_start(config, run)
    assert seen["ema_decay"] == 0.9
    run.engine.close()
