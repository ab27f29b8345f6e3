"""Held-out splits of task files: training and evaluation never share a question."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.configs import grpo_hle
from orchestra_jax.config_section import ConfigError
from orchestra_jax.data import splits
from orchestra_jax.data.config import DataConfig
from orchestra_jax.tasks import Task
from orchestra_jax.training import builders
from orchestra_jax.training.experiment_config import validate


def tasks(n, prefix="q"):
    return [Task(f"{prefix}{i}", f"Question number {i}?", f"answer {i}") for i in range(n)]


def test_hash_split_is_seeded_by_id_and_stable_as_a_file_grows():
    train, heldout = splits.hash_split(tasks(400), 0.25, seed=0)
    assert len(train) + len(heldout) == 400 and 70 <= len(heldout) <= 130
    assert splits.hash_split(tasks(400), 0.25, seed=0) == (train, heldout)
    other = splits.hash_split(tasks(400), 0.25, seed=1)[1]
    assert {t.id for t in other} != {t.id for t in heldout}
    grown_train, grown_heldout = splits.hash_split(tasks(800), 0.25, seed=0)
    assert {t.id for t in heldout} <= {t.id for t in grown_heldout}
    assert {t.id for t in train} <= {t.id for t in grown_train}
    # u(seed, id) is the first 8 bytes of sha256("seed/id") over 2**64
    assert (
        splits.heldout_share("q0", 0)
        == int.from_bytes(__import__("hashlib").sha256(b"0/q0").digest()[:8], "big") / 2**64
    )
    assert (
        splits.hash_split(tasks(10), 0.0, 0)[1] == []
        and splits.hash_split(tasks(10), 1.0, 0)[0] == []
    )


@settings(max_examples=60, deadline=None)
@given(
    questions=st.lists(st.sampled_from(["a?", "b?", "A?", " a ?", "c?", "d?"]), max_size=30),
    fraction=st.floats(0, 1),
    seed=st.integers(0, 5),
)
def test_a_repeated_question_never_lands_on_both_sides(questions, fraction, seed):
    rows = [Task(f"id{i}", q, "x") for i, q in enumerate(questions)]
    train, heldout = splits.hash_split(rows, fraction, seed)
    assert not splits.shared_questions(heldout, train)
    assert {t.id for t in train}.isdisjoint({t.id for t in heldout})


def test_a_task_and_the_tasks_derived_from_it_share_a_split():
    assert splits.family_id("tau2/school/school-001-0-evolved") == "tau2/school/school-001-0"
    assert splits.family_id("a-evolved-evolved") == "a" and splits.family_id("a") == "a"
    assert splits.family_id("-evolved") == "-evolved"  # nothing to derive from
    assert splits.family_id("evolved-a") == "evolved-a"
    rows = []
    for i in range(100):
        base = f"dom/t-{i:03d}-0"
        rows += [Task(base, f"Q{i}?", "x"), Task(f"{base}-evolved", f"Harder Q{i}?", "x")]
        rows.append(Task(f"{base}-evolved-evolved", f"Hardest Q{i}?", "x"))
    for seed in range(4):
        train, heldout = splits.hash_split(rows, 0.3, seed)
        sides = {}
        for side, part in (("train", train), ("heldout", heldout)):
            for task in part:
                sides.setdefault(splits.family_id(task.id), set()).add(side)
        assert all(len(s) == 1 for s in sides.values()) and len(sides) == 100
        assert 10 <= len(heldout) // 3 <= 50 and len(heldout) % 3 == 0


def test_the_toolscale_demo_holds_out_a_task_with_its_evolved_twin():
    from orchestra_jax.data.readers import read_tasks

    config = grpo_hle.get_config("toolscale_demo")
    tasks, _ = read_tasks("toolscale", config.data.paths.toolscale)
    assert sum(t.id.endswith("-evolved") for t in tasks) == 2
    for seed in range(20):
        train, heldout = splits.hash_split(tasks, config.data.eval_fraction, seed)
        held = {t.id for t in heldout}
        for task in tasks:
            assert (task.id in held) == (splits.family_id(task.id) in held), (seed, task.id)
    train, heldout = splits.hash_split(tasks, config.data.eval_fraction, config.data.split_seed)
    assert train and heldout and not splits.shared_questions(heldout, train)


def test_split_files_with_a_task_and_its_derived_task_on_two_sides_are_refused():
    train = [Task("t-1", "Book a room.", "x"), Task("t-2-evolved", "Book two rooms.", "x")]
    heldout = [Task("t-2", "Book a desk.", "x")]
    with pytest.raises(splits.SplitError, match=r"shares 1 question\(s\) with training"):
        splits.check_disjoint(train, heldout, "the files")
    splits.check_disjoint(train[:1], heldout, "the files")


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def load_split(config, split):
    """`splits.load_split` on a whole config's data section (unchecked, so that its own
    errors are what the tests see)."""
    return splits.load_split(DataConfig.unchecked(config.data), split, config.eval.num_tasks)


def frames_config(tmp_path, rows, **data):
    config = grpo_hle.get_config("micro")
    config.data.sources = "frames"
    config.data.paths.frames = write_rows(tmp_path / "frames.jsonl", rows)
    for key, value in data.items():
        config.data[key] = value
    return config


ROWS = [{"id": f"wiki____{i}", "question": f"Q{i}?", "answer": f"A{i}"} for i in range(60)]


def test_load_split_by_fraction_never_shares_a_question(tmp_path):
    config = frames_config(tmp_path, ROWS + [{"id": "dup", "question": "Q7?", "answer": "A7"}])
    config.data.eval_fraction = 0.3
    train, train_reports = load_split(config, "train")
    heldout, reports = load_split(config, "heldout")
    train_tasks, heldout_tasks = train[0].tasks, heldout[0].tasks
    assert heldout_tasks and train_tasks
    assert not splits.shared_questions(train_tasks, heldout_tasks)
    assert reports[0]["rows"] == 61 and reports[0]["split_tasks"] == len(heldout_tasks)
    assert train_reports[0]["split_tasks"] == len(train_tasks)
    assert reports[0]["source"] == "frames" and reports[0]["source_file"].endswith("frames.jsonl")


def test_an_eval_file_that_shares_a_question_with_training_is_refused(tmp_path):
    config = frames_config(tmp_path, ROWS[:40])
    eval_rows = [{"id": "new-1", "question": "  q3? ", "answer": "A3"}] + ROWS[40:]
    config.data.eval_paths.frames = write_rows(tmp_path / "frames_test.jsonl", eval_rows)
    with pytest.raises(splits.SplitError) as e:
        load_split(config, "heldout")
    assert "shares 1 question(s) with training, e.g. ['new-1']" in str(e.value)
    assert "\n" not in str(e.value) and "data.eval_paths.frames" in str(e.value)
    config.data.eval_paths.frames = write_rows(tmp_path / "frames_test.jsonl", ROWS[40:])
    heldout, _ = load_split(config, "heldout")
    train, _ = load_split(config, "train")
    assert [t.id for t in heldout[0].tasks] == [r["id"] for r in ROWS[40:]]
    assert len(train[0].tasks) == 40


def test_config_checks_name_missing_and_overlapping_splits(tmp_path):
    config = grpo_hle.get_config("live_tiny")  # live experts: real data is allowed
    config.tools.enabled = "enhance_reasoning,answer"  # no search index to build here
    config.data.paths.frames = write_rows(tmp_path / "frames.jsonl", ROWS)
    config.data.eval_fraction = 0.0
    with pytest.raises(ConfigError, match="'frames' has no held-out split for evaluation"):
        validate(config)
    config.data.eval_paths.frames = config.data.paths.frames
    with pytest.raises(ConfigError) as e:
        validate(config)
    assert "data.eval_paths.frames is data.paths.frames: the held-out split would overlap" in str(
        e.value
    )
    config.data.eval_paths.frames = ""  # "": no eval file
    config.data.eval_fraction = 1.5
    with pytest.raises(ConfigError, match=r"data.eval_fraction must be in \[0, 1\]"):
        validate(config)
    config.data.eval_fraction = 0.2
    validate(config)
    assert builders.build_task_sources(config, "train")[0][0].name == "frames"


def test_a_whitelist_restricts_the_listed_questions_searches(tmp_path):
    config = frames_config(tmp_path, ROWS[:4], eval_fraction=0.5)
    path = tmp_path / "whitelist.json"
    path.write_text(json.dumps({"wiki____0": ["d1", 2], "wiki____3": []}))
    config.data.search_whitelist = str(path)
    every = {
        t.id: t for split in ("train", "heldout") for t in load_split(config, split)[0][0].tasks
    }
    assert every["wiki____0"].metadata["allowed_doc_ids"] == ["d1", "2"]
    assert every["wiki____3"].metadata["allowed_doc_ids"] == []
    assert "allowed_doc_ids" not in every["wiki____1"].metadata
    path.write_text(json.dumps({"wiki____0": "d1"}))
    with pytest.raises(ValueError, match="question id"):
        load_split(config, "train")


def test_every_file_reader_has_its_path_keys_in_every_variant():
    """So that --config.data.paths.<source>=... works on a locked config."""
    from orchestra_jax.data.readers import READERS

    assert set(grpo_hle.FILE_SOURCES) == set(READERS.names()) - {"synthetic"}
    for variant in grpo_hle.VARIANTS:
        config = grpo_hle.get_config(variant)
        assert set(grpo_hle.FILE_SOURCES) <= set(config.data.paths)
        assert set(grpo_hle.FILE_SOURCES) <= set(config.data.eval_paths)
