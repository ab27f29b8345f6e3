"""experiments/benchmarks/common.py: every result names the code, the CPU and the
Python and library versions it timed."""

import importlib.metadata
import json
import platform

from experiments.benchmarks import common


def test_result_names_commit_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    record = json.loads(common.write_result("probe", {"x": 1}).read_text())
    assert record["benchmark"] == "probe" and record["x"] == 1
    code = record["code"]
    # This test runs from a git checkout: the commit is a full hash.
    assert code["commit"] is None or (len(code["commit"]) == 40 and isinstance(code["dirty"], bool))
    machine = record["machine"]
    assert "cpu_model" in machine and isinstance(machine["cpu_flags"], list)
    assert machine["python"] == platform.python_version()
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers"):
        assert machine["libraries"][name] == importlib.metadata.version(name)


def test_code_version_outside_git(monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(common.subprocess, "run", no_git)
    assert common.code_version() == {"commit": None}


def test_result_file_names_its_python(tmp_path, monkeypatch):
    # 3.11's records keep their names; another Python's go beside them, not over them.
    assert common.result_suffix((3, 11, 7)) == ""
    assert common.result_suffix((3, 13, 0)) == "_py313"
    assert common.result_suffix((3, 12)) == "_py312"
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_onednn=true")
    path = common.write_result("probe", {})
    assert path.name == f"probe{common.result_suffix()}.json"
    assert json.loads(path.read_text())["machine"]["xla_flags"] == "--xla_cpu_use_onednn=true"
