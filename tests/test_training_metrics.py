"""Metrics writer: jsonl records, TensorBoard events, console line, resume truncation, plots."""

import json
import math

import numpy as np
import pytest

from orchestra_jax.io.jsonl_log import JsonlLogError
from orchestra_jax.training import metrics as metrics_lib
from orchestra_jax.training.metrics import MetricsWriter, plot_metrics, read_metrics


def step_metrics(step):
    return {
        "reward": 0.1 * step,
        "accuracy": np.float32(0.5),
        "kl": np.array(1e-3),
        "tool_calls": {"search-1": step, "python": 0},
        "format_valid": True,
        "entropy": float("nan"),
    }


def test_jsonl_records_are_well_formed(tmp_path):
    with MetricsWriter(tmp_path, total_steps=5, use_tensorboard=False, console=False) as writer:
        for step in range(1, 4):
            writer.write(step, step_metrics(step))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=pytest.fail) for line in lines]  # strict JSON
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[1]["reward"] == pytest.approx(0.2)
    assert records[1]["tool_calls/search-1"] == 2.0 and records[1]["format_valid"] == 1.0
    assert all(isinstance(r["time"], float) for r in records)
    assert records[0]["entropy"] is None


def test_tensorboard_event_files_hold_the_scalars(tmp_path):
    from tensorboardX.proto import event_pb2  # the writer's own format

    with MetricsWriter(tmp_path, total_steps=2, console=False) as writer:
        writer.write(1, step_metrics(1))
        writer.write(2, step_metrics(2))
    event_files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1
    tags = set()
    for payload in read_tfrecords(event_files[0].read_bytes()):
        event = event_pb2.Event.FromString(payload)
        tags.update(v.tag for v in event.summary.value)
    assert {"reward", "accuracy", "kl", "tool_calls/search-1"} <= tags


def read_tfrecords(data: bytes):
    """TFRecord framing: u64 length, u32 crc, payload, u32 crc."""
    offset = 0
    while offset < len(data):
        length = int.from_bytes(data[offset : offset + 8], "little")
        yield data[offset + 12 : offset + 12 + length]
        offset += 12 + length + 4


def test_resume_drops_steps_after_the_checkpoint(tmp_path):
    with MetricsWriter(tmp_path, total_steps=10, use_tensorboard=False, console=False) as writer:
        for step in range(1, 6):
            writer.write(step, {"reward": step})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "rew')  # torn last line from a SIGKILL
    # Restart from the checkpoint of step 3: steps 4, 5 and the torn line go.
    with MetricsWriter(
        tmp_path, total_steps=10, use_tensorboard=False, console=False, resume_step=3
    ) as writer:
        writer.write(4, {"reward": 40})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["reward"]) for r in records] == [(1, 1), (2, 2), (3, 3), (4, 40)]


def test_truncate_after_on_an_open_writer(tmp_path):
    with MetricsWriter(tmp_path, total_steps=4, use_tensorboard=False, console=False) as writer:
        for step in range(1, 5):
            writer.write(step, {"reward": step})
        assert writer.truncate_after(2) == 2
        writer.write(3, {"reward": 30})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_console_progress_line_has_eta(tmp_path, capsys):
    with MetricsWriter(tmp_path, total_steps=4, use_tensorboard=False) as writer:
        writer.write(1, {"reward": 0.25, "cost_usd": 0.01})
        writer.write(2, {"reward": 0.5})
    err = capsys.readouterr().err.splitlines()
    assert (
        err[0].startswith("step 1/4 (25%) eta ?")
        and "reward 0.25" in err[0]
        and "cost_usd 0.01" in err[0]
    )
    assert err[1].startswith("step 2/4 (50%) eta 0:") and "reward 0.5" in err[1]


def test_format_eta():
    assert metrics_lib.format_eta(3725.0) == "1:02:05"
    assert metrics_lib.format_eta(math.nan) == "?"
    assert metrics_lib.format_eta(-3) == "0:00:00"


def test_bad_metrics_raise_clearly(tmp_path):
    with MetricsWriter(tmp_path, total_steps=1, use_tensorboard=False, console=False) as writer:
        with pytest.raises(TypeError, match="'note' must be a number"):
            writer.write(1, {"note": "text"})
        with pytest.raises(ValueError, match="reserved"):
            writer.write(1, {"step": 3})
    with pytest.raises(ValueError, match="total_steps"):
        MetricsWriter(tmp_path, total_steps=0)


def test_plot_metrics_writes_a_png(tmp_path):
    with MetricsWriter(tmp_path, total_steps=5, use_tensorboard=False, console=False) as writer:
        for step in range(1, 6):
            writer.write(step, step_metrics(step))
    out = plot_metrics(
        tmp_path / "metrics.jsonl",
        tmp_path / "plots" / "curves.png",
        ["reward", "tool_calls/search-1", "missing"],
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="at least one key"):
        plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "x.png", [])


def test_a_disabled_writer_writes_nothing(tmp_path, capsys):
    """Hosts other than process 0 log nothing, in files or on the console."""
    writer = MetricsWriter(tmp_path / "run", total_steps=3, resume_step=1, enabled=False)
    assert writer.write(1, {"reward": 0.5, "tools": {"search": 2}}) == {
        "reward": 0.5,
        "tools/search": 2.0,
    }
    writer.truncate_after(0)
    writer.flush()
    writer.close()
    assert not (tmp_path / "run").exists()
    assert capsys.readouterr().err == ""


def test_read_metrics_refuses_a_bad_line_before_the_last(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n{"step": 4, "rew')
    with pytest.raises(JsonlLogError, match="line 2"):
        read_metrics(path)
    path.write_text('{"step": 1}\n{"step": 2, "rew')
    assert read_metrics(path) == [{"step": 1}]
