"""Cost formulas (pure functions). All prices are in US dollars.

Token prices are quoted per million tokens, as in the paper's tables.
"""

from __future__ import annotations

TOKENS_PER_PRICE_UNIT = 1_000_000

# The paper's release: code execution $0.0000083 per second; web search $0.01
# per query plus $0.002 per returned document.
CODE_PRICE_PER_SECOND = 0.0000083
SEARCH_PRICE_PER_QUERY = 0.01
SEARCH_PRICE_PER_DOCUMENT = 0.002
# The orchestrator's own tokens are charged at a hosted Qwen3-8B price
# (USD per million tokens, input and output alike); a config field overrides it.
QWEN3_8B_PRICE_PER_MILLION = 0.2


def token_cost(
    prompt_tokens: int, completion_tokens: int, price_in: float, price_out: float
) -> float:
    """cost = (prompt_tokens * price_in + completion_tokens * price_out) / 1e6."""
    if prompt_tokens < 0 or completion_tokens < 0:
        raise ValueError(
            f"token counts must be non-negative, got {prompt_tokens}, {completion_tokens}"
        )
    return (prompt_tokens * price_in + completion_tokens * price_out) / TOKENS_PER_PRICE_UNIT


def code_cost(seconds: float, price_per_second: float) -> float:
    """cost = seconds * price_per_second (wall seconds of sandboxed execution)."""
    return max(seconds, 0.0) * price_per_second


def search_cost(num_documents: int, price_per_query: float, price_per_document: float) -> float:
    """cost = price_per_query + num_documents * price_per_document (one query)."""
    return price_per_query + num_documents * price_per_document
