"""The server pool's policy, by hand, on a fake clock: affinity, least load, health,
stale servers, metrics; and its bookkeeping under threads."""

import threading

import pytest

from orchestra_jax.rollout.http.server_pool import NoServerAvailable, ServerPool

A, B, C = "http://a", "http://b", "http://c"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def pool(*urls, **kw):
    clock = Clock()
    return ServerPool(list(urls or (A, B)), clock=clock, **kw), clock


def test_turns_of_an_episode_stay_on_its_server_and_new_ones_go_to_the_least_loaded():
    p, _ = pool(A, B, C)
    assert p.choose("ep1", load=100) == A  # all idle: the first
    assert p.choose("ep2", load=10) == B  # A carries 100
    assert p.choose("ep3", load=10) == C
    assert p.choose("ep4", load=5) == B  # B and C alike: the first in the list
    # ep1's next turn goes home although A is the most loaded
    assert p.choose("ep1", load=100) == A
    p.release(A, load=100)
    p.release(A, load=100)
    assert p.choose("ep5", load=1) == A  # A is idle again
    assert p.home_of("ep2") == B and p.home_of("nobody") is None


def test_least_loaded_counts_tokens_then_requests_then_requests_so_far():
    p, _ = pool(A, B)
    assert p.choose(None, load=30) == A
    assert p.choose(None, load=10) == B
    assert p.choose(None, load=25) == B  # B: 10 < A: 30
    p.release(B, load=10)
    p.release(B, load=25)
    p.release(A, load=30)
    # equal load and nothing in flight: A (1 request so far) before B (2)
    assert p.choose(None, load=0) == A
    p.release(A, load=0)
    assert p.choose(None, load=0) == A  # 2 each now: the first in the list
    p.release(A, load=0)
    assert p.choose(None, load=0) == B  # B: 2 so far, A: 3
    assert p.choose(None, load=0) == A  # equal tokens, B has one request in flight


def test_repeated_errors_take_a_server_out_and_rehome_its_episodes():
    p, _ = pool(A, B, max_consecutive_errors=3)
    assert p.choose("ep1") == A
    p.release(A)
    for _ in range(2):
        p.report(A, ok=False, error="boom")
    p.report(A, ok=True, latency_s=0.1)  # a success resets the count
    for _ in range(2):
        p.report(A, ok=False, error="boom")
    assert p.healthy() == [A, B]
    p.report(A, ok=False, error="connection refused")
    assert p.healthy() == [B]
    assert "3 failed calls in a row" in p.down()[A] and "connection refused" in p.down()[A]
    assert p.home_of("ep1") is None
    assert p.choose("ep1") == B and p.choose("ep2") == B
    assert p.home_of("ep1") == B


def test_a_down_server_is_checked_every_recheck_s_and_readmitted():
    p, clock = pool(A, B, recheck_s=10.0, health_interval_s=0.0)
    p.mark_down(A, "failed its /health check")
    assert p.due_for_check() == []
    clock.now += 9.9
    assert p.due_for_check() == []
    clock.now += 0.2
    assert p.due_for_check() == [A]
    assert p.due_for_check() == []  # handed out once per period
    clock.now += 10.0
    assert p.due_for_check() == [A]
    p.readmit(A)
    assert p.healthy() == [A, B] and p.down() == {}
    clock.now += 1000
    assert p.due_for_check() == []  # servers that are up: never, at interval 0


def test_servers_that_are_up_are_checked_every_health_interval_s():
    p, clock = pool(A, B, recheck_s=5.0, health_interval_s=60.0)
    clock.now += 59
    assert p.due_for_check() == []
    p.mark_down(B, "errors")
    clock.now += 5
    assert p.due_for_check() == [B, A]  # B (down) due after 5 s, A after 60 s; down first
    clock.now += 5
    assert p.due_for_check() == [B]
    p.readmit(B)
    clock.now += 59
    assert p.due_for_check() == [A]
    clock.now += 1
    assert p.due_for_check() == [B]


def test_avoid_sends_a_retry_elsewhere_and_moves_the_episode():
    p, _ = pool(A, B)
    assert p.choose("ep1") == A
    assert p.choose("ep1", avoid={A}) == B
    assert p.home_of("ep1") == B
    p.mark_down(B, "gone")
    assert p.choose("ep1", avoid={A}) == A  # nothing else is up: the avoided one


def test_with_no_server_up_requests_still_go_to_one_that_may_come_back():
    p, _ = pool(A, B)
    p.mark_down(A, "down a")
    p.mark_down(B, "down b")
    assert p.healthy() == []
    url = p.choose("ep1")
    assert url == A
    p.report(url, ok=True)  # it answered, but only its check (and the sync probe) readmits
    assert p.healthy() == []
    p.readmit(A)
    assert p.healthy() == [A]


def test_a_server_that_missed_a_weight_sync_serves_nothing_until_readmitted():
    p, _ = pool(A, B)
    p.mark_down(A, "weight sync to version 3 failed: timeout", stale=True)
    assert p.choose("ep1") == B
    p.mark_down(B, "failed its /health check")
    assert p.choose("ep2") == B  # B is out but holds the current weights; A does not
    p.report(A, ok=True)  # a late reply from A does not bring it back
    assert A not in p.healthy()
    p.mark_down(B, "still failing", stale=True)
    with pytest.raises(NoServerAvailable, match="version 3 failed.*still failing"):
        p.choose("ep3")
    p.readmit(A)
    assert p.choose("ep3") == A


def test_metrics_per_server_since_the_previous_call():
    p, _ = pool(A, B)
    p.choose("ep1", load=5)
    p.report(A, ok=True, requests=2, latency_s=1.0, tokens=30, cached_tokens=12)
    p.report(A, ok=True, requests=1, latency_s=3.0, tokens=10)
    p.report(B, ok=False, requests=4, error="500")
    m = p.take_metrics()
    assert m == {
        "0/requests": 3.0,
        "0/errors": 0.0,
        "0/tokens": 40.0,
        "0/cached_tokens": 12.0,
        "0/latency_s": 2.0,
        "0/up": 1.0,
        "0/in_flight": 1.0,
        "1/requests": 4.0,
        "1/errors": 4.0,
        "1/tokens": 0.0,
        "1/cached_tokens": 0.0,
        "1/latency_s": 0.0,
        "1/up": 1.0,
        "1/in_flight": 0.0,
    }
    p.release(A, load=5)
    p.mark_down(B, "gone")
    again = p.take_metrics()
    assert again["0/requests"] == 0 and again["0/in_flight"] == 0 and again["1/up"] == 0


def test_forget_affinity_and_the_bound_on_remembered_episodes():
    p, _ = pool(A, B, max_affinity_keys=2)
    p.choose("ep1")  # A
    p.choose("ep2")  # B
    p.choose("ep3")  # A: both carry one request, A is first
    assert p.home_of("ep1") is None  # the least recently used key went
    assert p.home_of("ep2") == B and p.home_of("ep3") is not None
    p.forget_affinity()
    assert p.home_of("ep2") is None and p.home_of("ep3") is None


def test_bad_pools_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        ServerPool([])
    with pytest.raises(ValueError, match="distinct"):
        ServerPool([A, A])
    with pytest.raises(ValueError, match="max_consecutive_errors"):
        ServerPool([A], max_consecutive_errors=0)


def test_in_flight_counts_survive_many_threads():
    p, _ = pool(A, B, C)
    n, threads = 2000, 8

    def work(t):
        for i in range(n):
            url = p.choose(f"{t}/{i % 7}", load=3)
            p.report(url, ok=True, tokens=1)
            p.release(url, load=3)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    m = p.take_metrics()
    assert sum(m[f"{i}/requests"] for i in range(3)) == n * threads
    assert sum(m[f"{i}/tokens"] for i in range(3)) == n * threads
    assert all(m[f"{i}/in_flight"] == 0 for i in range(3))


def test_the_training_loop_logs_each_servers_metrics_under_rollout_server():
    from orchestra_jax.training.loop_steps import server_metrics

    class Dispatching:
        def take_metrics(self):
            return {"0/requests": 3.0, "1/up": 0.0}

    assert server_metrics(Dispatching()) == {
        "rollout/server/0/requests": 3.0,
        "rollout/server/1/up": 0.0,
    }
    assert server_metrics(object()) == {}  # an in-process engine has none
