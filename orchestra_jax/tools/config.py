"""ToolConfig: which tools and models a task offers, what they cost, what the user wants.

In the paper every training task comes with its own tool set: which model
aliases exist (`search-1`, `reasoner-2`, …), which backend each alias maps to,
their prices and latencies, and a preference vector. `ToolConfigSampler`
randomises all of these per task within configured ranges, so the policy must
read the descriptions instead of memorising names; `fixed_eval_configs` gives
held-out configurations whose prices lie outside the training ranges.

Preference features (shared with rewards and metrics): "accuracy", "cost",
"latency", and "tool:<alias or plain tool name>".

`ToolConfigSampler`, `SamplerRanges` and `fixed_eval_configs` live in
`config_sampler.py` (to keep each file readable) and are re-exported here
lazily (a module `__getattr__`, since config_sampler imports this module).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from orchestra_jax.tools import descriptions, function_tools, pricing
from orchestra_jax.tools.meta_tool_table import META_TOOLS, PAPER_META_TOOLS, is_meta_tool
from orchestra_jax.tools.retrieval.retrievers import DOCUMENT_TEXTS

BASE_FEATURES = ("accuracy", "cost", "latency")

SYSTEM_PROMPT_HEAD = (
    "You are an orchestrator: you solve the user's task by calling the tools "
    "below. Search retrieves documents, enhance_reasoning runs code written by "
    "a model, and answer ends the task with a model's final answer. Each model "
    "alias has its own price and latency."
)


@dataclasses.dataclass(frozen=True)
class ModelAlias:
    """One model choice of a meta-tool as the orchestrator sees it.

    Attributes:
      alias: the name in the schema ("reasoner-2").
      tool: the meta-tool it belongs to ("enhance_reasoning").
      backend: key of the expert backend that serves it (`Backends.experts`).
      price_in / price_out: USD per million input / output tokens (charged).
      latency_s: typical latency written into the description.
      description: capability sentence following the alias name.
    """

    alias: str
    tool: str
    backend: str
    price_in: float
    price_out: float
    latency_s: float
    description: str = ""

    def __post_init__(self):
        if not is_meta_tool(self.tool):
            raise ValueError(
                f"alias {self.alias!r}: tool must be a meta-tool {META_TOOLS.names()}, "
                f"got {self.tool!r}"
            )
        if min(self.price_in, self.price_out, self.latency_s) < 0:
            raise ValueError(f"alias {self.alias!r}: prices and latency must be non-negative")


@dataclasses.dataclass(frozen=True)
class ToolConfig:
    """The tools, prices and preferences of one task.

    Attributes:
      aliases: model choices of the meta-tools.
      tools: enabled tool names, meta-tools and plain tools ("python", or a name
        registered with `function_tools.register_function_tool`).
      preference: weights over feature names (see module docstring).
      preference_text: the preference in words; None renders it from the weights,
        "" states none (the system prompt is the head alone).
      code_price_per_s: USD per second of sandboxed code execution.
      search_price_per_query / search_price_per_document: USD per search call.
      search_top_k: documents returned per search.
      code_timeout_s: wall-time limit of one sandboxed run.
      orchestrator_price: USD per million orchestrator tokens (Qwen3-8B price).
      name: a label for logs ("sampled", "heldout_expensive", …).
      description_style: "full" (the paper's capability sentences and price
        table) or "compact" (one line of prices; see `descriptions`).
      document_text: how a retrieved document reads (`retrieval.DOCUMENT_TEXTS`).
    """

    aliases: tuple[ModelAlias, ...]
    tools: tuple[str, ...] = PAPER_META_TOOLS
    preference: dict[str, float] = dataclasses.field(default_factory=lambda: {"accuracy": 1.0})
    preference_text: str | None = None
    code_price_per_s: float = pricing.CODE_PRICE_PER_SECOND
    search_price_per_query: float = pricing.SEARCH_PRICE_PER_QUERY
    search_price_per_document: float = pricing.SEARCH_PRICE_PER_DOCUMENT
    search_top_k: int = 3
    code_timeout_s: float = 10.0
    orchestrator_price: float = pricing.QWEN3_8B_PRICE_PER_MILLION
    name: str = ""
    description_style: str = "full"
    document_text: str = "title_text"

    def __post_init__(self):
        object.__setattr__(self, "aliases", tuple(self.aliases))
        object.__setattr__(self, "tools", tuple(self.tools))
        names = [a.alias for a in self.aliases]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate model aliases: {names}")
        for tool in self.tools:
            if is_meta_tool(tool):
                if not self.aliases_for(tool):
                    raise ValueError(f"tool {tool!r} is enabled but has no alias")
            elif not function_tools.is_plain_tool(tool):
                raise ValueError(
                    f"unknown tool {tool!r}; meta-tools {META_TOOLS.names()}, "
                    f"plain tools {function_tools.plain_tool_names()}"
                )
        valid = set(self.feature_names())
        unknown = sorted(set(self.preference) - valid)
        if unknown:
            raise ValueError(
                f"preference features {unknown} are not available; valid: {sorted(valid)}"
            )
        if self.description_style not in descriptions.DESCRIPTION_STYLES:
            raise ValueError(
                f"description_style must be one of "
                f"{descriptions.DESCRIPTION_STYLES}, got {self.description_style!r}"
            )
        if self.document_text not in DOCUMENT_TEXTS:
            raise ValueError(
                f"document_text must be one of {DOCUMENT_TEXTS}, got {self.document_text!r}"
            )
        if self.search_top_k < 1 or self.code_timeout_s <= 0:
            raise ValueError("search_top_k must be >= 1 and code_timeout_s > 0")

    def aliases_for(self, tool: str) -> list[ModelAlias]:
        """The aliases of one meta-tool, in schema order."""
        return [a for a in self.aliases if a.tool == tool]

    def alias(self, name: str) -> ModelAlias:
        """Looks an alias up; raises KeyError naming the valid ones."""
        for a in self.aliases:
            if a.alias == name:
                return a
        raise KeyError(
            f"unknown model alias {name!r}; available: {[a.alias for a in self.aliases]}"
        )

    def feature_names(self) -> list[str]:
        """ "accuracy", "cost", "latency", then "tool:<x>" per alias and plain tool."""
        tools = [f"tool:{a.alias}" for a in self.aliases if a.tool in self.tools]
        tools += [f"tool:{t}" for t in self.tools if not is_meta_tool(t)]
        return list(BASE_FEATURES) + tools

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of the enabled tools, price tables included."""
        out = []
        for tool in self.tools:
            if is_meta_tool(tool):
                out.append(
                    descriptions.meta_tool_schema(
                        tool, self.aliases_for(tool), self.description_style
                    )
                )
            else:
                out.append(function_tools.plain_tool_schema(tool))
        return out

    def system_prompt(self, head: str = SYSTEM_PROMPT_HEAD) -> str:
        """The system prompt: the orchestrator's role (`head`; a conversation's
        environment gives its own, e.g. a τ² domain policy) and the user's preferences
        (none where `preference_text` is "")."""
        wording = self.preference_text
        if wording is None:
            wording = descriptions.preference_wording(self.preference)
        return f"{head}\n\n{wording}" if wording else head

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["aliases"] = [dataclasses.asdict(a) for a in self.aliases]
        d["tools"] = list(self.tools)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolConfig:
        d = dict(d)
        d["aliases"] = tuple(ModelAlias(**a) for a in d["aliases"])
        d["tools"] = tuple(d.get("tools", PAPER_META_TOOLS))
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """A backend model the sampler may offer under a meta-tool, at base prices.

    `alias_prefix` names its aliases `<prefix>-<n>`; empty: the meta-tool's own
    (`search`, `reasoner`, `answer`), else a family of its own within the tool
    (the paper's `answer-math-1` is an `answer` alias of family "answer-math").
    """

    tool: str
    backend: str
    price_in: float
    price_out: float
    latency_s: float
    description: str = ""
    alias_prefix: str = ""


def alias_from_profile(
    profile: ModelProfile, alias: str, price_scale: float, latency_scale: float
) -> ModelAlias:
    """Scales a profile's prices and latency; prices keep 3 significant digits
    so the rendered table is exactly what is charged."""
    return ModelAlias(
        alias=alias,
        tool=profile.tool,
        backend=profile.backend,
        price_in=float(f"{profile.price_in * price_scale:.3g}"),
        price_out=float(f"{profile.price_out * price_scale:.3g}"),
        latency_s=float(f"{profile.latency_s * latency_scale:.3g}"),
        description=profile.description,
    )


def aliases_from_profiles(
    profiles: Sequence[ModelProfile], price_scales: Sequence[float], latency_scales: Sequence[float]
) -> tuple[ModelAlias, ...]:
    """Names profiles `<prefix>-1..n` per alias family (the profile's `alias_prefix`,
    else its meta-tool's) in the given order."""
    counters: dict[str, int] = {}
    out = []
    for p, ps, ls in zip(profiles, price_scales, latency_scales):
        prefix = p.alias_prefix or META_TOOLS.get(p.tool).alias_prefix
        counters[prefix] = counters.get(prefix, 0) + 1
        out.append(alias_from_profile(p, f"{prefix}-{counters[prefix]}", ps, ls))
    return tuple(out)
