"""Which backend serves each tool, from config: simulated or live experts, the search index.

`tools.backends` names the experts behind each meta-tool:

    "offline"              every meta-tool's aliases are simulated experts
                           (`tools/experts/simulated.py`), which read the task's
                           gold answer: synthetic data only (a config check)
    "live"                 every meta-tool's aliases are the catalogue's models
                           (`tools.catalogue`), called over HTTP (`OpenAIChatExpert`)
    "live,answer=offline"  a default, then per-meta-tool overrides

`tools.search` names the retrieval behind `search`:

    "index"         a local BM25 or faiss index folder (`tools.search_index`, built
                    by `python -m orchestra_jax.tools.build_index`)
    "tavily"        Tavily web search (TAVILY_API_KEY)
    "index+tavily"  the index, topped up from Tavily when fewer than
                    `tools.search_min_docs` hits survive a question's whitelist

`tools.experts` names how the experts are asked (`tools/experts/protocols.py`); a
protocol that asks by model family ("reference") needs every live model's
catalogue `family`, and live experts only.

Code always runs in the sandbox `tools.sandbox`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from orchestra_jax.tools.enabled import enabled_tools
from orchestra_jax.tools.experts.catalogue import (
    CatalogueError,
    CatalogueModel,
    check_roles_cover,
    load_catalogue,
    missing_api_keys,
    missing_families,
)
from orchestra_jax.tools.experts.client import OpenAIChatExpert, probe_endpoint
from orchestra_jax.tools.experts.protocols import EXPERT_PROTOCOLS
from orchestra_jax.tools.meta_tool_table import is_meta_tool
from orchestra_jax.tools.retrieval.index_folder import load_retriever
from orchestra_jax.tools.retrieval.retrievers import FallbackRetriever, Retriever
from orchestra_jax.tools.tools_config import ToolsConfig

BACKEND_KINDS = ("offline", "live")
SEARCH_BACKENDS = ("index", "tavily", "index+tavily")


def parse_backends(spec: str, tools: Sequence[str]) -> dict[str, str]:
    """`tools.backends` -> {meta-tool: "offline" | "live"} over the meta-tools of `tools`.

    The first item without "=" is the default; "tool=kind" items override it.
    ValueError (one line) for an unknown kind, an override of a tool that is not
    an enabled meta-tool, or no default.
    """
    meta = [t for t in tools if is_meta_tool(t)]
    default, overrides = None, {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        tool, sep, kind = item.partition("=")
        if not sep:
            tool, kind = "", item
        if kind not in BACKEND_KINDS:
            raise ValueError(f"tools.backends: kind {kind!r} must be one of {BACKEND_KINDS}")
        if not tool:
            if default is not None:
                raise ValueError(f"tools.backends: two defaults in {spec!r}")
            default = kind
        elif tool not in meta:
            raise ValueError(
                f"tools.backends: {tool!r} is not an enabled meta-tool (enabled: {meta})"
            )
        else:
            overrides[tool.strip()] = kind
    if default is None:
        raise ValueError(
            f"tools.backends: {spec!r} names no default kind (e.g. 'live' or 'live,answer=offline')"
        )
    return {t: overrides.get(t, default) for t in meta}


def tools_of_kind(kinds: dict[str, str], kind: str) -> list[str]:
    return [t for t, k in kinds.items() if k == kind]


def make_live_experts(
    models: Iterable[CatalogueModel],
    *,
    retries: int = 3,
    timeout_s: float = 600.0,
    max_concurrency: int = 16,
) -> dict[str, OpenAIChatExpert]:
    """One HTTP client per catalogue model, keyed by its name (the aliases' backend).

    Raises `ExpertError` when a model's API-key variable is unset.
    """
    return {
        m.name: OpenAIChatExpert(
            m.base_url,
            m.model,
            api_key_env=m.api_key_env,
            retries=retries,
            timeout=timeout_s,
            max_concurrency=max_concurrency,
            extra_body=dict(m.extra_body),
            name=m.name,
            reasoning_model=m.reasoning_model,
        )
        for m in models
    }


def unreachable_endpoints(
    models: Iterable[CatalogueModel], *, timeout_s: float = 10.0
) -> list[str]:
    """One message per distinct base URL of `models` that does not answer, naming its models."""
    by_url: dict[str, list[CatalogueModel]] = {}
    for m in models:
        by_url.setdefault(m.base_url, []).append(m)
    problems = []
    for url, served in by_url.items():
        problem = probe_endpoint(url, api_key_env=served[0].api_key_env, timeout_s=timeout_s)
        if problem:
            names = ", ".join(repr(m.name) for m in served)
            problems.append(f"expert endpoint of {names}: {problem}")
    return problems


def make_retriever(kind: str, index_path: str = "", *, min_docs: int = 3) -> Retriever:
    """The retriever `tools.search` names (see the module docstring)."""
    if kind not in SEARCH_BACKENDS:
        raise ValueError(f"tools.search must be one of {SEARCH_BACKENDS}, got {kind!r}")
    if kind == "tavily":
        from orchestra_jax.tools.retrieval.web_search import TavilyRetriever

        return TavilyRetriever()
    if not index_path:
        raise ValueError(
            f"tools.search={kind!r} needs tools.search_index (an index folder built by "
            "python -m orchestra_jax.tools.build_index)"
        )
    index = load_retriever(index_path)
    if kind == "index":
        return index
    from orchestra_jax.tools.retrieval.web_search import TavilyRetriever

    return FallbackRetriever(index, TavilyRetriever(), min_docs=min_docs)


# Readers whose tasks name the environment that plays them (`metadata["env"]`); the
# tasks of every other file source go to the run's (default) environment.
SELF_ROUTED_SOURCES = ("tau2", "toolscale")
KNOWN_ENVS = ("synthetic", "qa", "tau2")


def backend_config_problems(
    t: ToolsConfig, played: Sequence[str], file_sources: Sequence[str]
) -> list[str]:
    """One message per problem of tools.backends, tools.catalogue, tools.search* (the
    `tools` section `t`) against the run's environments and data: what serves each
    tool, and that no simulated expert (which reads the gold answer) meets the tasks
    of `file_sources` (non-synthetic data): neither the simulated experts of
    "offline" tools nor the synthetic world, where it is the environment that plays
    those tasks. `played`: the environments that play the run's tasks
    (`envs/config.EnvConfig.played`), the first of them the default."""
    try:
        tools = enabled_tools(t.enabled)
        kinds = parse_backends(t.backends, tools)
    except ValueError as e:
        return [str(e)]
    errors = []
    offline = tools_of_kind(kinds, "offline")
    live = tools_of_kind(kinds, "live")
    protocol_problem = EXPERT_PROTOCOLS.problem(t.experts)
    if protocol_problem:
        errors.append(f"tools.experts: {protocol_problem}")
    by_family = not protocol_problem and EXPERT_PROTOCOLS.get(t.experts).needs_family
    if by_family and offline:
        errors.append(
            f"tools.experts={t.experts!r} asks each expert by its catalogue family; the "
            f"simulated experts of {offline} have none: set tools.backends='live'"
        )
    default = played[0] if played else None
    real_data = [s for s in file_sources if s not in SELF_ROUTED_SOURCES]
    if real_data and (offline or default == "synthetic"):
        experts = (
            f"the simulated experts of {offline}"
            if offline
            else f"the synthetic world (env {default!r}, which plays those tasks)"
        )
        errors.append(
            f"tools.backends: {experts} read the gold answer and may serve synthetic "
            f"data only, but data.sources has {real_data}: set tools.backends='live' "
            "(env.name='qa')"
        )
    if "qa" not in played and set(played) <= set(KNOWN_ENVS):
        # No environment here reads tools.backends or tools.search: say so, not ignore it.
        if live:
            errors.append(
                f"tools.backends: {live} live needs env.name='qa' (or 'qa' among "
                f"env.members); {played} run their own experts"
            )
        if t.experts != "project":
            errors.append(
                f"tools.experts={t.experts!r}: only env.name='qa' reads it; {played} "
                "ask their own experts"
            )
        if t.search != "index" or t.search_index:
            errors.append(
                "tools.search / tools.search_index: only env.name='qa' reads them; the "
                "synthetic world searches its own corpus"
            )
        return errors
    if "qa" not in played:  # an environment of one's own reads what it needs
        return errors
    if live:
        try:
            catalogue = load_catalogue(t.catalogue)
            errors += check_roles_cover(catalogue, live)
            errors += [
                f"tools.catalogue: {m}" for m in missing_api_keys(catalogue.models_for(live))
            ]
            if by_family:
                errors += [
                    f"tools.catalogue: {m}, which tools.experts={t.experts!r} needs"
                    for m in missing_families(catalogue.models_for(live))
                ]
        except CatalogueError as e:
            errors.append(f"tools.catalogue: {e}")
    if "search" in tools:
        if t.search not in SEARCH_BACKENDS:
            errors.append(f"tools.search must be one of {SEARCH_BACKENDS}, got {t.search!r}")
        if "index" in t.search.split("+") and not os.path.isfile(
            os.path.join(t.search_index, "manifest.json")
        ):
            errors.append(
                f"tools.search_index: {t.search_index!r} is not an index folder (build one "
                "with python -m orchestra_jax.tools.build_index --corpus docs.jsonl --out DIR)"
            )
        if "tavily" in t.search.split("+") and not os.environ.get("TAVILY_API_KEY"):
            errors.append(f"tools.search={t.search!r}: $TAVILY_API_KEY is not set")
    return errors
