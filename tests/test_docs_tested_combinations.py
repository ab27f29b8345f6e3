"""setup.py's floors for the JAX stack are versions the README's "Tested combinations"
table names, and CI runs the suite on the Python that table puts first."""

import pathlib
import re

from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[1]
STACK = ("jax", "flax", "optax", "orbax-checkpoint", "grain", "transformers")


def _tested_table() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Tested combinations", 1)[1]
    return "\n".join(line for line in section.splitlines() if line.startswith("| 3."))


def _floors() -> dict[str, Version]:
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    floors = {}
    for name in (*STACK, "python"):
        pattern = r'python_requires=">=([\d.]+)"' if name == "python" else rf'"{name}>=([\d.]+)"'
        (floor,) = re.findall(pattern, setup)
        floors[name] = Version(floor)
    return floors


def test_stack_floors_are_the_oldest_tested_versions():
    table = _tested_table()
    floors = _floors()
    for name in STACK:
        tested = [Version(v) for v in re.findall(rf"(?<![\w-]){name} ([\d.]+)", table)]
        assert tested, f"the README's tested combinations name no {name} version"
        assert min(tested) == floors[name], (name, min(tested), floors[name])
    pythons = [Version(v) for v in re.findall(r"^\| (3\.\d+)\.\d+ \|", table, re.M)]
    assert min(pythons) == floors["python"]


def test_ci_runs_the_suite_on_the_newest_tested_python():
    table = _tested_table()
    newest = max(re.findall(r"^\| (3\.\d+\.\d+) \|", table, re.M), key=Version)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f"versions/{newest}/bin/python" in ci
    assert 'PATH="$venv313/bin:$PATH" ORCHESTRA_FRESH_VENV="$fresh" pytest' in ci
    assert 'PYTHON="$py313" .ci/readme_fresh_venv.sh' in ci
