"""The suite's own helpers import as `tests.<module>` whatever else is installed."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_an_installed_top_level_tests_package_does_not_shadow_the_suite(tmp_path):
    # Some distributions ship a top-level regular `tests` package (verl does); on
    # sys.path it must not hide the suite's helpers from `from tests.x import …`.
    foreign = tmp_path / "site" / "tests"
    foreign.mkdir(parents=True)
    (foreign / "__init__.py").write_text("FOREIGN = True\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    # A module that imports a helper (tests/linear_time.py), collected only.
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    command += ["-o", "addopts=", "tests/test_chat_tool_calls.py"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "test_chat_tool_calls.py::" in result.stdout
