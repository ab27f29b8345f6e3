"""Web search through the Tavily API as a `Retriever`.

Needs an API key in an environment variable (TAVILY_API_KEY by default);
construction fails with a clear message when it is missing. Documents are the
results' `content`, their id is the URL. Billing follows the search tool's
per-query/per-document prices in the ToolConfig.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Collection

from orchestra_jax.tools.retrieval.retrievers import Document

TAVILY_URL = "https://api.tavily.com/search"


class WebSearchError(RuntimeError):
    """The web-search backend is unusable or failed."""


class TavilyRetriever:
    """`search(query, k, allowed_ids)`: Tavily results; `allowed_ids` keeps
    only results whose URL is listed (the API itself cannot restrict)."""

    def __init__(
        self,
        *,
        api_key_env: str = "TAVILY_API_KEY",
        search_depth: str = "basic",
        timeout: float = 30.0,
        url: str = TAVILY_URL,
    ):
        self.api_key = os.environ.get(api_key_env)
        if not self.api_key:
            raise WebSearchError(
                f"Tavily web search needs an API key in the environment variable "
                f"{api_key_env}, which is not set; use a local index "
                "(python -m orchestra_jax.tools.build_index) for offline runs"
            )
        self.search_depth, self.timeout, self.url = search_depth, timeout, url

    def search(
        self, query: str, k: int, allowed_ids: Collection[str] | None = None
    ) -> list[Document]:
        body = json.dumps(
            {"query": query, "max_results": k, "search_depth": self.search_depth}
        ).encode()
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                data = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise WebSearchError(f"Tavily search failed: {e}") from e
        docs = [
            Document(
                id=r.get("url", ""),
                title=r.get("title", ""),
                text=r.get("content", ""),
                score=float(r.get("score", 0)),
            )
            for r in data.get("results", [])
        ]
        if allowed_ids is not None:
            allowed = set(allowed_ids)
            docs = [d for d in docs if d.id in allowed]
        return docs[:k]
