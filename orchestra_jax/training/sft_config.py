"""The `sft` section of an experiment config as `SFTConfig`: the supervised warm start
(training/warm_start.py): its optimizer, and the demonstrations it imitates."""

from __future__ import annotations

import dataclasses

from orchestra_jax.config_section import Section
from orchestra_jax.eval.routers import ROUTERS, is_router
from orchestra_jax.rl.learner import SCHEDULES, LearnerConfig
from orchestra_jax.training.warm_start import DEFAULT_DEMO_BEST_OF, DEMO_FILTERS


@dataclasses.dataclass(frozen=True)
class SFTConfig(Section):
    """`sft.*`, named as in the config file (experiments/configs/grpo_hle.py)."""

    SECTION = "sft"

    steps: int = 0
    lr: float = 1e-5
    schedule: str = "constant"
    warmup_steps: int = 0
    ema_decay: float = 0.0
    batch_size: int = 16
    num_demos: int = 512
    demo_policy: str = "random"
    demo_filter: str = "none"
    demo_best_of: int = DEFAULT_DEMO_BEST_OF

    def problems(self) -> list[str]:
        errors = self.positive("steps", allow_zero=True)
        errors += self.choice("schedule", SCHEDULES)
        if self.warmup_steps < 0 or (self.steps and self.warmup_steps >= self.steps):
            errors.append(f"sft.warmup_steps must be in [0, sft.steps), got {self.warmup_steps}")
        if not 0 <= self.ema_decay < 1:
            errors.append(f"sft.ema_decay must be in [0, 1), got {self.ema_decay}")
        errors += self.choice("demo_filter", DEMO_FILTERS)
        if self.demo_best_of < 1:
            errors.append(f"sft.demo_best_of must be >= 1, got {self.demo_best_of}")
        elif self.demo_filter != "best" and self.demo_best_of != DEFAULT_DEMO_BEST_OF:
            errors.append(
                f"sft.demo_best_of={self.demo_best_of} has no effect unless sft.demo_filter='best'"
            )
        if self.steps and not is_router(self.demo_policy):
            errors.append(
                f"sft.demo_policy must be a router {ROUTERS.names()} or a '+' mixture of "
                f"them, got {self.demo_policy!r}"
            )
        return errors

    def learner_config(self, grpo: LearnerConfig) -> LearnerConfig:
        """The warm start's learner: GRPO's (`grpo`) with this section's optimizer, no
        KL term, one update a batch of whole rows, temperature 1."""
        return dataclasses.replace(
            grpo,
            learning_rate=self.lr,
            kl_coef=0.0,
            schedule=self.schedule,
            warmup_steps=self.warmup_steps,
            total_steps=self.steps,
            micro_batch_size=None,
            num_minibatches=1,
            num_epochs=1,
            minibatch_size=None,
            temperature=1.0,
        )
