"""The `env.tau2` section of an experiment config as `Tau2Config`: the τ²-bench
domain, its user simulator, experts and judge. Its values are checked only where
τ² tasks are played (`EnvConfig.problems` runs `played_problems`), so a run of
another environment does not need τ²'s data folder."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from orchestra_jax.config_section import Section
from orchestra_jax.envs.tau2 import setup
from orchestra_jax.envs.tau2.tools import ASK_EXPERT, EXPERT_TOOLS

NL_ASSERTION_MODES = ("skip", "judge")
USER_KINDS = ("simulator", "scripted")
EXPERT_MODES = tuple(EXPERT_TOOLS)  # "advise", "act" (`envs/tau2/tools.py`)


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


def tau2_problems(t: Any) -> list[str]:
    """One message per mistake in an `env.tau2` section, `t` (its ConfigDict or
    `envs/tau2/config.Tau2Config`), checked at start-up, before tau2 loads."""
    errors = []
    if not setup.tau2_installed():
        errors.append(f"env: the tau2 environment needs tau2. {setup.INSTALL_HINT}")
    data_dir = t.data_dir or os.environ.get(setup.DATA_DIR_VARIABLE, "")
    if not data_dir:
        errors.append(
            f"env.tau2.data_dir: set it or ${setup.DATA_DIR_VARIABLE} (tau2's data folder)"
        )
    elif not os.path.isdir(os.path.join(data_dir, "tau2", "domains")):
        errors.append(f"env.tau2.data_dir: {data_dir!r} is not a τ²-bench data folder")
    if t.domains_dir and not os.path.isdir(t.domains_dir):
        errors.append(f"env.tau2.domains_dir: {t.domains_dir!r} is not a folder")
    if t.user not in USER_KINDS:
        errors.append(f"env.tau2.user must be one of {USER_KINDS}, got {t.user!r}")
    elif t.user == "simulator" and not (t.user_url and t.user_model):
        errors.append("env.tau2.user='simulator' needs env.tau2.user_url and user_model")
    if t.max_steps < 1 or t.max_errors < 1 or t.user_retries < 0:
        errors.append("env.tau2: max_steps and max_errors must be >= 1, user_retries >= 0")
    meta_tools = [s.strip() for s in t.meta_tools.split(",") if s.strip()]
    if any(name != ASK_EXPERT.name for name in meta_tools):
        errors.append(f"env.tau2.meta_tools: only {ASK_EXPERT.name!r}, got {meta_tools}")
    if meta_tools and not t.expert_url:
        errors.append("env.tau2.meta_tools needs env.tau2.expert_url (the experts' server)")
    if t.expert_mode not in EXPERT_MODES:
        errors.append(f"env.tau2.expert_mode must be one of {EXPERT_MODES}, got {t.expert_mode!r}")
    elif t.expert_mode == "act" and not meta_tools:
        errors.append(
            "env.tau2.expert_mode='act' needs experts: set env.tau2.meta_tools=ask_expert"
        )
    if t.nl_assertions not in NL_ASSERTION_MODES:
        errors.append(f"env.tau2.nl_assertions must be one of {NL_ASSERTION_MODES}")
    elif t.nl_assertions == "judge" and not (t.judge_url and t.judge_model):
        errors.append("env.tau2.nl_assertions='judge' needs env.tau2.judge_url and judge_model")
    return errors
