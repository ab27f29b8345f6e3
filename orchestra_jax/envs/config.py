"""The `env` section of an experiment config as `EnvConfig`: the environment that
plays the tasks (`envs/environment.ENVIRONMENTS`), a routed run's members, and τ²'s
settings (`env.tau2`, `envs/tau2/config.Tau2Config`), checked once (`problems`)."""

from __future__ import annotations

import dataclasses

from orchestra_jax.config_section import Section, choice, split_list
from orchestra_jax.envs.environment import ENVIRONMENTS
from orchestra_jax.envs.tau2.config import Tau2Config


@dataclasses.dataclass(frozen=True)
class EnvConfig(Section):
    """`env.*`, named as in the config file (experiments/configs/grpo_hle.py says
    what each field does)."""

    SECTION = "env"
    NESTED = {"tau2": Tau2Config}

    name: str = "synthetic"
    members: str = ""
    tau2: Tau2Config = dataclasses.field(default_factory=Tau2Config)

    def problems(self) -> list[str]:
        errors = self.choice("name", ENVIRONMENTS)
        if self.name == "routed" and not self.member_names():
            errors.append(
                "env.members: env.name='routed' needs environments, e.g. 'synthetic,tau2'"
            )
        if self.name == "routed":
            for name in self.member_names():
                errors += choice("env.members", name, ENVIRONMENTS)
        if "tau2" in self.played():
            errors += self.tau2.played_problems()
        return errors

    def member_names(self) -> list[str]:
        """`members`, comma-separated environment names."""
        return split_list(self.members)

    def played(self) -> list[str]:
        """The environments that play this run's tasks: `name`, or a routed run's
        members."""
        return self.member_names() if self.name == "routed" else [self.name]
