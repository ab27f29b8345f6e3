"""Which backend serves each tool, from config: simulated or live experts, the search index.

`tools.backends` names the experts behind each meta-tool:

    "offline"              every meta-tool's aliases are simulated experts
                           (`tools/simulated_expert.py`), which read the task's
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

Code always runs in the sandbox `tools.sandbox`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from orchestra_jax.tools.catalogue import CatalogueModel
from orchestra_jax.tools.experts import OpenAIChatExpert, probe_endpoint
from orchestra_jax.tools.meta_tool_table import is_meta_tool
from orchestra_jax.tools.retrieval import FallbackRetriever, Retriever, load_retriever

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
        from orchestra_jax.tools.web_search import TavilyRetriever

        return TavilyRetriever()
    if not index_path:
        raise ValueError(
            f"tools.search={kind!r} needs tools.search_index (an index folder built by "
            "python -m orchestra_jax.tools.build_index)"
        )
    index = load_retriever(index_path)
    if kind == "index":
        return index
    from orchestra_jax.tools.web_search import TavilyRetriever

    return FallbackRetriever(index, TavilyRetriever(), min_docs=min_docs)
