"""The toolscale_demo data: the demo synthesis reproduces the committed tasks, and
grpo_hle.py:toolscale_demo trains on them and reports pass^k.

The demo synthesis runs the task and evolve stages on ToolScale's school
domain from recorded replies (experiments/data/toolscale_demo/script.json);
its output must equal the committed tasks.json, which the GRPO demo reads.
Needs the `tau2` extra, ../shared/tau2-bench and ../shared/toolscale.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from experiments.configs import grpo_hle
from experiments.configs import synthesize as synthesize_configs
from orchestra_jax.synthesis.pipeline import synthesize
from orchestra_jax.training.experiment_config import validate

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASKS = ROOT / "experiments" / "data" / "toolscale_demo" / "tasks.json"


def test_the_demo_synthesis_reproduces_the_committed_tasks(tau2_data, shared_file, tmp_path):
    shared_file("toolscale/domains/school")
    config = synthesize_configs.get_config("demo")
    config.out_dir = str(tmp_path)
    config.tau2_data_dir = str(tau2_data)
    result = synthesize(config)
    assert result.tasks == json.loads(TASKS.read_text())
    stages = result.report["stages"]
    assert stages["tasks"]["rejected"] == {
        "db_change_mismatch": 1,
        "gold_action_fails": 1,
        "invalid_json": 1,
    }
    assert stages["evolve"]["rejected"] == {"unknown_tool": 1}
    assert [t["id"] for t in result.tasks] == [
        "school-000-0",
        "school-001-0",
        "school-002-0",
        "school-000-0-evolved",
        "school-001-0-evolved",
    ]


def test_the_toolscale_demo_config_is_valid(tau2_data, shared_file):
    shared_file("toolscale/domains/school")
    config = grpo_hle.get_config("toolscale_demo")
    config.env.tau2.data_dir = str(tau2_data)
    config.env.tau2.domains_dir = str(ROOT.parent / "shared" / "toolscale" / "domains")
    validate(config)


@pytest.mark.slow
def test_a_short_toolscale_demo_run_reports_pass_k(tau2_data, shared_file, tmp_path):
    domains = shared_file("toolscale/domains")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.grpo_hle",
            "--config=experiments/configs/grpo_hle.py:toolscale_demo",
            f"--config.workdir={tmp_path}",
            f"--config.env.tau2.data_dir={tau2_data}",
            f"--config.env.tau2.domains_dir={domains}",
            f"--config.data.paths.toolscale={TASKS}",
            "--config.num_steps=1",
            "--config.rl.tasks_per_step=1",
            "--config.agent.max_turns=2",
            "--config.checkpoint.every_steps=0",
        ],
        cwd=ROOT,
        env={**os.environ, "XLA_FLAGS": ""},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(s.get("step") == 1 for s in steps)
    report = (tmp_path / "eval_report.md").read_text()
    # pass^1 and pass^2 of the trained policy on the held-out school tasks
    assert re.search(r"\| grpo \| school \| \d\.\d+, \d\.\d+ \|", report), report
