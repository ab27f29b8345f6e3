"""What one search costs: `tools.search_pricing`, resolved for the run's engine.

    per_document  price_per_query + documents returned × price_per_document
                  (the project's default; `pricing.search_cost`)
    reference     as the release's `call_tool` charges it (training/lead_agent/
                  llm_agent/generation_quick3.py 563-567):
                    a web engine ("tavily", "index+tavily"): price_per_query
                      (Tavily's search, $0.01) + top_k × price_per_document
                      (its extract, $0.002), whatever came back;
                    a local index ("index"): the query's tokens (the orchestrator's
                      tokenizer) × the orchestrator's input price.

`SEARCH_PRICINGS` names the choices; `SearchCharge` is the resolved rule a run's
search tool applies (`Backends.search_charge`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from orchestra_jax.tools import pricing

SEARCH_PRICINGS = ("per_document", "reference")
CHARGE_MODES = ("per_document", "web", "local")


@dataclasses.dataclass(frozen=True)
class SearchCharge:
    """The rule one search is charged by (module docstring). `count_tokens` counts
    a query's tokens; mode "local" needs it."""

    mode: str = "per_document"
    count_tokens: Callable[[str], int] | None = None

    def __post_init__(self):
        if self.mode not in CHARGE_MODES:
            raise ValueError(f"search charge mode must be one of {CHARGE_MODES}, got {self.mode!r}")
        if self.mode == "local" and self.count_tokens is None:
            raise ValueError("a local index's search charge counts the query's tokens")

    def cost(self, query: str, num_documents: int, tool_config: Any) -> float:
        """USD for one search of `query` that returned `num_documents`."""
        c = tool_config
        if self.mode == "web":
            return c.search_price_per_query + c.search_top_k * c.search_price_per_document
        if self.mode == "local":
            assert self.count_tokens is not None
            return self.count_tokens(query) * c.orchestrator_price / pricing.TOKENS_PER_PRICE_UNIT
        return pricing.search_cost(
            num_documents, c.search_price_per_query, c.search_price_per_document
        )


PER_DOCUMENT = SearchCharge()


def search_charge(
    search_pricing: str, engine: str, count_tokens: Callable[[str], int] | None = None
) -> SearchCharge:
    """The rule of `tools.search_pricing` for the engine `tools.search`."""
    if search_pricing not in SEARCH_PRICINGS:
        raise ValueError(
            f"tools.search_pricing must be one of {SEARCH_PRICINGS}, got {search_pricing!r}"
        )
    if search_pricing == "per_document":
        return SearchCharge()
    if "tavily" in engine:
        return SearchCharge("web")
    return SearchCharge("local", count_tokens)
