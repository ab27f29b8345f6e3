"""Install instructions: the CPU build of PyTorch comes from PyTorch's index, not PyPI.

PyPI's `torch` for Linux is the CUDA build; `torch==2.13.0` gives the CPU build
only where pip finds a local CPU wheel first, as on the CI machine.
"""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def test_readme_installs_the_cpu_build_from_pytorchs_index():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"pip install torch {CPU_INDEX}" in readme
    assert "torch==" not in readme  # a pinned PyPI torch is the CUDA build


def test_ci_says_where_its_cpu_torch_comes_from():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    install = next(i for i, line in enumerate(ci) if 'pip install -q "torch==' in line)
    comment = " ".join(line for line in ci[max(0, install - 6) : install] if line.startswith("#"))
    assert "local wheel folder" in comment and "CUDA build" in comment


def test_setup_points_at_the_cpu_index():
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert "https://download.pytorch.org/whl/cpu" in setup
