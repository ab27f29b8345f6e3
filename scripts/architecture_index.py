"""The module index at the top of docs/architecture.md: one line per file of the package.

Each line is a module's path and its docstring's summary (the docstring's first
paragraph, joined into one line). The index sits between the two marker lines
below; nothing else of the document is touched.

    python scripts/architecture_index.py           # check: exit 1 when the index is stale
    python scripts/architecture_index.py --write   # rewrite the index from the modules

A module without a docstring is an error in both modes: every module says what
it is.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "orchestra_jax"
DOC = "docs/architecture.md"
BEGIN = "<!-- module index: python scripts/architecture_index.py --write; do not edit by hand -->"
END = "<!-- end of module index -->"
WRITE_COMMAND = "python scripts/architecture_index.py --write"


def module_paths(root: pathlib.Path = ROOT) -> list[str]:
    """Every Python module of the package, as paths from `root`, sorted."""
    files = (root / PACKAGE).rglob("*.py")
    return sorted(p.relative_to(root).as_posix() for p in files if "__pycache__" not in p.parts)


def summary(source: str) -> str | None:
    """A module's docstring's first paragraph as one line; None without a docstring."""
    docstring = ast.get_docstring(ast.parse(source))
    if not docstring or not docstring.strip():
        return None
    paragraph = docstring.strip().split("\n\n")[0]
    return " ".join(paragraph.split())


def index_lines(root: pathlib.Path, paths: list[str]) -> tuple[list[str], list[str]]:
    """(one index line per module, the modules without a docstring)."""
    lines, missing = [], []
    for path in paths:
        text = summary((root / path).read_text(encoding="utf-8"))
        if text is None:
            missing.append(path)
        else:
            lines.append(f"- `{path}`: {text}")
    return lines, missing


def index_block(root: pathlib.Path = ROOT, paths: list[str] | None = None) -> str:
    """The index with its marker lines; ValueError naming any module without a docstring."""
    lines, missing = index_lines(root, module_paths(root) if paths is None else paths)
    if missing:
        raise ValueError(
            "modules without a docstring (write one that says what the module is): "
            + ", ".join(missing)
        )
    return "\n".join([BEGIN, *lines, END])


def replace_index(document: str, block: str) -> str:
    """`document` with the text between (and including) the markers replaced by `block`."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC} has no module index markers ({BEGIN!r} ... {END!r})")
    return document[:start] + block + document[end + len(END) :]


def stale_lines(document: str, block: str) -> list[str]:
    """What differs between the document's index and `block`: '+ line' (missing from
    the document) and '- line' (in the document, no longer true)."""
    start, end = document.find(BEGIN), document.find(END)
    current = set(document[start:end].splitlines()[1:]) if 0 <= start < end else set()
    wanted = set(block.splitlines()[1:-1])
    return [f"+ {line}" for line in sorted(wanted - current)] + [
        f"- {line}" for line in sorted(current - wanted)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the index in {DOC}")
    args = parser.parse_args(argv)
    doc_path = ROOT / DOC
    document = doc_path.read_text(encoding="utf-8")
    try:
        block = index_block(ROOT)
        updated = replace_index(document, block)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.write:
        if updated != document:
            doc_path.write_text(updated, encoding="utf-8")
            print(f"{DOC}: module index rewritten")
        return 0
    if updated != document:
        print(
            f"{DOC}: the module index is stale (a module was added, removed, or its "
            f"docstring's summary changed); run: {WRITE_COMMAND}",
            file=sys.stderr,
        )
        for line in stale_lines(document, block):
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
