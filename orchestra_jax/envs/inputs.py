"""`EnvInputs`: what an environment factory (`envs/environment.ENVIRONMENTS`) is given,
and `make_env`, which builds the environment `env.name` names from it.

A factory receives the typed sections an environment reads (its own `env`, the
tasks' `data`, the `tools` it offers), and the three values of other sections it
needs, never the whole experiment config:

    def my_world(inputs: EnvInputs) -> Environment:
        return MyWorld(seed=inputs.data.synthetic_seed, sandbox=inputs.tools.sandbox)

`training/builders.env_inputs` builds it from an experiment config.
"""

from __future__ import annotations

import dataclasses

from orchestra_jax.data.config import DataConfig
from orchestra_jax.envs.config import EnvConfig
from orchestra_jax.envs.environment import ENVIRONMENTS, Environment
from orchestra_jax.tools.tools_config import ToolsConfig


@dataclasses.dataclass(frozen=True)
class EnvInputs:
    """The sections and values an environment is built from."""

    env: EnvConfig
    data: DataConfig
    tools: ToolsConfig
    # `tokenizer`: the orchestrator's tokenizer; "qa" counts search results in its
    # tokens under `tools.search_pricing="reference"`, as the release does.
    tokenizer: str
    # `eval.num_tasks`: how many tasks a held-out split holds (data/splits.py).
    eval_num_tasks: int
    # `rollout.infra_retries`: retries of a call to a service an episode needs
    # (search, τ²'s evaluator) before its failure is reported as infrastructure.
    infra_retries: int


def make_env(inputs: EnvInputs) -> Environment:
    """The environment `inputs.env.name` names, built by its factory."""
    return ENVIRONMENTS.get(inputs.env.name)(inputs)
