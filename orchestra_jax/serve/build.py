"""The service from an experiment config and a policy: the one place it meets the builders.

`build_orchestrator(config, policy)` builds, with the code `python -m
experiments.evaluate --policies=<policy>` uses for the same config, the evaluation
protocol's config
(`eval.protocol`), its environment (catalogue, search index, sandbox, expert
endpoints), the policy on the config's engine (`training/policy_engines.py`), the
evaluation's sampling and loop limits, and the protocol's tool table for the
default tool configuration. A config refactor changes this module alone.
"""

from __future__ import annotations

from typing import Any

from orchestra_jax.io import paths
from orchestra_jax.serve.service import Orchestrator
from orchestra_jax.tasks import Task
from orchestra_jax.training import builders
from orchestra_jax.training.eval_protocols import eval_protocol
from orchestra_jax.training.evaluation import TOOL_TABLES
from orchestra_jax.training.policy_engines import PolicyError, policy_engine

# Worlds whose episodes are between the orchestrator and its tools: one question in,
# one answer out. τ² conversations need their other party (a simulated user).
SERVED_ENVS = ("synthetic", "qa")
_PROBE = Task(id="serve-default", question="", answer="")


def default_tool_config(config: Any, env: Any) -> Any:
    """The evaluation protocol's tool configuration for a request (its table's first
    entry: under "heldout" the first held-out configuration with the first stated
    preference; under "paper" the catalogue as listed)."""
    table = TOOL_TABLES.get(eval_protocol(config).tool_table)
    fields = builders.tool_config_fields(config)
    return table(env, [_PROBE], seed=config.eval.seed, **fields)[_PROBE.id]


def build_orchestrator(config: Any, policy: str) -> Orchestrator:
    """The orchestrator `policy` (`training.policy_engines.POLICY_FORMS`) under
    `config`'s evaluation; ValueError for a world that is not served."""
    if policy.startswith("hf:"):  # a missing folder says so before anything is built
        for folder in policy[3:].split("+"):
            if folder and not paths.as_path(folder).is_dir():
                raise PolicyError(f"--policy={policy}: no folder {folder}")
    test = eval_protocol(config).apply(config)
    if test.env.name not in SERVED_ENVS:
        raise ValueError(
            f"env.name={test.env.name!r} is not served: the service answers questions "
            f"with tools ({', '.join(SERVED_ENVS)}), not conversations with a simulated user"
        )
    env = builders.build_env(test)  # first: an expert endpoint that is down fails in seconds
    tokenizer = builders.build_tokenizer(test)
    loaded = policy_engine(test, policy, tokenizer)
    return Orchestrator(
        engine=loaded.engine,
        tokenizer=tokenizer,
        env=env,
        tool_config=default_tool_config(test, env),
        sampling=builders.eval_sampling_params(test),
        limits=builders.loop_limits(test),
        name=loaded.name,
        extra=loaded.extra,
    )
