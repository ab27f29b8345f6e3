"""A τ² domain from a folder: ToolScale's ten domains, or one the synthesis pipeline made.

A domain folder holds `db.json` (the database), `policy.md` (the agent's
policy), `data_model.py` (pydantic models of the database: one subclass of
tau2's `DB`) and `tools.py` (one subclass of tau2's `ToolKitBase` whose
`@is_tool` methods are the domain's tools), optionally `tasks.json` and
helper modules. The folder's name is the domain's name.

The domain code of ToolScale's release was written inside the release's tau2
fork: its modules import their siblings as `tau2.domains.<name>.<module>`,
and its `environment.py` reads the release's own relative paths. This layer
makes such a folder loadable without editing it:

  1. `tau2.domains.<name>` becomes a package whose modules are the folder's
     files (an entry in `sys.modules` whose `__path__` is the folder), so the
     domain's own imports resolve to the folder;
  2. the `DB` subclass of `data_model.py` and the `ToolKitBase` subclass of
     `tools.py` are found by type, and the environment is built here from
     `db.json` and `policy.md` (the folder's `environment.py` is not used);
  3. that constructor is registered in tau2's registry under `<name>`, so
     tau2's evaluator (which rebuilds environments by domain name) grades
     its episodes as it grades `retail`'s.

Where the code runs: a folder's code came from a model unless it is one of
ToolScale's ten in the configured `domains_dir` (the release's own code) or
the config says the code is trusted. Model-written code is never imported
here: `register_domain_folder(..., in_process=False)` registers a
`sandboxed_domain.SandboxedDomain`, whose stand-in environments run the code
in the sandbox (tau2's evaluator builds those stand-ins too);
`in_process=True` imports it into this process (`is_release_domain`).

A folder whose name is already one of tau2's own domains (`mock`, `retail`, …)
or another folder's is refused: tau2 knows a domain by its name alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

from orchestra_jax.envs.tau2.setup import import_tau2

# ToolScale's ten synthesized domains (the release's `tau2/domains/`), found in
# `env.tau2.domains_dir` (../shared/toolscale/domains beside the clone).
TOOLSCALE_DOMAINS = (
    "bank",
    "basketball",
    "ecommerce",
    "medicine",
    "movie",
    "railway",
    "restaurant",
    "school",
    "travel",
    "weather",
)
REQUIRED_FILES = ("db.json", "policy.md", "data_model.py", "tools.py")

# domain name -> the folder it was registered from (this process).
_REGISTERED: dict[str, pathlib.Path] = {}


def domain_folder(spec: str, domains_dir: str | os.PathLike | None = None) -> pathlib.Path | None:
    """The folder of domain `spec`: a path to a domain folder, or a name found in
    `domains_dir`; None when `spec` names neither (e.g. tau2's own `retail`)."""
    if not spec:
        return None
    if os.sep in spec or spec.startswith(".") or os.path.isdir(spec):
        path = pathlib.Path(spec)
        if not path.is_dir():
            raise ValueError(f"τ² domain folder {spec!r} does not exist")
        return path.resolve()
    if domains_dir:
        path = pathlib.Path(domains_dir) / spec
        if path.is_dir():
            return path.resolve()
    return None


def check_domain_folder(folder: str | os.PathLike) -> list[str]:
    """One message per thing a domain folder lacks ([] when it is complete)."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    return [f"{folder} has no {name}" for name in REQUIRED_FILES if not (folder / name).is_file()]


def is_release_domain(folder: str | os.PathLike, domains_dir: str | os.PathLike | None) -> bool:
    """True for one of ToolScale's ten domains in `domains_dir` (the release's own code)."""
    folder = pathlib.Path(folder).resolve()
    return bool(
        domains_dir
        and folder.name in TOOLSCALE_DOMAINS
        and folder.parent == pathlib.Path(domains_dir).resolve()
    )


def register_domain_folder(
    folder: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    *,
    in_process: bool = False,
    sandbox: str = "auto",
    code_is_trusted: bool = False,
) -> str:
    """Makes the domain in `folder` a tau2 domain (module docstring); returns its name.

    `in_process`: import its code here (trusted code only); else it runs in the
    domain-code sandbox `sandbox` (`domain_sandbox.domain_sandbox`). Registering
    the same folder again is a no-op. Raises ValueError when the folder is
    incomplete, its name is taken, or its code does not load.
    """
    folder = pathlib.Path(folder).resolve()
    name = folder.name
    if _REGISTERED.get(name) == folder:
        return name
    problems = check_domain_folder(folder)
    if problems:
        raise ValueError("; ".join(problems))
    if not name.isidentifier():
        raise ValueError(f"domain folder name {name!r} must be a Python identifier")
    import_tau2(data_dir)
    from tau2.registry import registry

    if name in _REGISTERED:
        raise ValueError(
            f"τ² domain {name!r} was loaded from {_REGISTERED[name]}; "
            f"a second folder of that name ({folder}) cannot be loaded in the same process"
        )
    if name in registry.get_domains():
        raise ValueError(
            f"{folder}: {name!r} is one of tau2's own domains; rename the folder "
            "(tau2 knows a domain by its name)"
        )
    if in_process:
        db_class, toolkit_class = load_domain_code(folder)
        registry.register_domain(environment_constructor(folder, db_class, toolkit_class), name)
    else:
        from tau2.utils import utils as tau2_utils

        from orchestra_jax.envs.sandboxed_domain import DomainCallFailed, SandboxedDomain

        domain = SandboxedDomain(
            folder, str(tau2_utils.DATA_DIR), sandbox=sandbox, code_is_trusted=code_is_trusted
        )
        try:
            domain.describe()
        except DomainCallFailed as e:
            domain.close()
            raise ValueError(f"{folder}: its domain code does not load in the sandbox: {e}") from e
        registry.register_domain(domain.environment, name)  # pyright: ignore[reportArgumentType]
    _REGISTERED[name] = folder
    return name


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
