"""A short look at the demo, as a new user takes it, runs to its end (report included)."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The README's demo command with small overrides. Eight held-out tasks are the
# ones on which the random router never calls search or enhance_reasoning on an
# entity question (shares of 0 in that domain), which the report once divided by.
SHORT = (
    "--config.num_steps=3",
    "--config.sft.steps=4",
    "--config.sft.num_demos=16",
    "--config.eval.num_tasks=8",
)


def test_a_short_demo_run_trains_evaluates_and_reports(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.grpo_hle",
            "--config=experiments/configs/grpo_hle.py:demo",
            f"--config.workdir={tmp_path}",
            *SHORT,
        ],
        cwd=ROOT,
        env={**os.environ, "XLA_FLAGS": ""},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Python sandbox: tools.sandbox='auto' picked" in run.stderr
    for name in ("metrics.jsonl", "summary.json", "curves.png", "eval_report.md"):
        assert (tmp_path / name).exists(), name
    assert "writing the evaluation report failed" not in run.stderr
    with open(tmp_path / "summary.json") as f:
        summaries = json.load(f)
    assert {"grpo", "warm_start", "random"} <= set(summaries)
    with open(tmp_path / "metrics.jsonl") as f:
        steps = [json.loads(line).get("step") for line in f]
    assert 3 in steps
