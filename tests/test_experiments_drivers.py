"""The absl drivers: one-line config errors, sft -> HF folder -> evaluate."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = "--config=experiments/configs/grpo_hle.py"


def _run(*args, timeout=600):
    env = {**os.environ, "XLA_FLAGS": ""}
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        ((f"{CONFIG}:huge",), "unknown config variant 'huge'"),
        ((f"{CONFIG}:micro", "--config.rl.lr=abc"), "could not convert string to float"),
        ((f"{CONFIG}:micro", "--config.rl.nothing=1"), "no config field 'nothing'"),
        (
            (f"{CONFIG}:micro", "--config.rl.lr=-1", "--config.rollout.engine=trt"),
            "rollout.engine must be one of",
        ),
    ],
)
def test_config_errors_exit_with_a_clear_message(args, message):
    result = _run("experiments.grpo_hle", *args)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("with_demos", [True, False])
def test_sft_without_steps_is_an_error_not_an_untrained_model(tmp_path, with_demos):
    demos = tmp_path / "demos.jsonl"
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    demos.write_text(json.dumps(row) + "\n" * 2 + json.dumps(row) + "\n")
    args = [f"{CONFIG}:micro", f"--config.workdir={tmp_path}", "--config.sft.batch_size=2"]
    args.append("--config.sft.ema_decay=0.0")  # no average of no steps to fail on
    result = _run("experiments.sft", *args, *([f"--demos={demos}"] if with_demos else []))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "sft.steps=0: experiments.sft would train no step" in result.stderr
    where = f"the 2 conversations in {demos}" if with_demos else "demonstrations"
    assert where in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "sft_hf").exists()


def test_sft_writes_an_hf_folder_that_evaluate_runs(tmp_path):
    workdir = f"--config.workdir={tmp_path}"
    sft = _run(
        "experiments.sft",
        f"{CONFIG}:micro",
        workdir,
        "--config.sft.steps=2",
        "--config.sft.num_demos=4",
        "--config.sft.batch_size=2",
    )
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert (tmp_path / "sft_hf" / "config.json").exists()
    evaluate = _run(
        "experiments.evaluate",
        f"{CONFIG}:micro",
        workdir,
        f"--policies=hf:{tmp_path / 'sft_hf'},random",
    )
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    summary = json.loads((tmp_path / "eval_hf_sft_hf.json").read_text())
    assert summary["num_episodes"] == 4 and 0 <= summary["accuracy"] <= 1
    assert json.loads((tmp_path / "eval_random.json").read_text())["baseline"] is True
    assert "| random |" in (tmp_path / "eval_report.md").read_text()
    assert (tmp_path / "eval_pareto.png").exists()
