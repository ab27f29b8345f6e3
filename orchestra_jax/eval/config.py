"""The `eval` section of an experiment config as `EvalConfig`: how often and on how
many held-out tasks a policy is evaluated, with which baselines and sampling, and
the held-out reward's scales, checked once (`problems`). The evaluation protocol
(`eval.protocol`, training/eval_protocols.py) and the baselines against the
environment are rules between sections (training/experiment_config.py)."""

from __future__ import annotations

import dataclasses

from orchestra_jax.config_section import Section, split_list
from orchestra_jax.eval.routers import ROUTERS, is_router


@dataclasses.dataclass(frozen=True)
class EvalConfig(Section):
    """`eval.*`, named as in the config file (experiments/configs/grpo_hle.py says
    what each field does)."""

    SECTION = "eval"

    every_steps: int = 0
    protocol: str = "heldout"
    num_tasks: int = 64
    num_trials: int = 1
    seed: int = 0
    baselines: str = "always_strongest,always_cheapest,random"
    temperature: float = 0.0
    cost_scale_usd: float = 0.02
    latency_scale_s: float = 120.0

    def problems(self) -> list[str]:
        errors = self.positive("every_steps", "num_tasks", allow_zero=True)
        errors += self.positive("num_trials")
        errors += self.positive("seed", allow_zero=True)
        if self.cost_scale_usd <= 0 or self.latency_scale_s <= 0:
            errors.append(
                "eval.cost_scale_usd and eval.latency_scale_s must be > 0 (they scale "
                "the held-out reward and reward.type='utility')"
            )
        for name in self.baseline_names():
            if not is_router(name):
                errors.append(
                    f"eval.baselines: unknown router {name!r}; known: {ROUTERS.names()} "
                    "or a '+' mixture of them"
                )
        return errors

    def baseline_names(self) -> list[str]:
        """The baseline routers `baselines` lists."""
        return split_list(self.baselines)
