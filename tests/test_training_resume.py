"""A run killed with SIGKILL resumes from its last checkpoint to bitwise the same parameters."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import jax
import numpy as np

from orchestra_jax.training.checkpointing import Checkpointer

WORKER = pathlib.Path(__file__).with_name("resume_worker.py")
ROOT = WORKER.parents[1]


def _run(workdir, steps, kill_after=None):
    args = [sys.executable, str(WORKER), str(workdir), str(steps)]
    if kill_after is not None:
        args.append(str(kill_after))
    env = {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": str(ROOT)}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _final_params(workdir, step):
    with Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False) as ckpt:
        assert ckpt.latest_step() == step
        return jax.tree.map(np.asarray, ckpt.restore(step).params)


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    steps = 4
    whole = _run(tmp_path / "whole", steps)
    assert whole.returncode == 0, whole.stderr[-3000:]

    killed = _run(tmp_path / "killed", steps, kill_after=2)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    metrics = [json.loads(line) for line in open(tmp_path / "killed" / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2]

    resumed = _run(tmp_path / "killed", steps)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr

    a, b = _final_params(tmp_path / "whole", steps), _final_params(tmp_path / "killed", steps)
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b) > 0
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(x, y)
    # Training really updated the parameters at every step, so equality is not trivial.
    metrics = [json.loads(line) for line in open(tmp_path / "killed" / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(m.get("learner/skipped", 1) == 0 for m in metrics)
