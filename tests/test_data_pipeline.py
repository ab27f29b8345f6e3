"""Grain task pipelines: determinism, mixing, sharding, exact resume."""

import collections
import itertools
import json

import pytest

from orchestra_jax.data.pipeline import (
    WeightedSource,
    global_positions,
    task_batches,
    task_iterator,
)
from orchestra_jax.tasks import Task


def make_tasks(prefix, n):
    return [
        Task(id=f"{prefix}{i}", question=f"q{i}", answer=str(i), domain=prefix) for i in range(n)
    ]


def ids(batches):
    return [[t.id for t in batch] for batch in batches]


def take(iterator, n):
    return ids(itertools.islice(iterator, n))


SOURCES = [
    WeightedSource("math", make_tasks("m", 30), 3.0),
    WeightedSource("qa", make_tasks("q", 20), 1.0),
]


def test_batches_are_lists_of_task_objects():
    batch = next(task_iterator(SOURCES, tasks_per_step=4, seed=0, shard_index=0, shard_count=1))
    assert isinstance(batch, list) and len(batch) == 4
    assert all(isinstance(t, Task) for t in batch)


def test_same_seed_same_order_other_seed_differs():
    def run(seed):
        return take(
            task_iterator(SOURCES, tasks_per_step=4, seed=seed, shard_index=0, shard_count=1), 20
        )

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_each_epoch_is_a_new_permutation_of_the_source():
    tasks = make_tasks("t", 12)
    it = task_iterator(
        [WeightedSource("t", tasks)], tasks_per_step=4, seed=5, shard_index=0, shard_count=1
    )
    epochs = [sum(take(it, 3), []) for _ in range(2)]  # 3 batches of 4 = one epoch
    for epoch in epochs:
        assert sorted(epoch) == sorted(t.id for t in tasks)
    assert epochs[0] != epochs[1]


def test_mixing_follows_the_weights_exactly():
    batches = take(
        task_iterator(SOURCES, tasks_per_step=8, seed=0, shard_index=0, shard_count=1), 25
    )
    counts = collections.Counter(task_id[0] for batch in batches for task_id in batch)
    # Proportional interleave: 3 of every 4 tasks come from "math".
    assert counts == {"m": 150, "q": 50}


def test_finite_epochs_end_when_the_first_source_runs_out():
    dataset = task_batches(
        SOURCES, tasks_per_step=4, seed=0, num_epochs=2, shard_index=0, shard_count=1
    )
    batches = ids(dataset)
    # math has 60 tasks over 2 epochs at share 3/4 -> 80 mixed tasks -> 20 batches.
    assert len(batches) == 20
    math_ids = [i for b in batches for i in b if i.startswith("m")]
    assert collections.Counter(math_ids) == {f"m{i}": 2 for i in range(30)}


def test_hosts_split_the_single_host_steps():
    """On H hosts, step s's tasks are exactly a single host's step s (host h at positions
    h, h + H, …), whatever H; the iterators' states agree."""
    tasks = make_tasks("t", 24)
    single = task_iterator([WeightedSource("t", tasks)], tasks_per_step=6, seed=0)
    want = take(single, 5)  # past an epoch: 30 of 24 tasks
    for hosts in (2, 3):
        iterators = [
            task_iterator(
                [WeightedSource("t", tasks)],
                tasks_per_step=6,
                seed=0,
                shard_index=h,
                shard_count=hosts,
            )
            for h in range(hosts)
        ]
        per_host = [take(it, 5) for it in iterators]
        for step, batch in enumerate(want):
            got = [None] * 6
            for h in range(hosts):
                for task, position in zip(per_host[h][step], global_positions(h, hosts, 6)):
                    got[position] = task
            assert got == batch
        assert len({str(it.get_state()) for it in iterators}) == 1
    with pytest.raises(ValueError, match="not a multiple of the 4 hosts"):
        task_iterator(SOURCES, tasks_per_step=6, seed=0, shard_index=0, shard_count=4)


def test_default_shard_is_this_process():
    a = take(task_iterator(SOURCES, tasks_per_step=4, seed=0), 5)
    b = take(task_iterator(SOURCES, tasks_per_step=4, seed=0, shard_index=0, shard_count=1), 5)
    assert a == b


def test_iterator_state_resumes_exactly():
    def fresh():
        return task_iterator(SOURCES, tasks_per_step=5, seed=11, shard_index=0, shard_count=1)

    reference = take(fresh(), 40)
    it = fresh()
    take(it, 17)
    state = json.loads(json.dumps(it.get_state()))  # survives a JSON checkpoint
    resumed = fresh()
    resumed.set_state(state)
    assert take(resumed, 23) == reference[17:]


def three_domains(sizes=(30, 30, 30)):
    """One source whose tasks come in runs by domain (the order strata must not keep)."""
    tasks = []
    for domain, n in zip("abc", sizes):
        tasks += [
            Task(id=f"{domain}{i}", question="q", answer="a", domain=domain) for i in range(n)
        ]
    return [WeightedSource("mixed", tasks)]


def domains(batch_ids):
    return [sorted(task_id[0] for task_id in batch) for batch in batch_ids]


def test_stratified_steps_hold_every_domain_in_proportion():
    batches = take(
        task_iterator(
            three_domains(),
            tasks_per_step=3,
            seed=0,
            shard_index=0,
            shard_count=1,
            stratify_by="domain",
        ),
        40,
    )
    assert domains(batches) == [["a", "b", "c"]] * 40
    # Unstratified, chance composes some steps of fewer domains (the test's premise).
    plain = take(
        task_iterator(three_domains(), tasks_per_step=3, seed=0, shard_index=0, shard_count=1), 40
    )
    assert any(d != ["a", "b", "c"] for d in domains(plain))


def test_stratified_mixture_keeps_each_stratum_share_and_covers_its_epoch():
    # Domain "a" is half the source: half of every 4 consecutive tasks. 20 steps
    # are one epoch of every stratum: each task exactly once.
    batches = take(
        task_iterator(
            three_domains((40, 20, 20)),
            tasks_per_step=4,
            seed=3,
            shard_index=0,
            shard_count=1,
            stratify_by="domain",
        ),
        20,
    )
    assert domains(batches) == [["a", "a", "b", "c"]] * 20
    served = sorted(i for b in batches for i in b)
    assert served == sorted(t.id for t in three_domains((40, 20, 20))[0].tasks)


def test_stratified_iterator_resumes_exactly_and_depends_on_the_seed():
    def fresh(seed=0):
        return task_iterator(
            three_domains(),
            tasks_per_step=4,
            seed=seed,
            shard_index=0,
            shard_count=1,
            stratify_by="domain",
        )

    reference = take(fresh(), 30)
    it = fresh()
    take(it, 11)
    resumed = fresh()
    resumed.set_state(json.loads(json.dumps(it.get_state())))
    assert take(resumed, 19) == reference[11:]
    assert take(fresh(1), 30) != reference


def test_stratum_weights_scale_a_domains_share_of_every_step():
    # Three equal domains, "c" weighted 2: of every 4 consecutive tasks, 2 are "c".
    batches = take(
        task_iterator(
            three_domains(),
            tasks_per_step=4,
            seed=0,
            shard_index=0,
            shard_count=1,
            stratify_by="domain",
            stratum_weights={"c": 2},
        ),
        15,
    )
    assert domains(batches) == [["a", "b", "c", "c"]] * 15


def test_stratum_weights_reject_unknown_values_and_need_stratify_by():
    with pytest.raises(ValueError, match=r"\['d'\]: no task has that domain"):
        task_batches(
            three_domains(),
            tasks_per_step=3,
            seed=0,
            shard_index=0,
            shard_count=1,
            stratify_by="domain",
            stratum_weights={"d": 2},
        )
    with pytest.raises(ValueError, match="must be > 0"):
        task_batches(
            three_domains(),
            tasks_per_step=3,
            seed=0,
            shard_index=0,
            shard_count=1,
            stratify_by="domain",
            stratum_weights={"a": 0},
        )
    with pytest.raises(ValueError, match="needs stratify_by"):
        task_batches(
            three_domains(),
            tasks_per_step=3,
            seed=0,
            shard_index=0,
            shard_count=1,
            stratum_weights={"a": 2},
        )


def test_stratify_by_must_name_a_task_field():
    with pytest.raises(ValueError, match="stratify_by"):
        task_batches(
            three_domains(),
            tasks_per_step=3,
            seed=0,
            shard_index=0,
            shard_count=1,
            stratify_by="colour",
        )


def test_bad_configurations_raise_clearly():
    with pytest.raises(ValueError, match="at least one"):
        task_batches([], tasks_per_step=1, seed=0)
    with pytest.raises(ValueError, match="weight"):
        task_batches([WeightedSource("a", make_tasks("a", 3), 0.0)], tasks_per_step=1, seed=0)
    with pytest.raises(ValueError, match="no tasks"):
        task_batches([WeightedSource("a", [])], tasks_per_step=1, seed=0)
    with pytest.raises(ValueError, match="unique"):
        task_batches([WeightedSource("a", make_tasks("a", 3))] * 2, tasks_per_step=1, seed=0)
    with pytest.raises(ValueError, match="not a multiple of the 4 hosts"):
        task_batches(SOURCES, tasks_per_step=2, seed=0, shard_index=3, shard_count=4)
    with pytest.raises(ValueError, match="both"):
        task_batches(SOURCES, tasks_per_step=1, seed=0, shard_index=0)
    with pytest.raises(ValueError, match="tasks_per_step"):
        task_batches(SOURCES, tasks_per_step=0, seed=0)


def test_load_sources_from_config_specs(tmp_path):
    from orchestra_jax.data.sources import load_sources

    path = tmp_path / "frames.jsonl"
    path.write_text(
        "\n".join(json.dumps({"id": str(i), "question": "q", "answer": "a"}) for i in range(6))
        + "\nnot json\n"
    )
    specs = [
        {"kind": "frames", "path": str(path), "weight": 2, "name": "frames-small"},
        {"kind": "jsonl", "path": str(path), "fields": {"domain": "other"}},
    ]
    sources, reports = load_sources(specs)
    assert [(s.name, s.weight, len(s.tasks)) for s in sources] == [
        ("frames-small", 2.0, 6),
        ("jsonl", 1.0, 6),
    ]
    assert [r.malformed for r in reports] == [1, 1]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("oops\n")
    with pytest.raises(ValueError, match="produced no tasks"):
        load_sources([{"kind": "frames", "path": str(empty)}])
    with pytest.raises(ValueError, match="no 'kind'"):
        load_sources([{"path": str(path)}])
