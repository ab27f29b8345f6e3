"""A domain folder's code imported into this process: its `DB` and `ToolKitBase`
subclasses and tau2's environment constructor for them.

Only trusted code is imported so (ToolScale's ten domains, or a config that says
the code is trusted: `domain_folder.register_domain_folder(..., in_process=True)`);
model-written code reaches these functions only inside the domain-code sandbox,
in its domain server (`envs/domain_server.py`) or the synthesis probe's worker
(`synthesis/probe_worker.py`). tau2 is imported by the functions that need it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pathlib
import sys
from collections.abc import Callable
from typing import Any


def load_domain_code(folder: pathlib.Path, *, with_tools: bool = True) -> tuple[type, Any]:
    """The folder's `DB` subclass and (`with_tools`, else None) `ToolKitBase`
    subclass, its modules imported as `tau2.domains.<name>.*`."""
    from tau2.environment.db import DB
    from tau2.environment.toolkit import ToolKitBase

    package = f"tau2.domains.{folder.name}"
    spec = importlib.util.spec_from_loader(package, loader=None, is_package=True)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__path__ = [str(folder)]
    sys.modules[package] = module
    try:
        data_model = importlib.import_module(f"{package}.data_model")
        db_class = _one_subclass(data_model, DB, folder / "data_model.py")
        if not with_tools:
            return db_class, None
        tools = importlib.import_module(f"{package}.tools")
        return db_class, _one_subclass(tools, ToolKitBase, folder / "tools.py")
    except Exception as e:  # the folder's modules leave no trace, so a fixed folder loads
        unload_domain_code(folder.name)
        if isinstance(e, ValueError) and str(folder) in str(e):
            raise
        raise ValueError(
            f"{folder}: its domain code does not import: {type(e).__name__}: {e}"
        ) from e


def _one_subclass(module: Any, base: type, where: pathlib.Path) -> type:
    found = [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if issubclass(c, base) and c is not base and c.__module__ == module.__name__
    ]
    if len(found) != 1:
        names = [c.__name__ for c in found]
        raise ValueError(f"{where} must define one subclass of {base.__name__}, found {names}")
    return found[0]


def environment_constructor(
    folder: pathlib.Path, db_class: type, toolkit_class: type
) -> Callable[..., Any]:
    """tau2's `get_environment(db=None, solo_mode=False)` for the folder's domain;
    the database is read from `db.json` afresh on every call (each episode and
    each of the evaluator's replays gets its own copy)."""
    from tau2.environment.environment import Environment

    policy = (folder / "policy.md").read_text(encoding="utf-8")
    db_path = str(folder / "db.json")

    def get_environment(db: Any = None, solo_mode: bool = False) -> Any:
        if solo_mode:
            raise ValueError(f"τ² domain {folder.name!r} does not support solo mode")
        return Environment(
            domain_name=folder.name,
            policy=policy,
            tools=toolkit_class(db if db is not None else db_class.load(db_path)),
        )

    return get_environment


def unload_domain_code(name: str) -> None:
    """Forgets the modules of domain `name` (`tau2.domains.<name>.*`) loaded by
    `load_domain_code`, so another folder of that name can be loaded (the synthesis
    pipeline's probe process checks several candidates of one domain in turn)."""
    package = f"tau2.domains.{name}"
    for key in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[key]
