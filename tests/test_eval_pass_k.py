"""pass^k: hand-computed cases, and the same numbers as τ²-bench's own function."""

import itertools

import pytest

from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.eval.pass_k import pass_hat_k, pass_k_by_domain, pass_k_task_counts


def test_pass_hat_k_by_hand():
    assert pass_hat_k(4, 4, 4) == 1.0
    assert pass_hat_k(4, 3, 4) == 0.0
    assert pass_hat_k(4, 2, 1) == 0.5
    assert pass_hat_k(4, 3, 2) == pytest.approx(3 / 6)  # C(3,2) / C(4,2)
    assert pass_hat_k(5, 0, 1) == 0.0
    for bad in [(2, 3, 1), (2, 1, 3), (2, 1, 0)]:
        with pytest.raises(ValueError):
            pass_hat_k(*bad)


def test_pass_hat_k_is_the_chance_that_k_drawn_trials_all_succeed():
    outcomes = [True, True, False, True, False]
    for k in range(1, 6):
        draws = list(itertools.combinations(outcomes, k))
        assert pass_hat_k(5, 3, k) == pytest.approx(sum(all(d) for d in draws) / len(draws))


def test_pass_hat_k_matches_tau2(tau2_data):
    from orchestra_jax.envs.tau2.setup import import_tau2

    import_tau2(tau2_data)
    from tau2.metrics.agent_metrics import pass_hat_k as tau2_pass_hat_k

    for n in range(1, 6):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_hat_k(n, c, k) == tau2_pass_hat_k(n, c, k)


def _traj(task_id, correct, domain):
    return Trajectory(
        task_id=task_id,
        group_index=0,
        seed=0,
        token_ids=[1],
        loss_mask=[0],
        rollout_logprobs=[0.0],
        prompt_length=1,
        correct=correct,
        metadata={"domain": domain},
    )


def test_pass_k_by_domain_averages_tasks_per_domain():
    trajs = [_traj("a", c, "retail") for c in (True, True, True)]
    trajs += [_traj("b", c, "retail") for c in (True, False, True)]
    trajs += [_traj("c", c, "airline") for c in (False, False, True)]
    table = pass_k_by_domain(trajs)
    assert table["retail"] == pytest.approx(
        {"pass^1": (1 + 2 / 3) / 2, "pass^2": (1 + 1 / 3) / 2, "pass^3": 0.5}
    )
    assert table["airline"] == pytest.approx({"pass^1": 1 / 3, "pass^2": 0.0, "pass^3": 0.0})
    assert table["all"]["pass^1"] == pytest.approx((1 + 2 / 3 + 1 / 3) / 3)
    with pytest.raises(ValueError, match="not graded"):
        pass_k_by_domain([_traj("d", None, "x")])


def test_each_task_counts_towards_pass_k_up_to_its_own_trials():
    trajs = [_traj("a", c, "retail") for c in (True, True, True, True)]  # 4 trials
    trajs += [_traj("b", c, "retail") for c in (True, False, True)]  # lost one: 3
    trajs += [_traj("c", c, "airline") for c in (True, True)]  # lost two: 2
    table = pass_k_by_domain(trajs)
    assert table["retail"] == pytest.approx(
        {"pass^1": (1 + 2 / 3) / 2, "pass^2": (1 + 1 / 3) / 2, "pass^3": 0.5, "pass^4": 1.0}
    )
    assert table["airline"] == pytest.approx({"pass^1": 1.0, "pass^2": 1.0})
    assert table["all"] == pytest.approx(
        {
            "pass^1": (1 + 2 / 3 + 1) / 3,
            "pass^2": (1 + 1 / 3 + 1) / 3,
            "pass^3": (1 + 0) / 2,  # a and b: c has 2 trials
            "pass^4": 1.0,  # a alone
        }
    )
    assert pass_k_task_counts(trajs) == {
        "airline": {"pass^1": 1, "pass^2": 1},
        "all": {"pass^1": 3, "pass^2": 3, "pass^3": 2, "pass^4": 1},
        "retail": {"pass^1": 2, "pass^2": 2, "pass^3": 2, "pass^4": 1},
    }
    assert pass_k_by_domain([]) == {} and pass_k_task_counts([]) == {}
