"""experiments.preference_axis on a micro run: its warm start and GRPO policy played
under both preference vectors, the report written."""

import json
import os
import pathlib
import subprocess
import sys

from orchestra_jax.eval.preference_axis import PREFERENCE_VECTORS

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = "--config=experiments/configs/grpo_hle.py:micro"


def _run(*args, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env={**os.environ, "XLA_FLAGS": ""},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_warm_start_and_grpo_under_both_vectors(tmp_path):
    flags = [
        CONFIG,
        f"--config.workdir={tmp_path}",
        "--config.sft.steps=2",
        "--config.sft.num_demos=4",
        "--config.sft.batch_size=2",
        "--config.rl.kl_coef=0.1",
        "--config.num_steps=1",
    ]
    train = _run("experiments.grpo_hle", *flags)
    assert train.returncode == 0, train.stderr[-3000:]
    assert (tmp_path / "warm_start_params").is_dir()
    axis = _run("experiments.preference_axis", *flags)
    assert axis.returncode == 0, axis.stderr[-3000:]
    out = tmp_path / "preference_axis"
    for policy in ("warm_start", "grpo"):
        for vector, preference in PREFERENCE_VECTORS.items():
            summary = json.loads((out / f"eval_{policy}_{vector}.json").read_text())
            assert summary["num_episodes"] == 4
            episodes = (out / "trajectories" / f"eval_{policy}_{vector}.jsonl").read_text()
            assert all(
                json.loads(line)["preference"] == preference for line in episodes.splitlines()
            )
    report = json.loads((out / "preference_axis.json").read_text())
    assert [(c["policy"], c["preference"]) for c in report["cells"]] == [
        ("warm_start", "cost_heavy"),
        ("warm_start", "accuracy_heavy"),
        ("grpo", "cost_heavy"),
        ("grpo", "accuracy_heavy"),
    ]
    assert report["verdict"]["text"].startswith("grpo ")
    text = (out / "preference_axis.md").read_text()
    assert "| grpo | cost_heavy |" in text and report["verdict"]["text"] in text
    assert report["verdict"]["text"] in axis.stdout
