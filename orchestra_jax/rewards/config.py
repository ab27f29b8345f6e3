"""The `reward` section of an experiment config as `RewardConfig`, with its LLM judge
(`reward.judge`) as `JudgeConfig`: which group reward trains the policy, its weights,
and the judge of free-form answers, checked once (`problems`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from orchestra_jax.config_section import Section
from orchestra_jax.rewards.judge import ANSWER_MATCHES, JUDGE_PROMPTS
from orchestra_jax.rewards.registry import REWARDS, GroupReward, make_reward


@dataclasses.dataclass(frozen=True)
class JudgeConfig(Section):
    """`reward.judge.*`, named as in the config file; an empty `base_url` means no
    judge, and then nothing else of the section is checked."""

    SECTION = "reward.judge"

    base_url: str = ""
    model: str = ""
    api_key_env: str = ""
    price_in: float = 0.0
    price_out: float = 0.0
    prompt: str = "reference"
    answer_match: str = "normalized"
    max_tokens: int = 512
    reasoning_model: bool = False
    retries: int = 3
    timeout_s: float = 300.0
    extra_body: dict[str, Any] = dataclasses.field(default_factory=dict)

    def problems(self) -> list[str]:
        if not self.base_url:
            return []
        errors = self.choice("prompt", JUDGE_PROMPTS)
        errors += self.choice("answer_match", ANSWER_MATCHES)
        if not self.base_url.startswith(("http://", "https://")):
            errors.append(
                f"reward.judge.base_url must start with http:// or https://, got {self.base_url!r}"
            )
        if not self.model:
            errors.append("reward.judge.model: the judge's model name is empty")
        if self.api_key_env and not os.environ.get(self.api_key_env):
            errors.append(f"reward.judge.api_key_env: ${self.api_key_env} is not set")
        errors += self.positive("max_tokens", "timeout_s")
        errors += self.positive("retries", "price_in", "price_out", allow_zero=True)
        return errors


@dataclasses.dataclass(frozen=True)
class RewardConfig(Section):
    """`reward.*`, named as in the config file (experiments/configs/grpo_hle.py says
    what each field does). `type` names a reward of `rewards/registry.REWARDS` or a
    factory `package.module:factory`; the factory reads its weights from `fields()`."""

    SECTION = "reward"
    NESTED = {"judge": JudgeConfig}

    type: str = "preference"
    efficiency_alpha: float = 1.0
    efficiency_beta: float = 0.0
    efficiency_floor: float = 0.0
    cost_scale_usd: float = 0.02
    latency_scale_s: float = 120.0
    judge: JudgeConfig = dataclasses.field(default_factory=JudgeConfig)

    def problems(self) -> list[str]:
        errors = self.choice("type", REWARDS)
        if not errors:
            try:
                make_reward(self.fields())
            except ValueError as e:
                errors.append(f"reward: {e}")
        return errors

    def fields(self) -> dict[str, Any]:
        """The section as the mapping a reward factory reads its weights from."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def group_reward(self) -> GroupReward:
        """The group reward `type` names, with this section's weights."""
        return make_reward(self.fields())
