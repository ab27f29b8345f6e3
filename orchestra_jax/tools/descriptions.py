"""What the orchestrator reads about its tools: schemas, price tables, preferences.

The meta-tools follow the paper's release: each has one `model` argument naming
an alias; the argument's description lists the choices, one capability sentence
per alias, and a table of price per million input/output tokens and average
latency. Each meta-tool's description and argument wording are its entry of
`meta_tool_table.META_TOOLS`. The wording here is this project's own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orchestra_jax.tools.base import function_schema
from orchestra_jax.tools.meta_tool_table import META_TOOLS

TABLE_HEADER = (
    "Model | price per million input tokens | price per million output tokens | average latency"
)


def format_price(usd: float) -> str:
    """`$1.25`, `$10`, `$0.0123`: three significant digits, no trailing zeros."""
    return f"${usd:.3g}"


def format_latency(seconds: float) -> str:
    """`22s` for >= 10 s, `2.5s` below, as a reader would round it."""
    return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.2g}s"


def price_table(rows: Iterable[Any]) -> str:
    """The alias table; rows have `alias`, `price_in`, `price_out`, `latency_s`."""
    lines = [TABLE_HEADER]
    for r in rows:
        lines.append(
            f"{r.alias} | {format_price(r.price_in)} | "
            f"{format_price(r.price_out)} | {format_latency(r.latency_s)}"
        )
    return "\n".join(lines)


DESCRIPTION_STYLES = ("full", "compact")


def compact_model_doc(aliases: list[Any]) -> str:
    """One line per tool: `Choices (USD per million input/output tokens, latency):
    search-1 $1.2/$10 22s; search-2 $0.1/$0.1 6s.` (two significant digits)."""
    rows = "; ".join(
        f"{a.alias} ${a.price_in:.2g}/${a.price_out:.2g} {a.latency_s:.0f}s" for a in aliases
    )
    return f"Choices (USD per million input/output tokens, latency): {rows}."


def meta_tool_schema(tool: str, aliases: list[Any], style: str = "full") -> dict[str, Any]:
    """OpenAI schema of a meta-tool whose `model` argument lists `aliases`.

    style "full" is the paper's: capability sentences and a price/latency table.
    "compact" keeps only the first sentence of the tool description and one line
    of prices and latencies: about a third of the tokens, for small CPU demos
    where the prompt dominates the cost of every step.
    """
    if tool not in META_TOOLS:
        raise ValueError(f"unknown meta-tool {tool!r}; known: {META_TOOLS.names()}")
    spec = META_TOOLS.get(tool)
    if not aliases:
        raise ValueError(f"meta-tool {tool!r} needs at least one model alias")
    if style not in DESCRIPTION_STYLES:
        raise ValueError(f"description style must be one of {DESCRIPTION_STYLES}, got {style!r}")
    names = [a.alias for a in aliases]
    if style == "compact":
        return function_schema(
            tool,
            spec.description.split(". ")[0].rstrip(".") + ".",
            {"model": {"type": "string", "enum": names, "description": compact_model_doc(aliases)}},
            ["model"],
        )
    blurbs = " ".join(f"{a.alias} {a.description}".rstrip() + "." for a in aliases if a.description)
    model_doc = (
        f"The model used to {spec.argument_wording}. Choices: {names}. {blurbs}".rstrip()
        + "\nThe table below shows the pricing and latency of each "
        "model:\n" + price_table(aliases)
    )
    return function_schema(
        tool,
        spec.description,
        {"model": {"type": "string", "enum": names, "description": model_doc}},
        ["model"],
    )


def feature_phrase(feature: str, weight: float) -> str:
    """One preference feature in words, e.g. `low cost (weight 0.5)`."""
    if feature == "accuracy":
        what = "a correct answer"
    elif feature == "cost":
        what = "low total cost"
    elif feature == "latency":
        what = "low total latency"
    elif feature.startswith("tool:"):
        name = feature[len("tool:") :]
        what = f"using {name}" if weight >= 0 else f"avoiding {name}"
        weight = abs(weight)
    else:
        raise ValueError(f"unknown preference feature {feature!r}")
    return f"{what} (weight {weight:g})"


def preference_wording(preference: dict[str, float]) -> str:
    """The user's preference vector stated in words for the system prompt."""
    active = [(f, w) for f, w in preference.items() if w != 0]
    if not active:
        return "The user states no preferences beyond solving the task."
    parts = "; ".join(feature_phrase(f, w) for f, w in active)
    return (
        "The user's preferences for this task, with weights (higher means "
        f"more important): {parts}. Choose tools and models accordingly."
    )
