"""The colab demo runs top to bottom (with the `micro` variant, to stay quick)."""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_colab_demo_executes(tmp_path):
    nb = nbformat.read(ROOT / "experiments" / "colab_demo.ipynb", as_version=4)
    params = nb.cells[1]
    assert 'VARIANT = "demo"' in params.source
    params.source = f'VARIANT = "micro"\nWORKDIR = "{tmp_path / "run"}"\n'
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    assert (tmp_path / "run" / "viewer.html").exists()
