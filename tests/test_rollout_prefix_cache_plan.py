"""PrefixCachePlanner on its own: plans, slots and eviction, by hand."""

import numpy as np
import pytest

from orchestra_jax.rollout.jax.prefix_cache import PrefixCachePlanner, common_prefix


def ids(*tokens):
    return np.array(tokens, np.int32)


def planner(slots=4, **kw):
    kw.setdefault("min_cached_prefix", 2)
    kw.setdefault("min_cached_fraction", 0.25)
    return PrefixCachePlanner(slots, **kw)


def test_common_prefix():
    a = ids(1, 2, 3, 4)
    assert [common_prefix(a, ids(*b)) for b in ([1, 2, 3, 4, 5], [1, 2, 9], [7], [])] == [
        4,
        2,
        0,
        0,
    ]


def test_a_prompt_extending_a_parked_row_continues_it_in_place():
    p = planner()
    p.park(2, ids(5, 6, 7, 8))
    [plan] = p.plan([ids(5, 6, 7, 8, 9, 10)], live={}, busy=())
    assert (plan.source, plan.slot, plan.match, plan.reused) == (2, 2, 4, 4)
    assert 2 not in p.parked  # its row is live again
    assert p.stats["prompt_tokens_reused"] == 4 and p.stats["prompt_tokens_computed"] == 2


def test_one_token_is_always_computed():
    p = planner()
    p.park(0, ids(5, 6, 7, 8))
    [plan] = p.plan([ids(5, 6, 7, 8)], live={}, busy=())
    assert plan.match == 4 and plan.reused == 3 and plan.slot == 0


def test_a_branching_prompt_copies_into_a_free_slot_and_keeps_the_source():
    p = planner()
    p.park(1, ids(5, 6, 7, 8))
    [plan] = p.plan([ids(5, 6, 7, 3, 3)], live={}, busy=())
    assert (plan.source, plan.reused) == (1, 3) and plan.slot == 0
    assert 1 in p.parked


def test_a_group_in_one_admission_follows_its_leader():
    p = planner()
    shared = ids(*range(10, 20))
    plans = p.plan([shared, shared, shared], live={}, busy=())
    assert [q.level for q in plans] == [0, 1, 1]
    assert plans[1].leader is plans[0] and plans[2].leader is plans[0]
    assert [q.reused for q in plans] == [0, 9, 9]
    assert len({q.slot for q in plans}) == 3


def test_live_rows_are_sources_but_never_targets():
    p = planner(slots=3)
    live = {0: ids(1, 2, 3, 4, 5)}
    plans = p.plan([ids(1, 2, 3, 4, 5, 6), ids(9, 9)], live=live, busy={0})
    assert plans[0].source == 0 and plans[0].reused == 5
    assert {q.slot for q in plans} == {1, 2}


def test_short_or_small_shared_prefixes_are_not_reused():
    p = planner(min_cached_prefix=3, min_cached_fraction=0.5)
    p.park(0, ids(1, 2, 3, 4))
    small, short = p.plan([ids(1, 2, 3, 7, 7, 7, 7), ids(1, 2, 8)], live={}, busy=())
    assert small.source is None and small.reused == 0  # 3 of 7 < half
    assert short.source is None and short.leader is None  # 2 < 3 tokens


def test_eviction_takes_the_least_recently_used_row_nobody_copies_from():
    p = planner(slots=3)
    p.park(0, ids(1, 1, 1, 1))
    p.park(1, ids(2, 2, 2, 2))
    p.park(2, ids(3, 3, 3, 3))
    # Copies row 0 (the oldest), so row 0 is kept and row 1 is the victim.
    [plan] = p.plan([ids(1, 1, 1, 9)], live={}, busy=())
    assert plan.source == 0 and plan.slot == 1
    assert set(p.parked) == {0, 2}


def test_flush_truncate_and_disabled():
    p = planner()
    p.park(0, ids(1, 2, 3, 4))
    p.park(1, ids(5, 6))
    p.truncate(3)
    assert p.parked[0].ids.tolist() == [1, 2, 3]
    assert p.flush() == 2 and not p.parked and p.stats["parked_invalidated"] == 2
    off = planner(enabled=False)
    off.park(0, ids(1, 2, 3, 4))
    assert not off.parked
    plans = off.plan([ids(1, 2, 3, 4), ids(1, 2, 3, 4)], live={}, busy=())
    assert [q.reused for q in plans] == [0, 0] and [q.level for q in plans] == [0, 0]


def test_more_prompts_than_slots_is_an_error():
    with pytest.raises(ValueError, match="no free slot"):
        planner(slots=1).plan([ids(1), ids(2)], live={}, busy=())
