"""Per-task randomisation of tools, aliases, prices and preferences.

Training draws a fresh `ToolConfig` per task (the paper's `tool_pricing` and
`model_mapping`): each backend profile is offered with probability
`keep_probability` (at least one per meta-tool), the kept profiles are shuffled
before they are named `search-1`, `reasoner-2`, … (so a name says nothing about
quality), prices and latencies are scaled by log-uniform factors, and the
preference vector is sampled. With `SamplerRanges.randomize` False every task
gets one configuration instead, `ToolConfigSampler.nominal()`: every profile
at its own prices and latencies, in catalogue order, with the middle of the
preference ranges. `fixed_eval_configs` scales prices outside the training
range, so evaluation sees configurations training never produced.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Sequence

import numpy as np

from orchestra_jax.tasks import Task
from orchestra_jax.tools import config as config_lib
from orchestra_jax.tools.meta_tool_table import PAPER_META_TOOLS, is_meta_tool


@dataclasses.dataclass(frozen=True)
class SamplerRanges:
    """Ranges the sampler draws from (all inclusive).

    Attributes:
      price_scale: log-uniform factor on a profile's token prices.
      latency_scale: log-uniform factor on a profile's latency.
      keep_probability: chance each profile is offered.
      shuffle_aliases: shuffle the kept profiles before numbering them, so an
        alias number says nothing about the model (False keeps profile order).
      cost_weight / latency_weight: uniform ranges of those preference weights.
      efficiency_off_probability: chance both are 0 (accuracy only).
      tool_preference_probability: chance one tool feature gets a weight.
      tool_weight: uniform range of that weight (negative = avoid the tool).
      randomize: False gives every task the nominal configuration
        (`ToolConfigSampler.nominal`) and draws nothing.
    """

    price_scale: tuple[float, float] = (0.5, 2.0)
    latency_scale: tuple[float, float] = (0.5, 2.0)
    keep_probability: float = 0.75
    shuffle_aliases: bool = True
    cost_weight: tuple[float, float] = (0.0, 1.0)
    latency_weight: tuple[float, float] = (0.0, 1.0)
    efficiency_off_probability: float = 0.2
    tool_preference_probability: float = 0.2
    tool_weight: tuple[float, float] = (-1.0, 1.0)
    randomize: bool = True

    def __post_init__(self):
        for name in ("price_scale", "latency_scale"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must satisfy 0 < low <= high, got {lo, hi}")
        for name in (
            "keep_probability",
            "efficiency_off_probability",
            "tool_preference_probability",
        ):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a probability")

    @classmethod
    def as_listed(cls) -> SamplerRanges:
        """Ranges that draw nothing: every profile offered, in its given order, at its
        own prices and latencies, with no cost, latency or tool preference."""
        return cls(
            price_scale=(1.0, 1.0),
            latency_scale=(1.0, 1.0),
            keep_probability=1.0,
            shuffle_aliases=False,
            cost_weight=(0.0, 0.0),
            latency_weight=(0.0, 0.0),
            efficiency_off_probability=1.0,
            tool_preference_probability=0.0,
        )


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """exp(U(log lo, log hi))."""
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _meta_tools_in_order(tools: Sequence[str]) -> list[str]:
    """The meta-tools of `tools`: the paper's first, in their order, then others as listed."""
    paper = [t for t in PAPER_META_TOOLS if t in tools]
    return paper + [t for t in tools if is_meta_tool(t) and t not in PAPER_META_TOOLS]


def task_seed(seed: int, task_id: str) -> int:
    """A stable per-task seed: crc32 of the task id mixed with `seed`."""
    return (zlib.crc32(task_id.encode()) * 1_000_003 + seed) % (2**63)


class ToolConfigSampler:
    """Draws a `ToolConfig` per task.

    Args:
      profiles: the backend models that may be offered (see
        `SyntheticOrchestrationEnv.model_profiles()` for the offline set).
      ranges: the randomisation ranges.
      tools: enabled tools (meta-tools need at least one profile each).
      seed: base seed; `sample(task)` without an rng is a function of
        (seed, task.id).
      **config_fields: other `ToolConfig` fields (search_top_k, …).
    """

    def __init__(
        self,
        profiles: Sequence[config_lib.ModelProfile],
        *,
        ranges: SamplerRanges = SamplerRanges(),
        tools: Sequence[str] = PAPER_META_TOOLS,
        seed: int = 0,
        **config_fields,
    ):
        self.profiles = tuple(profiles)
        self.ranges = ranges
        self.tools = tuple(tools)
        self.seed = seed
        self.config_fields = config_fields
        for tool in self.tools:
            if is_meta_tool(tool) and not any(p.tool == tool for p in self.profiles):
                raise ValueError(f"no model profile for enabled meta-tool {tool!r}")

    def sample(
        self, task: Task, rng_or_seed: np.random.Generator | int | None = None
    ) -> config_lib.ToolConfig:
        """A random configuration for `task` (same rng state -> same config); the
        nominal one when `ranges.randomize` is False."""
        if not self.ranges.randomize:
            return self.nominal()
        if isinstance(rng_or_seed, np.random.Generator):
            rng = rng_or_seed
        else:
            seed = task_seed(self.seed, task.id) if rng_or_seed is None else rng_or_seed
            rng = np.random.default_rng(seed)
        r = self.ranges
        chosen = []
        for tool in _meta_tools_in_order(self.tools):
            pool = [p for p in self.profiles if p.tool == tool]
            keep = [p for p in pool if rng.random() < r.keep_probability]
            if not keep:
                keep = [pool[int(rng.integers(len(pool)))]]
            if r.shuffle_aliases:
                keep = [keep[i] for i in rng.permutation(len(keep))]
            chosen += keep
        aliases = config_lib.aliases_from_profiles(
            chosen,
            [_log_uniform(rng, *r.price_scale) for _ in chosen],
            [_log_uniform(rng, *r.latency_scale) for _ in chosen],
        )
        config = config_lib.ToolConfig(
            aliases=aliases, tools=self.tools, name="sampled", **self.config_fields
        )
        return dataclasses.replace(config, preference=self._preference(rng, config))

    def nominal(self) -> config_lib.ToolConfig:
        """The configuration the catalogue states, whatever the seed: every profile
        of an enabled meta-tool offered, in catalogue order (aliases numbered in
        it), at its own prices and latencies (scale 1), and a preference of
        accuracy plus the middle of the cost and latency weight ranges, with no
        tool preference. Several training seeds thus train on the same one."""
        chosen = [
            p for tool in _meta_tools_in_order(self.tools) for p in self.profiles if p.tool == tool
        ]
        r = self.ranges
        return config_lib.ToolConfig(
            aliases=config_lib.aliases_from_profiles(
                chosen, [1.0] * len(chosen), [1.0] * len(chosen)
            ),
            tools=self.tools,
            preference={
                "accuracy": 1.0,
                "cost": round(sum(r.cost_weight) / 2, 2),
                "latency": round(sum(r.latency_weight) / 2, 2),
            },
            name="nominal",
            **self.config_fields,
        )

    def _preference(
        self, rng: np.random.Generator, config: config_lib.ToolConfig
    ) -> dict[str, float]:
        r = self.ranges
        pref = {
            "accuracy": 1.0,
            "cost": round(float(rng.uniform(*r.cost_weight)), 2),
            "latency": round(float(rng.uniform(*r.latency_weight)), 2),
        }
        if rng.random() < r.efficiency_off_probability:
            pref["cost"] = pref["latency"] = 0.0
        if rng.random() < r.tool_preference_probability:
            tool_features = config.feature_names()[len(config_lib.BASE_FEATURES) :]
            if tool_features:  # a configuration without tools has none to prefer
                feature = tool_features[int(rng.integers(len(tool_features)))]
                pref[feature] = round(float(rng.uniform(*r.tool_weight)), 2)
        return pref


def fixed_eval_configs(
    profiles: Sequence[config_lib.ModelProfile],
    *,
    ranges: SamplerRanges = SamplerRanges(),
    tools: Sequence[str] = PAPER_META_TOOLS,
    preference: dict[str, float] | None = None,
    **config_fields,
) -> dict[str, config_lib.ToolConfig]:
    """Held-out configurations whose prices lie outside `ranges.price_scale`.

    All profiles are offered in their given order. Returns:
      "heldout_cheap": every price x (low / 2).
      "heldout_expensive": every price x (high x 2).
      "heldout_spread": per meta-tool, the priciest profile x (high x 2) and the
        others x (low / 2): the price gaps are wider than in training.
    """
    preference = preference or {"accuracy": 1.0, "cost": 0.5, "latency": 0.0}
    profiles = [p for p in profiles if p.tool in tools]
    lo, hi = ranges.price_scale[0] / 2, ranges.price_scale[1] * 2
    priciest = {}
    for p in profiles:
        if p.tool not in priciest or p.price_out > priciest[p.tool].price_out:
            priciest[p.tool] = p
    scales = {
        "heldout_cheap": [lo] * len(profiles),
        "heldout_expensive": [hi] * len(profiles),
        "heldout_spread": [hi if priciest[p.tool] is p else lo for p in profiles],
    }
    return {
        name: config_lib.ToolConfig(
            aliases=config_lib.aliases_from_profiles(profiles, s, [1.0] * len(profiles)),
            tools=tuple(tools),
            preference=dict(preference),
            name=name,
            **config_fields,
        )
        for name, s in scales.items()
    }
