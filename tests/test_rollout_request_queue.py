"""FairQueue: round robin over submitters, a priority lane, removal."""

from orchestra_jax.rollout.jax.request_queue import FairQueue


def test_round_robin_over_groups():
    q = FairQueue()
    q.push("big", [f"b{i}" for i in range(5)])
    q.push("small", ["s0", "s1"])
    q.push("other", ["o0"])
    assert q.pop(4) == ["b0", "s0", "o0", "b1"]
    assert q.pop(10) == ["s1", "b2", "b3", "b4"]
    assert len(q) == 0 and q.pop(3) == []


def test_a_late_small_request_is_not_starved_by_a_huge_batch():
    q = FairQueue()
    q.push(1, range(100_000))
    assert q.pop(2) == [0, 1]
    q.push(2, ["late"])
    assert q.pop(2) == [2, "late"]  # served within one turn of the rotation


def test_priority_lane_and_removal():
    q = FairQueue()
    q.push("a", [1, 2, 3])
    q.push_front(["resume"])
    assert q.peek_front() == "resume" and q.front_count == 1
    assert q.pop(1, front_only=True) == ["resume"]
    assert q.pop(1, front_only=True) == []
    assert q.remove_if(lambda x: x == 2) == [2]
    assert list(q) == [1, 3] and q.clear() == [1, 3] and len(q) == 0
