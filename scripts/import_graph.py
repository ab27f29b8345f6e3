"""The package's import graph between its subpackages: arrows, circles, imports inside functions.

    python scripts/import_graph.py        # the counts
    python scripts/import_graph.py -v     # and every arrow, circle tie and import inside a function

A package is a folder of `orchestra_jax/` (or a top-level module such as
`tasks.py`); an arrow A -> B means a module of A imports a module of B. Arrows
count imports at module level and inside functions alike; a circle is a set of
packages that reach each other (a strongly connected component of two or more).
"""

from __future__ import annotations

import argparse
import ast
import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "orchestra_jax"


def _package(parts: tuple[str, ...]) -> str:
    """The subpackage (or top-level module) of a module path split into parts."""
    return parts[1] if len(parts) > 1 else PACKAGE


def _imported(node: ast.Import | ast.ImportFrom, module: tuple[str, ...]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = ".".join(
            module[: len(module) - node.level] + ((node.module,) if node.module else ())
        )
    else:
        base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def scan(root: pathlib.Path = ROOT):
    """(arrows {A: {B}}, arrows at module level only, imports inside functions as
    (path, line, text, target package or None))."""
    top = {p.stem if p.suffix == ".py" else p.name for p in (root / PACKAGE).iterdir()}
    arrows: dict[str, set[str]] = collections.defaultdict(set)
    module_level: dict[str, set[str]] = collections.defaultdict(set)
    in_functions = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root)
        parts = rel.with_suffix("").parts
        source = _package(parts) if len(parts) > 2 else (parts[1] if len(parts) == 2 else PACKAGE)

        pending: list[tuple[ast.AST, bool]] = [(ast.parse(path.read_text(encoding="utf-8")), False)]
        while pending:
            node, in_function = pending.pop()
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets = set()
                for name in _imported(node, parts):
                    bits = name.split(".")
                    if bits[0] == PACKAGE and len(bits) > 1 and bits[1] in top:
                        targets.add(bits[1])
                targets.discard(source)
                for target in targets:
                    arrows[source].add(target)
                    if not in_function:
                        module_level[source].add(target)
                if in_function:
                    named = sorted(targets)[0] if targets else None
                    in_functions.append((rel.as_posix(), node.lineno, ast.unparse(node), named))
            inside = in_function or isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            pending.extend((child, inside) for child in ast.iter_child_nodes(node))
    return arrows, module_level, in_functions


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two packages or more, each sorted."""
    nodes = sorted(set(arrows) | {b for targets in arrows.values() for b in targets})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(arrows.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in nodes:
        if v not in index:
            connect(v)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="list what is counted")
    args = parser.parse_args(argv)
    arrows, module_level, in_functions = scan()
    files = sum(1 for _ in (ROOT / PACKAGE).rglob("*.py"))
    mutual = sorted(
        {tuple(sorted((a, b))) for a in arrows for b in arrows[a] if a in arrows.get(b, ())}
    )
    print(f"modules: {files}")
    print(
        f"arrows between packages: {sum(len(t) for t in arrows.values())} "
        f"({sum(len(t) for t in module_level.values())} from module-level imports)"
    )
    print(f"circles: {circles(arrows)}")
    print(f"circles of module-level imports: {circles(module_level)}")
    print(f"packages importing each other: {mutual}")
    crossing = [entry for entry in in_functions if entry[3] is not None]
    print(
        f"imports inside functions: {len(in_functions)}, of another package of the project: {len(crossing)}"
    )
    if args.verbose:
        for source in sorted(arrows):
            print(f"  {source} -> {', '.join(sorted(arrows[source]))}")
        for path, line, text, target in in_functions:
            print(f"  {path}:{line}: {text}" + (f"   [-> {target}]" if target else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
