"""The `tools` section of an experiment config as `ToolsConfig`: which tools a task
offers and how they are described, priced and served, the ranges each task's tool
configuration is drawn from, the experts' and the code sandbox's settings, checked
once (`problems`). What serves each tool against the environment and the data
(`tools/live_backends.backend_config_problems`) and the search's pricing against the
environment are rules between sections (training/experiment_config.py). Not to be
confused with `tools/config.ToolConfig`, one task's tool configuration."""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestra_jax.config_section import Section
from orchestra_jax.tools.config_sampler import SamplerRanges
from orchestra_jax.tools.descriptions import DESCRIPTION_STYLES
from orchestra_jax.tools.enabled import enabled_tools
from orchestra_jax.tools.retrieval.retrievers import DOCUMENT_TEXTS
from orchestra_jax.tools.retrieval.search_pricing import SEARCH_PRICINGS
from orchestra_jax.tools.sandbox.registry import sandbox_config_errors


@dataclasses.dataclass(frozen=True)
class ToolsConfig(Section):
    """`tools.*`, named as in the config file (experiments/configs/grpo_hle.py says
    what each field does)."""

    SECTION = "tools"

    enabled: str = "search,enhance_reasoning,answer"
    backends: str = "offline"
    catalogue: str = ""
    experts: str = "project"
    search: str = "index"
    search_index: str = ""
    search_min_docs: int = 3
    search_top_k: int = 3
    search_pricing: str = "per_document"
    search_price_per_query: float = 0.01
    search_price_per_document: float = 0.002
    document_text: str = "title_text"
    description_style: str = "full"
    sandbox: str = "auto"
    code_is_trusted: bool = False
    memoize_code: bool = False
    charge_measured_time: bool = True
    sleep_scale: float = 0.0
    expert_max_tokens: int = 2048
    expert_retries: int = 3
    expert_temperature: float = 0.0
    expert_timeout_s: float = 600.0
    randomize: bool = True
    price_scale_min: float = 0.5
    price_scale_max: float = 2.0
    latency_scale_min: float = 0.5
    latency_scale_max: float = 2.0
    keep_probability: float = 0.75
    shuffle_aliases: bool = True
    cost_weight_max: float = 1.0
    latency_weight_max: float = 1.0
    efficiency_off_prob: float = 0.2
    preference_prob: float = 0.2

    def problems(self) -> list[str]:
        errors = sandbox_config_errors(self.sandbox, self.code_is_trusted)
        try:
            enabled_tools(self.enabled)
        except ValueError as e:
            errors.append(f"tools.enabled: {e}")
        errors += self.choice("description_style", DESCRIPTION_STYLES)
        errors += self.choice("document_text", DOCUMENT_TEXTS)
        errors += self.choice("search_pricing", SEARCH_PRICINGS)
        for lo, hi in (
            ("price_scale_min", "price_scale_max"),
            ("latency_scale_min", "latency_scale_max"),
        ):
            low, high = getattr(self, lo), getattr(self, hi)
            if not 0 < low <= high:
                errors.append(f"tools.{lo}/{hi}: need 0 < min <= max, got {low}, {high}")
        for name in ("keep_probability", "preference_prob", "efficiency_off_prob"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                errors.append(f"tools.{name} must be a probability, got {value}")
        errors += self.positive(
            "search_top_k", "search_min_docs", "expert_max_tokens", "expert_timeout_s"
        )
        errors += self.positive(
            "expert_retries",
            "expert_temperature",
            "search_price_per_query",
            "search_price_per_document",
            allow_zero=True,
        )
        return errors

    def tool_config_fields(self) -> dict[str, Any]:
        """`ToolConfig` fields every task's configuration gets: the enabled tools, the
        description style, the documents per search and the search's prices."""
        return dict(
            tools=enabled_tools(self.enabled),
            description_style=self.description_style,
            search_top_k=self.search_top_k,
            search_price_per_query=self.search_price_per_query,
            search_price_per_document=self.search_price_per_document,
            document_text=self.document_text,
        )

    def sampler_ranges(self) -> SamplerRanges:
        """The ranges each training task's tool configuration is drawn from."""
        return SamplerRanges(
            price_scale=(self.price_scale_min, self.price_scale_max),
            latency_scale=(self.latency_scale_min, self.latency_scale_max),
            keep_probability=self.keep_probability,
            shuffle_aliases=self.shuffle_aliases,
            cost_weight=(0.0, self.cost_weight_max),
            latency_weight=(0.0, self.latency_weight_max),
            efficiency_off_probability=self.efficiency_off_prob,
            tool_preference_probability=self.preference_prob,
            randomize=self.randomize,
        )
