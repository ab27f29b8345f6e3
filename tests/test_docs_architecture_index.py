"""docs/architecture.md's module index matches the package's modules and their docstrings."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "architecture_index.py"


def _index_module():
    spec = importlib.util.spec_from_file_location("architecture_index", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_module_index_is_current():
    run = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr


def _tree(tmp_path, modules):
    for path, text in modules.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return tmp_path


def test_a_module_added_removed_or_redescribed_makes_the_index_stale(tmp_path):
    ai = _index_module()
    root = _tree(
        tmp_path,
        {
            "orchestra_jax/a.py": '"""Module a: does one thing.\n\nDetails."""\n',
            "orchestra_jax/pkg/b.py": '"""Module b, whose summary\nwraps a line."""\n',
        },
    )
    block = ai.index_block(root)
    assert block.splitlines()[1:-1] == [
        "- `orchestra_jax/a.py`: Module a: does one thing.",
        "- `orchestra_jax/pkg/b.py`: Module b, whose summary wraps a line.",
    ]
    document = ai.replace_index(f"# Title\n\n{ai.BEGIN}\n{ai.END}\n\nprose\n", block)
    assert ai.replace_index(document, ai.index_block(root)) == document  # current
    assert document.endswith("\n\nprose\n")

    (root / "orchestra_jax/c.py").write_text('"""Module c."""\n')  # added
    assert ai.stale_lines(document, ai.index_block(root)) == ["+ - `orchestra_jax/c.py`: Module c."]
    (root / "orchestra_jax/c.py").unlink()
    (root / "orchestra_jax/a.py").write_text('"""Module a: does another thing."""\n')  # changed
    assert ai.replace_index(document, ai.index_block(root)) != document
    (root / "orchestra_jax/pkg/b.py").unlink()  # removed
    assert "- - `orchestra_jax/pkg/b.py`: Module b, whose summary wraps a line." in (
        ai.stale_lines(document, ai.index_block(root))
    )


def test_a_module_without_a_docstring_is_named(tmp_path):
    ai = _index_module()
    root = _tree(tmp_path, {"orchestra_jax/a.py": '"""A."""\n', "orchestra_jax/bare.py": "x = 1\n"})
    with pytest.raises(ValueError, match="orchestra_jax/bare.py"):
        ai.index_block(root)


def test_the_stale_message_names_the_command_to_run(tmp_path, monkeypatch, capsys):
    ai = _index_module()
    root = _tree(tmp_path, {"orchestra_jax/a.py": '"""A."""\n'})
    (root / "docs").mkdir()
    (root / ai.DOC).write_text(f"# T\n\n{ai.BEGIN}\n{ai.END}\n")
    monkeypatch.setattr(ai, "ROOT", root)
    monkeypatch.setattr(ai, "module_paths", lambda r=root: ["orchestra_jax/a.py"])
    assert ai.main([]) == 1
    assert "run: python scripts/architecture_index.py --write" in capsys.readouterr().err
    assert ai.main(["--write"]) == 0
    assert ai.main([]) == 0
    assert "- `orchestra_jax/a.py`: A." in (root / ai.DOC).read_text()
