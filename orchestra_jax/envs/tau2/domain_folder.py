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

import os
import pathlib

from orchestra_jax.envs.sandboxed_domain import DomainCallFailed, SandboxedDomain
from orchestra_jax.envs.tau2.domain_code import environment_constructor, load_domain_code
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
