"""The model catalogue: the expert models a live run may offer, as data.

A catalogue is a YAML (or JSON) file, its path in `tools.catalogue`:

    models:
      - name: gpt-5                        # unique; the backend key of its aliases
        model: gpt-5                       # the request's `model` field
        base_url: https://api.openai.com/v1  # OpenAI-compatible (/chat/completions appended)
        api_key_env: OPENAI_API_KEY        # null or "": the server needs no key
        price_in: 1.25                     # USD per million input tokens
        price_out: 10.0                    # USD per million output tokens
        latency_s: 40                      # typical seconds per call
        description: ...                   # optional capability sentence
        extra_body: {reasoning_effort: low}  # optional fields merged into every request
        reasoning_model: true              # optional: OpenAI reasoning-model API (gpt-5,
                                           # o-series): max_completion_tokens, no temperature
        family: gpt                        # optional: qwen | math | gpt | other, how
                                           # tools.experts="reference" prompts it and
                                           # reads its replies (expert_protocols.py)
        roles:                             # what it can serve: a list of role names,
          search: {latency_s: 22}          # or role -> optional latency_s / description
          reasoner: {}
          answer: {latency_s: 96}

A role is an alias family (`catalogue_roles()`): each meta-tool's own prefix
("search", "reasoner", "answer") and the variants of `ROLE_VARIANTS`
("answer-math": the paper's math answerers under `answer`). A model is offered
under a role's meta-tool as `<role>-<n>`, numbered in catalogue order, so the
shipped `experiments/configs/models_paper.yaml` reproduces the paper's aliases
(search-1 = gpt-5, …, answer-math-2 = Qwen2.5-Math-7B). `Catalogue.profiles`
turns it into the `ModelProfile`s the tool-configuration sampler randomises,
exactly as it does the simulated line-up.

Every mistake is a `CatalogueError` of one line naming the file, the model and
the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestra_jax.registry import Registry
from orchestra_jax.tools.config import ModelProfile
from orchestra_jax.tools.experts.protocols import MODEL_FAMILIES
from orchestra_jax.tools.meta_tool_table import META_TOOLS, is_meta_tool

REQUIRED_FIELDS = ("name", "model", "base_url", "price_in", "price_out", "latency_s", "roles")
OPTIONAL_FIELDS = ("api_key_env", "description", "extra_body", "reasoning_model", "family")
ROLE_FIELDS = ("latency_s", "description")

# Alias families beyond each meta-tool's own prefix: family -> the meta-tool it serves.
ROLE_VARIANTS: Registry[str] = Registry("catalogue role")
ROLE_VARIANTS.register("answer-math", "answer")


class CatalogueError(ValueError):
    """A catalogue that cannot be used; the message is one line."""


def catalogue_roles() -> dict[str, str]:
    """role -> meta-tool: every meta-tool's alias prefix, then `ROLE_VARIANTS`."""
    roles = {spec.alias_prefix: name for name, spec in META_TOOLS.items()}
    roles.update(dict(ROLE_VARIANTS.items()))
    return roles


@dataclasses.dataclass(frozen=True)
class RoleEntry:
    """One role of a model: its typical latency and capability sentence in that role."""

    latency_s: float
    description: str


@dataclasses.dataclass(frozen=True)
class CatalogueModel:
    """One expert model (see the module docstring for the fields)."""

    name: str
    model: str
    base_url: str
    api_key_env: str | None
    price_in: float
    price_out: float
    latency_s: float
    roles: Mapping[str, RoleEntry]
    description: str = ""
    extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reasoning_model: bool = False
    family: str = ""  # one of MODEL_FAMILIES, or "" where the file does not say


@dataclasses.dataclass(frozen=True)
class Catalogue:
    """The models of one catalogue file, in file order."""

    path: str
    models: tuple[CatalogueModel, ...]

    def model(self, name: str) -> CatalogueModel:
        for m in self.models:
            if m.name == name:
                return m
        raise CatalogueError(
            f"catalogue {self.path}: no model {name!r}; it has {[m.name for m in self.models]}"
        )

    def models_for(self, tools: Iterable[str]) -> list[CatalogueModel]:
        """The models serving a role of one of `tools` (meta-tool names), in file order."""
        wanted = set(tools)
        roles = catalogue_roles()
        return [m for m in self.models if any(roles[r] in wanted for r in m.roles)]

    def profiles(self, tools: Iterable[str]) -> tuple[ModelProfile, ...]:
        """One `ModelProfile` per (model, role) whose meta-tool is in `tools`.

        Grouped by role in `catalogue_roles()` order, models in file order within
        a role, so unshuffled aliases are numbered as the file lists them.
        """
        wanted = set(tools)
        out = []
        for role, tool in catalogue_roles().items():
            if tool not in wanted:
                continue
            own_prefix = META_TOOLS.get(tool).alias_prefix
            for m in self.models:
                entry = m.roles.get(role)
                if entry is None:
                    continue
                out.append(
                    ModelProfile(
                        tool=tool,
                        backend=m.name,
                        price_in=m.price_in,
                        price_out=m.price_out,
                        latency_s=entry.latency_s,
                        description=entry.description,
                        alias_prefix="" if role == own_prefix else role,
                    )
                )
        return tuple(out)


def _number(value: Any, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CatalogueError(f"{where}: {field} must be a number, got {value!r}")
    if value < 0:
        raise CatalogueError(f"{where}: {field} must be >= 0, got {value!r}")
    return float(value)


def _text(value: Any, where: str, field: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise CatalogueError(f"{where}: {field} must be a non-empty string, got {value!r}")
    return value


def _roles(raw: Any, where: str, latency_s: float, description: str) -> dict[str, RoleEntry]:
    known = catalogue_roles()
    if isinstance(raw, (list, tuple)):
        raw = {role: {} for role in raw}
    if not isinstance(raw, Mapping) or not raw:
        raise CatalogueError(
            f"{where}: roles must be a non-empty list of roles or a mapping role -> "
            f"{{latency_s, description}}, got {raw!r}"
        )
    out = {}
    for role, entry in raw.items():
        if role not in known:
            raise CatalogueError(f"{where}: unknown role {role!r}; roles are {sorted(known)}")
        entry = entry or {}
        if not isinstance(entry, Mapping) or set(entry) - set(ROLE_FIELDS):
            raise CatalogueError(
                f"{where}: role {role!r} takes only {list(ROLE_FIELDS)}, got {entry!r}"
            )
        out[role] = RoleEntry(
            latency_s=_number(entry.get("latency_s", latency_s), where, f"{role}.latency_s"),
            description=_text(
                entry.get("description", description),
                where,
                f"{role}.description",
                required=False,
            ),
        )
    return out


def parse_model(raw: Any, where: str) -> CatalogueModel:
    """One catalogue entry; `where` names it in errors ("file: model 'gpt-5'")."""
    if not isinstance(raw, Mapping):
        raise CatalogueError(f"{where}: each model must be a mapping, got {raw!r}")
    if isinstance(raw.get("name"), str):
        where = f"{where} {raw['name']!r}"
    missing = [f for f in REQUIRED_FIELDS if f not in raw]
    if missing:
        raise CatalogueError(f"{where}: missing field(s) {missing}")
    unknown = sorted(set(raw) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        raise CatalogueError(
            f"{where}: unknown field(s) {unknown}; fields are "
            f"{list(REQUIRED_FIELDS) + list(OPTIONAL_FIELDS)}"
        )
    base_url = _text(raw["base_url"], where, "base_url")
    if not base_url.startswith(("http://", "https://")):
        raise CatalogueError(
            f"{where}: base_url must start with http:// or https://, got {base_url!r}"
        )
    extra_body = raw.get("extra_body") or {}
    if not isinstance(extra_body, Mapping):
        raise CatalogueError(f"{where}: extra_body must be a mapping, got {extra_body!r}")
    reasoning_model = raw.get("reasoning_model", False)
    if not isinstance(reasoning_model, bool):
        raise CatalogueError(
            f"{where}: reasoning_model must be true or false, got {reasoning_model!r}"
        )
    family = raw.get("family") or ""
    if family and family not in MODEL_FAMILIES:
        raise CatalogueError(
            f"{where}: family must be one of {list(MODEL_FAMILIES)}, got {raw['family']!r}"
        )
    latency_s = _number(raw["latency_s"], where, "latency_s")
    description = _text(raw.get("description"), where, "description", required=False)
    return CatalogueModel(
        name=_text(raw["name"], where, "name"),
        model=_text(raw["model"], where, "model"),
        base_url=base_url,
        api_key_env=_text(raw.get("api_key_env"), where, "api_key_env", required=False) or None,
        price_in=_number(raw["price_in"], where, "price_in"),
        price_out=_number(raw["price_out"], where, "price_out"),
        latency_s=latency_s,
        roles=_roles(raw["roles"], where, latency_s, description),
        description=description,
        extra_body=dict(extra_body),
        reasoning_model=reasoning_model,
        family=family,
    )


def parse_catalogue(data: Any, path: str) -> Catalogue:
    """A catalogue from its decoded file contents."""
    if not isinstance(data, Mapping) or not isinstance(data.get("models"), list):
        raise CatalogueError(f"catalogue {path}: want a mapping with a 'models' list")
    if not data["models"]:
        raise CatalogueError(f"catalogue {path}: 'models' is empty")
    models = tuple(
        parse_model(raw, f"catalogue {path}: model #{i + 1}")
        for i, raw in enumerate(data["models"])
    )
    names = [m.name for m in models]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CatalogueError(f"catalogue {path}: duplicate model name(s) {duplicates}")
    return Catalogue(path=path, models=models)


def load_catalogue(path: str | os.PathLike) -> Catalogue:
    """Reads and checks a catalogue file (`.yaml`/`.yml` or `.json`)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise CatalogueError(f"catalogue {path}: cannot read it ({e.strerror})") from None
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except ValueError as e:  # json.JSONDecodeError and yaml.YAMLError's messages
        raise CatalogueError(f"catalogue {path}: not valid: {e}".splitlines()[0]) from None
    except Exception as e:  # yaml.YAMLError is not a ValueError
        raise CatalogueError(f"catalogue {path}: not valid YAML: {e}".splitlines()[0]) from None
    return parse_catalogue(data, path)


def check_roles_cover(catalogue: Catalogue, tools: Sequence[str]) -> list[str]:
    """One message per enabled meta-tool that no catalogue model serves."""
    served = {p.tool for p in catalogue.profiles(tools)}
    return [
        f"catalogue {catalogue.path}: no model serves meta-tool {tool!r}"
        for tool in tools
        if is_meta_tool(tool) and tool not in served
    ]


def missing_families(models: Iterable[CatalogueModel]) -> list[str]:
    """One message per model that states no `family`."""
    return [
        f"model {m.name!r} states no family (one of {list(MODEL_FAMILIES)})"
        for m in models
        if not m.family
    ]


def missing_api_keys(models: Iterable[CatalogueModel]) -> list[str]:
    """One message per model whose `api_key_env` variable is unset or empty."""
    return [
        f"model {m.name!r} reads its API key from ${m.api_key_env}, which is not set"
        for m in models
        if m.api_key_env and not os.environ.get(m.api_key_env)
    ]
