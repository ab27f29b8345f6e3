"""The colab demo runs top to bottom (with the `micro` variant, to stay quick).

Two ways: in this test environment, and in a fresh one as a new notebook user
meets it: a virtual environment with nothing but ipykernel, where the
notebook's first cell installs the project, with the system's `bwrap` hidden.
The fresh environment is expensive to build, so CI builds it once
(.ci/readme_fresh_venv.sh) and names it in ORCHESTRA_FRESH_VENV; without it
that test skips, saying so.
"""

import json
import os
import pathlib
import subprocess

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "experiments" / "colab_demo.ipynb"


def _micro_notebook(workdir: pathlib.Path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert "pip" in nb.cells[1].source and "install" in nb.cells[1].source  # first code cell
    (params,) = [c for c in nb.cells if c.cell_type == "code" and "VARIANT =" in c.source]
    assert 'VARIANT = "demo"' in params.source
    params.source = f'VARIANT = "micro"\nWORKDIR = "{workdir}"\n'
    return nb


def test_colab_demo_executes(tmp_path):
    nb = _micro_notebook(tmp_path / "run")
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    assert (tmp_path / "run" / "viewer.html").exists()


def _path_without_bwrap(tmp_path: pathlib.Path) -> str:
    """PATH with every folder holding `bwrap` replaced by links to its other files."""
    shim = tmp_path / "path_shim"
    shim.mkdir()
    dirs = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if d and os.path.exists(os.path.join(d, "bwrap")):
            for name in os.listdir(d):
                if name != "bwrap" and not (shim / name).exists():
                    (shim / name).symlink_to(os.path.join(d, name))
            d = str(shim)
        dirs.append(d)
    return os.pathsep.join(dirs)


def _outputs(nb) -> str:
    return "".join(
        out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    )


def test_colab_demo_installs_and_runs_in_a_fresh_environment(tmp_path, monkeypatch):
    venv = os.environ.get("ORCHESTRA_FRESH_VENV")
    if not venv:
        pytest.skip("set ORCHESTRA_FRESH_VENV to a fresh virtual environment (.ci/run does)")
    python = pathlib.Path(venv) / "bin" / "python"

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "XLA_FLAGS", "JAX_PLATFORMS")
    }

    def run(*args):  # outside the checkout, whose egg-info would answer for the project
        return subprocess.run(
            [str(python), *args], capture_output=True, text=True, cwd=tmp_path, env=env
        )

    assert run("-m", "pip", "install", "-q", "ipykernel").returncode == 0
    # The project and a dependency of it are removed: the notebook's first cell installs them.
    run("-m", "pip", "uninstall", "-y", "-q", "orchestra_jax", "bm25s")
    assert run("-c", "import importlib.metadata as m; m.version('orchestra_jax')").returncode
    kernels = tmp_path / "jupyter" / "kernels" / "fresh"
    kernels.mkdir(parents=True)
    spec = {
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fresh venv",
        "language": "python",
    }
    (kernels / "kernel.json").write_text(json.dumps(spec))
    env["PATH"] = os.pathsep.join([str(python.parent), _path_without_bwrap(tmp_path)])
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    nb = _micro_notebook(tmp_path / "run")
    NotebookClient(
        nb, timeout=900, kernel_name="fresh", resources={"metadata": {"path": str(ROOT)}}
    ).execute(env=env)
    assert run("-c", "import importlib.metadata as m; m.version('orchestra_jax')").returncode == 0
    picked = [line for line in _outputs(nb).splitlines() if "tools.sandbox='auto' picked" in line]
    assert picked and "/usr/bin/bwrap" not in picked[0], picked
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    assert (tmp_path / "run" / "viewer.html").exists()
