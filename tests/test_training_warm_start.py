"""Warm start: which demonstrations are imitated, and GRPO's KL reference is the
warm-start policy, also on resume."""

import jax
import numpy as np
import pytest

from experiments.configs import grpo_hle
from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.rl.batching import build_train_batch
from orchestra_jax.training import experiment, grpo_loop, warm_start


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _config(tmp_path):
  config = grpo_hle.get_config("micro")
  config.workdir = str(tmp_path)
  config.sft.steps, config.sft.num_demos, config.sft.batch_size = 2, 4, 2
  config.sft.lr = 1e-2
  config.rl.kl_coef = 0.1
  return config


def test_reference_is_the_warm_start_policy_and_survives_a_restart(tmp_path):
  config = _config(tmp_path)
  run = grpo_loop.setup_run(config)
  initial = _leaves(run.learner.params)
  experiment.run_warm_start(config, run)
  warm = _leaves(run.learner.params)
  assert any(not np.array_equal(a, b) for a, b in zip(initial, warm)), "SFT changed nothing"
  for ref, w in zip(_leaves(run.learner.ref_params), warm):
    np.testing.assert_array_equal(ref, w)
  # The reference survives a GRPO step, which donates the parameters' buffers.
  episode = Trajectory(task_id="t", group_index=0, seed=0, token_ids=list(range(1, 17)),
                       loss_mask=[0] * 8 + [1] * 8, rollout_logprobs=[0.0] * 8 + [-1.0] * 8,
                       prompt_length=8, finish_reason="answer", advantage=1.0)
  run.learner.train_step(build_train_batch([episode] * 2, config=run.batching))
  for ref, w in zip(_leaves(run.learner.ref_params), warm):
    np.testing.assert_array_equal(ref, w)

  restarted = grpo_loop.setup_run(config)  # a new process would start from the initial model
  experiment.restore_reference(config, restarted)
  for ref, w in zip(_leaves(restarted.learner.ref_params), warm):
    np.testing.assert_array_equal(ref, w)
  for engine in (run.engine, restarted.engine):
    if hasattr(engine, "close"):
      engine.close()


def test_missing_reference_is_a_clear_error(tmp_path):
  config = _config(tmp_path)
  run = grpo_loop.setup_run(config)
  with pytest.raises(FileNotFoundError, match="KL reference"):
    experiment.restore_reference(config, run)
  if hasattr(run.engine, "close"):
    run.engine.close()


def _graded(correct):
  return Trajectory(task_id="t", group_index=0, seed=0, token_ids=[1, 2], loss_mask=[0, 1],
                    rollout_logprobs=[0.0, 0.0], prompt_length=1, finish_reason="answer",
                    correct=correct)


def test_demo_filter_keeps_solved_episodes_only():
  demos = [_graded(True), _graded(False), _graded(None), _graded(True)]
  assert warm_start.keep_demonstrations(demos, "none") == demos
  assert warm_start.keep_demonstrations(demos, "correct") == [demos[0], demos[3]]
  with pytest.raises(ValueError, match="unknown demo filter"):
    warm_start.keep_demonstrations(demos, "best")


def test_correct_demonstrations_are_collected_until_enough_pass(tmp_path):
  config = _config(tmp_path)
  config.sft.demo_filter = "correct"
  config.sft.num_demos = 6
  run = grpo_loop.setup_run(config)
  demos = experiment.collect_demonstrations(config, run)
  assert demos and len(demos) <= 6 and all(d.correct for d in demos)
  rerun = grpo_loop.setup_run(config)
  again = experiment.collect_demonstrations(config, rerun)
  assert [d.token_ids for d in again] == [d.token_ids for d in demos]  # seeded
  for engine in (run.engine, rerun.engine):
    if hasattr(engine, "close"):
      engine.close()
