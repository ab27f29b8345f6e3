"""The verifiability filter: gold actions must replay to the same database twice, facts to
communicate must be specific, and a run that keeps no task fails, saying why.

Needs the `tau2` extra and ../shared/tau2-bench (and ../shared/toolscale for the
demo-based run).
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from experiments.configs import synthesize as synthesize_configs
from orchestra_jax.synthesis import outputs, stages
from orchestra_jax.synthesis.pipeline import synthesize
from orchestra_jax.synthesis.probe import ProbeLimits, Prober
from tests import synthesis_script as script

ROOT = pathlib.Path(__file__).resolve().parents[1]
FACTS = re.compile(r'"communicate_info": \[[^\]]*\]')
LOAN = "        self.db.loans[loan_id] = loan\n"
TASK = {
    "user_scenario": {
        "reason_for_call": "You want to borrow B-1002.",
        "known_info": "You are member M-01.",
        "unknown_info": "",
        "task_instructions": "Confirm when asked.",
    },
    "actions": [{"name": script.BORROW[0], "arguments": script.BORROW[1]}],
    "communicate_info": [],
    "nl_assertions": [],
}


def library(tmp_path, name, tools):
    folder = tmp_path / name / "library"
    folder.mkdir(parents=True)
    (folder / "data_model.py").write_text(script.DATA_MODEL)
    (folder / "db.json").write_text(json.dumps(script.BATCH_0))
    (folder / "tools.py").write_text(tools)
    (folder / "policy.md").write_text("Lend books.")
    return folder


def replay(folder):
    row = stages.task_row("library", "library-000-0", "borrow", TASK)
    return {"kind": "replay", "folder": str(folder), "actions": TASK["actions"], "task": row}


def test_a_tool_that_writes_a_random_id_fails_the_second_replay(tau2_data, tmp_path):
    assert LOAN in script.TOOLS and script.BORROW[0] == "borrow_book"
    random_note = LOAN + "        import uuid\n        loan.due_date = str(uuid.uuid4())\n"
    steady = library(tmp_path, "steady", script.TOOLS)
    random = library(tmp_path, "random", script.TOOLS.replace(LOAN, random_note))
    with Prober(ProbeLimits(timeout_s=10.0), tau2_data_dir=str(tau2_data)) as prober:
        assert prober.one(replay(steady)) == {"ok": True, "changed": True}
        result = prober.one(replay(random))
    assert result["ok"] is False and result["reason"] == "replay_not_deterministic"


def test_facts_to_communicate_need_four_letters_or_digits():
    facts = ["4", "yes", "$12", "4 credits", "Introduction to Drawing", "B-1002"]
    assert outputs.vague_facts(facts) == ["4", "yes", "$12"]


def test_a_run_that_keeps_no_task_exits_non_zero_with_the_reasons(tau2_data, shared_file, tmp_path):
    """The demo's replies with every task's facts made vague: nothing is kept."""
    shared_file("toolscale/domains/school")
    demo = json.loads(open(synthesize_configs.DEMO_SCRIPT).read())
    for key, reply in demo["replies"].items():
        if key.startswith("school-"):
            demo["replies"][key] = FACTS.sub('"communicate_info": ["4"]', reply)
    vague_script = tmp_path / "script.json"
    vague_script.write_text(json.dumps(demo))
    config = synthesize_configs.get_config("demo")
    config.generator.script = str(vague_script)  # pyright: ignore[reportAttributeAccessIssue, reportOptionalMemberAccess]
    config.tau2_data_dir = str(tau2_data)
    config.out_dir = str(tmp_path / "out")
    with pytest.raises(stages.StageFailed, match="no task kept.*communicate_info_vague"):
        synthesize(config)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "no task kept" in report["failed"]

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.synthesize",
            "--config=experiments/configs/synthesize.py:demo",
            f"--config.generator.script={vague_script}",
            f"--config.tau2_data_dir={tau2_data}",
            f"--config.out_dir={tmp_path / 'cli'}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode != 0
    assert "no task kept" in proc.stderr and "communicate_info_vague" in proc.stderr
