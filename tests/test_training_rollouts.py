"""Scoring one step's groups: rewards, advantages and every filter, by hand."""

import numpy as np
import pytest

from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.rewards.registry import make_reward
from orchestra_jax.training.rollouts import score_groups


def _traj(task, correct, cost, valid=True, answer="x"):
  return Trajectory(task_id=task, group_index=0, seed=0, token_ids=[1, 2, 3],
                    loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -1.0, -1.0], prompt_length=1,
                    finish_reason="answer", format_valid=valid, cost_usd=cost, latency_s=1.0,
                    correct=correct, final_answer=answer, preference={"accuracy": 1.0},
                    metadata={"domain": "d"})


def test_filters_and_advantages():
  trajs = [
      _traj("a", True, 0.1), _traj("a", False, 0.1, valid=False),   # signal
      _traj("b", True, 0.1), _traj("b", True, 0.2),                  # all right: std 0
      _traj("c", False, 0.1, answer=""), _traj("c", False, 0.1, answer=""),  # nobody answered
  ]
  exp = score_groups(trajs, group_size=2, reward_fn=make_reward("outcome"), adv_clip=3.0,
                     filter_reward_std=0.1, filter_invalid_format=True, filter_no_answer=True)
  np.testing.assert_array_equal(exp.rewards, [1, 0, 1, 1, 0, 0])
  # Group a: mean 0.5, sample std 0.707 -> +-0.707; the malformed episode is dropped.
  np.testing.assert_array_equal(exp.keep, [True, False, False, False, False, False])
  assert exp.advantages[0] == pytest.approx(0.5 / np.sqrt(0.5), rel=1e-5)
  assert exp.advantages[1:].tolist() == [0.0] * 5
  assert [t.advantage for t in exp.kept] == [pytest.approx(exp.advantages[0])]
  assert exp.metrics["accuracy"] == pytest.approx(0.5)
  assert exp.metrics["kept_fraction"] == pytest.approx(1 / 6)

  loose = score_groups(trajs, group_size=2, reward_fn=make_reward("outcome"), adv_clip=None,
                       filter_reward_std=0.0, filter_invalid_format=False)
  np.testing.assert_array_equal(loose.keep, [True, True, False, False, False, False])
