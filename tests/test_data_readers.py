"""Task readers: each format on small files, malformed rows counted, never raised."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestra_jax.data import readers
from orchestra_jax.data.readers import FieldMap, read_tasks
from orchestra_jax.data.rows import MAX_REPORTED_ERRORS, ReadReport
from orchestra_jax.tasks import Task


def write_jsonl(path, rows):
    """Rows may be dicts (dumped) or raw strings (written as-is, to make bad lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tau2_row(task_id, structured=True):
    instructions = (
        {
            "domain": "airline",
            "reason_for_call": "Change my flight",
            "known_info": "Booking ABC123",
            "unknown_info": None,
            "task_instructions": "Insist on a refund.",
        }
        if structured
        else "You want to cancel reservation XYZ."
    )
    return {
        "id": task_id,
        "description": {"purpose": "test", "relevant_policies": None, "notes": None},
        "user_scenario": {"persona": "Calm.", "instructions": instructions},
        "initial_state": None,
        "evaluation_criteria": {
            "actions": [{"action_id": "a1", "name": "cancel", "arguments": {"id": "XYZ"}}],
            "communicate_info": ["refund issued"],
            "nl_assertions": None,
        },
    }


def check_report(report: ReadReport, *, tasks, malformed=0, skipped=0):
    assert (report.tasks, report.malformed, report.skipped) == (tasks, malformed, skipped)
    assert report.rows == tasks + malformed + skipped
    assert len(report.errors) == min(malformed, MAX_REPORTED_ERRORS)


def test_toolscale_jsonl_structured_and_free_text(tmp_path):
    """ToolScale rows are tau2 tasks: played and graded by the tau2 environment, the
    user's scenario kept for it (hidden from the policy's question)."""
    bad_no_criteria = {k: v for k, v in tau2_row("t3").items() if k != "evaluation_criteria"}
    path = write_jsonl(
        tmp_path / "toolscale.jsonl",
        [tau2_row("t1"), tau2_row("t2", structured=False), bad_no_criteria, "{not json", "[1, 2]"],
    )
    tasks, report = read_tasks("toolscale", path)
    # t2's free-text instructions name no domain: malformed unless the reader is told one.
    check_report(report, tasks=1, malformed=4)
    [first] = tasks
    assert isinstance(first, Task) and first.answer_type == "environment"
    assert first.id == "tau2/airline/t1" and first.domain == "airline"
    assert first.metadata["env"] == "tau2" and first.metadata["source"] == "toolscale"
    assert first.metadata["tau2_task"] == {k: v for k, v in tau2_row("t1").items() if v is not None}
    assert "Change my flight" not in first.question  # the scenario is the user's secret
    assert json.loads(first.answer) == tau2_row("t1")["evaluation_criteria"]
    assert "domain" in report.errors[0] and "toolscale.jsonl:2" in report.errors[0]
    assert "evaluation_criteria" in report.errors[1] and "toolscale.jsonl:3" in report.errors[1]
    tasks, report = read_tasks("tau2", path, domain="airline")
    check_report(report, tasks=2, malformed=3)
    assert tasks[1].metadata["tau2_task"]["user_scenario"]["instructions"].startswith("You want")
    assert tasks[1].metadata["source"] == "tau2"


def test_toolscale_parquet_with_json_encoded_nested_fields(tmp_path):
    # Some exports store nested objects as JSON strings; both layouts read the same.
    rows = [tau2_row("p1"), tau2_row("p2")]
    encoded = [{k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()} for r in rows]
    path = tmp_path / "toolscale.parquet"
    pq.write_table(pa.Table.from_pylist(encoded), path)
    tasks, report = read_tasks("toolscale", path)
    check_report(report, tasks=2)
    assert [t.id for t in tasks] == ["tau2/airline/p1", "tau2/airline/p2"]
    assert json.loads(tasks[1].answer) == rows[1]["evaluation_criteria"]
    assert tasks[1].metadata["tau2_task"]["user_scenario"] == rows[1]["user_scenario"]


def test_tau2_domain_folder_and_its_splits(tmp_path):
    folder = tmp_path / "retail"
    folder.mkdir()
    rows = [tau2_row(str(i), structured=False) for i in range(4)]
    (folder / "tasks.json").write_text(json.dumps(rows))
    (folder / "split_tasks.json").write_text(json.dumps({"train": ["0", "2"], "test": ["3"]}))
    tasks, report = read_tasks("tau2", folder)
    check_report(report, tasks=4)
    assert [t.domain for t in tasks] == ["retail"] * 4  # the folder names the domain
    tasks, report = read_tasks("tau2", folder, split="train")
    check_report(report, tasks=2, skipped=2)
    assert [t.id for t in tasks] == ["tau2/retail/0", "tau2/retail/2"]
    with pytest.raises(ValueError, match="'dev' not in"):
        read_tasks("tau2", folder, split="dev")
    with pytest.raises(ValueError, match="needs a τ² domain folder"):
        read_tasks("tau2", folder / "tasks.json", split="train")
    with pytest.raises(FileNotFoundError, match="no tasks.json"):
        read_tasks("tau2", tmp_path)


def test_generalthought_reference_answer_and_fallbacks(tmp_path):
    path = write_jsonl(
        tmp_path / "gt.jsonl",
        [
            {"question_id": 7, "question": "2+2?", "reference_answer": "4", "task": "math"},
            {"question": "Capital of France?", "answer": "Paris"},
            {
                "question_id": 9,
                "question": "no gold",
                "reference_answer": None,
                "model_answer": "guess",
            },
            {"question_id": 10, "question": ["not", "text"], "reference_answer": "x"},
            {"question_id": 11, "reference_answer": "no question"},
        ],
    )
    tasks, report = read_tasks("generalthought", path)
    check_report(report, tasks=2, malformed=2, skipped=1)
    assert tasks[0].id == "generalthought/7" and tasks[0].answer == "4"
    assert tasks[0].metadata["task"] == "math" and tasks[0].answer_type == "judge"
    assert tasks[1].answer == "Paris" and tasks[1].id == "generalthought/gt.jsonl:2"
    with_model, report = read_tasks(
        "generalthought", path, answer_type="exact", use_model_answer=True
    )
    check_report(report, tasks=3, malformed=2)
    assert {t.answer_type for t in with_model} == {"exact"}
    assert (
        with_model[2].answer == "guess" and with_model[2].metadata["answer_from"] == "model_answer"
    )


def test_hle_types_images_and_bad_answer_type(tmp_path):
    path = write_jsonl(
        tmp_path / "hle.jsonl",
        [
            {
                "id": "h1",
                "question": "Q1",
                "answer": "42",
                "answer_type": "exactMatch",
                "category": "Math",
            },
            {
                "id": "h2",
                "question": "Q2",
                "answer": "B",
                "answer_type": "multipleChoice",
                "category": "Bio",
            },
            {
                "id": "h3",
                "question": "Q3",
                "answer": "x",
                "answer_type": "exactMatch",
                "image": "data:...",
            },
            {"id": "h4", "question": "Q4", "answer": "x", "answer_type": "freeform"},
        ],
    )
    tasks, report = read_tasks("hle", path)
    check_report(report, tasks=2, malformed=1, skipped=1)
    # Graded as the reference grades HLE: exact match, then the LLM judge.
    assert [(t.id, t.answer_type, t.domain) for t in tasks] == [
        ("h1", "judge", "hle"),
        ("h2", "judge", "hle"),
    ]
    exact, _ = read_tasks("hle", path, answer_type="exact")
    assert {t.answer_type for t in exact} == {"exact"}
    assert tasks[1].metadata == {
        "source": "hle",
        "hle_answer_type": "multipleChoice",
        "category": "Bio",
        "raw_subject": None,
    }
    with_images, report = read_tasks("hle", path, skip_images=False)
    check_report(report, tasks=3, malformed=1)


def test_frames_reference_file(shared_file):
    tasks, report = read_tasks("frames", shared_file("reference/frames.jsonl"))
    check_report(report, tasks=824)
    assert tasks[0].id == "wiki____0" and tasks[0].answer == "Jane Ballou"
    assert {t.domain for t in tasks} == {"frames"}
    assert len({t.id for t in tasks}) == 824


def test_generic_jsonl_field_mapping(tmp_path):
    path = write_jsonl(
        tmp_path / "custom.jsonl",
        [
            {"uid": "u1", "prompt": "1+1", "target": 2, "kind": "numeric", "extra": "kept"},
            {"uid": "u2", "prompt": "hi", "target": "hello"},
            {"uid": "u3", "prompt": "p", "target": "t", "kind": "fuzzy"},
            {"uid": "u4", "target": "no prompt"},
        ],
    )
    fields = {
        "id": "uid",
        "question": "prompt",
        "answer": "target",
        "answer_type_field": "kind",
        "domain": "custom",
    }
    tasks, report = read_tasks("jsonl", path, fields=fields)
    check_report(report, tasks=2, malformed=2)
    assert tasks[0] == Task("u1", "1+1", "2", "numeric", "custom", {"extra": "kept"})
    assert tasks[1].answer_type == "exact"
    same, _ = read_tasks("jsonl", path, fields=FieldMap(**fields))
    assert same == tasks


def test_json_list_file_and_limit(tmp_path):
    path = tmp_path / "frames.json"
    path.write_text(
        json.dumps([{"id": str(i), "question": "q", "answer": "a"} for i in range(5)] + [3])
    )
    tasks, report = read_tasks("frames", path)
    check_report(report, tasks=5, malformed=1)
    limited, _ = read_tasks("frames", path, limit=2)
    assert [t.id for t in limited] == ["0", "1"]


def test_many_errors_keep_only_the_first_few(tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl", ["nope"] * 12 + [{"id": "x", "question": "q", "answer": "a"}]
    )
    tasks, report = read_tasks("frames", path)
    check_report(report, tasks=1, malformed=12)
    assert "12 malformed" in report.summary()


def test_configuration_mistakes_raise_clearly(tmp_path):
    path = write_jsonl(tmp_path / "f.jsonl", [{"id": "1", "question": "q", "answer": "a"}])
    with pytest.raises(ValueError, match="unknown task source"):
        read_tasks("nope", path)
    with pytest.raises(ValueError, match="needs a path"):
        read_tasks("frames")
    with pytest.raises(FileNotFoundError):
        read_tasks("frames", tmp_path / "missing.jsonl")
    (tmp_path / "f.csv").write_text("id,question,answer\n")
    with pytest.raises(ValueError, match="unknown suffix"):
        read_tasks("frames", tmp_path / "f.csv")
    with pytest.raises(TypeError, match="skip_images"):
        read_tasks("frames", path, skip_images=True)
    with pytest.raises(ValueError, match="answer_type"):
        read_tasks("frames", path, answer_type="fuzzy")


def test_registry_lists_every_kind():
    assert set(readers.READERS) == {
        "tau2",
        "toolscale",
        "generalthought",
        "hle",
        "frames",
        "jsonl",
        "synthetic",
    }


def test_synthetic_source_delegates_to_the_env():
    synthetic = pytest.importorskip("orchestra_jax.envs.synthetic")
    expected = synthetic.SyntheticOrchestrationEnv(seed=3).tasks("train", 5)
    tasks, report = read_tasks("synthetic", seed=3, split="train", n=5)
    assert tasks == list(expected)
    check_report(report, tasks=5)
