"""The `env.tau2` section of an experiment config as `Tau2Config`: the τ²-bench
domain, its user simulator, experts and judge. Its values are checked only where
τ² tasks are played (`EnvConfig.problems` runs `played_problems`), so a run of
another environment does not need τ²'s data folder."""

from __future__ import annotations

import dataclasses

from orchestra_jax.config_section import Section
from orchestra_jax.envs.tau2.env import tau2_problems


@dataclasses.dataclass(frozen=True)
class Tau2Config(Section):
    """`env.tau2.*`, named as in the config file (experiments/configs/grpo_hle.py
    says what each field does)."""

    SECTION = "env.tau2"

    data_dir: str = ""
    domain: str = ""
    domains_dir: str = ""
    release_domains_in_process: bool = True
    drop_tools: str = ""
    user: str = "simulator"
    user_url: str = "https://api.openai.com/v1"
    user_model: str = "gpt-5"
    user_api_key_env: str = "OPENAI_API_KEY"
    user_price_in: float = 1.25
    user_price_out: float = 10.0
    user_retries: int = 3
    user_temperature: float = 0.0
    max_steps: int = 40
    max_errors: int = 10
    meta_tools: str = ""
    expert_mode: str = "advise"
    expert_url: str = ""
    expert_served_model: str = ""
    expert_api_key_env: str = ""
    nl_assertions: str = "skip"
    judge_url: str = ""
    judge_model: str = ""
    judge_api_key_env: str = ""
    train_message_turns: bool = True

    def played_problems(self) -> list[str]:
        """Every problem of these values, where τ² tasks are played."""
        return tau2_problems(self)
