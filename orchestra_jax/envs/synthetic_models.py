"""The simulated model line-up of the synthetic environment, and its backends.

Four backends, offered under the meta-tools at the paper's kind of prices:

  backend       unaided answer skill (arithmetic / entity_fact / logic)
  sim-frontier  0.50 / 0.05 / 0.90   $1.25/$10 per M tokens, slow, long reasoning
  sim-mini      0.25 / 0.03 / 0.35   $0.25/$2
  sim-small     0.05 / 0.02 / 0.10   $0.10/$0.10, fast
  sim-coder     0.05 / 0.02 / 0.10   $0.20/$0.20, writes correct code (0.95)

Any model reads evidence off the context well (reading skill >= 0.9), so the
cheapest good plan differs by domain: arithmetic -> enhance_reasoning with a
cheap coder, then a cheap answer; entity facts -> search with a cheap model,
then a cheap answer; logic -> answer with the frontier model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

from orchestra_jax.tools.config import ModelProfile, ToolConfig
from orchestra_jax.tools.experts.simulated import SimulatedExpert
from orchestra_jax.tools.meta_tool_table import meta_tool
from orchestra_jax.tools.registry import Backends
from orchestra_jax.tools.sandbox.registry import run_python

EXPERT_PARAMS: dict[str, dict[str, Any]] = {
    "sim-frontier": dict(
        skills={"arithmetic": 0.5, "entity_fact": 0.05, "logic": 0.9},
        query_skill=0.97,
        code_skill=0.97,
        reading_skill=0.98,
        reasoning_tokens=1500,
    ),
    "sim-mini": dict(
        skills={"arithmetic": 0.25, "entity_fact": 0.03, "logic": 0.35},
        query_skill=0.9,
        code_skill=0.85,
        reading_skill=0.95,
        reasoning_tokens=600,
    ),
    "sim-small": dict(
        skills={"arithmetic": 0.05, "entity_fact": 0.02, "logic": 0.1},
        query_skill=0.9,
        code_skill=0.5,
        reading_skill=0.95,
        reasoning_tokens=0,
    ),
    "sim-coder": dict(
        skills={"arithmetic": 0.05, "entity_fact": 0.02, "logic": 0.1},
        query_skill=0.6,
        code_skill=0.95,
        reading_skill=0.9,
        reasoning_tokens=100,
    ),
}

MODEL_PROFILES = (
    ModelProfile(
        "search",
        "sim-frontier",
        1.25,
        10.0,
        22.0,
        "reliably identifies the missing information and writes precise queries",
    ),
    ModelProfile("search", "sim-mini", 0.25, 2.0, 16.0, "writes good queries for most questions"),
    ModelProfile(
        "search",
        "sim-small",
        0.1,
        0.1,
        6.0,
        "writes simple keyword queries that work for direct factual lookups",
    ),
    ModelProfile(
        "enhance_reasoning",
        "sim-frontier",
        1.25,
        10.0,
        31.0,
        "has strong reasoning and coding skills and usually provides reliable results",
    ),
    ModelProfile(
        "enhance_reasoning",
        "sim-mini",
        0.25,
        2.0,
        25.0,
        "writes useful code but makes mistakes in harder cases",
    ),
    ModelProfile(
        "enhance_reasoning",
        "sim-coder",
        0.2,
        0.2,
        9.0,
        "is a small coding model that writes correct code for well-specified calculations",
    ),
    ModelProfile(
        "answer",
        "sim-frontier",
        1.25,
        10.0,
        40.0,
        "performs excellently in most domains, including hard multi-step reasoning puzzles",
    ),
    ModelProfile(
        "answer",
        "sim-mini",
        0.25,
        2.0,
        20.0,
        "answers easy tasks but gets stuck on complex reasoning",
    ),
    ModelProfile(
        "answer",
        "sim-small",
        0.1,
        0.1,
        8.0,
        "has basic capability: it answers correctly when the needed "
        "facts or results are already in the context",
    ),
)


def simulated_experts(
    tool_config: ToolConfig | None = None,
    *,
    seed: int = 0,
    sleep_scale: float = 0.0,
    other_backends: Collection[str] = (),
) -> dict[str, SimulatedExpert]:
    """One `SimulatedExpert` per backend; each role's mean latency is the one
    its alias shows in `tool_config` (base profile latencies where the config
    has no such alias, or without a config). Aliases of `other_backends` (live
    experts beside the simulated ones) are left to those."""
    latency: dict[str, dict[str, float]] = {}
    for p in MODEL_PROFILES:
        latency.setdefault(p.backend, {})[meta_tool(p.tool).role] = p.latency_s
    aliases = tool_config.aliases if tool_config is not None else ()
    aliases = [a for a in aliases if a.backend not in other_backends]
    unknown = sorted({a.backend for a in aliases} - set(EXPERT_PARAMS))
    if unknown:
        raise ValueError(
            f"no simulated expert for backends {unknown}; known: {sorted(EXPERT_PARAMS)}"
        )
    for a in aliases:
        latency[a.backend][meta_tool(a.tool).role] = a.latency_s
    return {
        name: SimulatedExpert(
            name, mean_latency_s=latency[name], sleep_scale=sleep_scale, seed=seed, **params
        )
        for name, params in EXPERT_PARAMS.items()
    }


def build_offline_backends(
    tool_config: ToolConfig | None = None,
    *,
    retriever: Any,
    seed: int = 0,
    sleep_scale: float = 0.0,
    run_code: Callable[..., Any] = run_python,
    charge_measured_time: bool = True,
) -> Backends:
    """Simulated experts, search and sandbox: everything `make_tools` needs,
    offline. `make_tools` rebuilds the experts for each task's ToolConfig (via
    `Backends.experts_for_config`), so one Backends serves sampled configs and
    simulated latencies always follow the prices table the policy saw.
    `charge_measured_time`: see `Backends`."""
    return Backends(
        experts=simulated_experts(tool_config, seed=seed, sleep_scale=sleep_scale),
        retriever=retriever,
        run_code=run_code,
        experts_for_config=functools.partial(simulated_experts, seed=seed, sleep_scale=sleep_scale),
        charge_measured_time=charge_measured_time,
    )
