"""Held-out evaluation: any policy (a model's engine or a baseline router) on fixed configs.

Evaluation tasks each get a fixed `ToolConfig` from a tool table (`TOOL_TABLES`,
picked by the evaluation protocol, `training/eval_protocols.py`). "heldout"
(`eval_tool_configs`): a configuration the training sampler never produces
(held-out prices, cycling over `env.eval_tool_configs()`) and a stated
preference cycling over three kinds: cost-minded, latency-minded, and
cost-minded with a tool preference, so the preference score has something to
score. "catalogue" (`catalogue_tool_configs`): the environment's line-up as
listed (the paper's fixed table for a run on `models_paper.yaml`), no stated
preference. `trials` episodes per task (one by default; τ² reports pass^k over k
trials, `eval/pass_k.py`).

Held-out reward (absolute, comparable across policies, meaningful for one
episode; the group-relative training reward is not):

    R = correct · max(0, 1 − P_cost · cost / cost_scale − P_latency · latency / latency_scale)

An `Evaluator` holds the test (tasks, their configurations, the episodes' seed
and sampling, the judge) and plays it with any engine. On several hosts each
host plays its share of the tasks (host h of H those at places h, h + H, …,
seeded by their places) and the hosts exchange the graded episodes
(`parallel/multihost.py`), so every host holds the same summary; process 0
writes
`<workdir>/eval_<policy>.json` (see `eval.summary.summarize`; plus pass^k per
domain, what the other party of conversations spent, apart, and the read
report of each data source, e.g. how many HLE image questions were skipped)
and the episodes to `<workdir>/trajectories/eval_<policy>.jsonl` for the viewer.

Episodes that failed by infrastructure (`Trajectory.infra_failure`: an engine,
expert, search, judge, user-simulator or evaluator failure) are not scored as
wrong: every score of the summary is over the other episodes, and the summary
counts them (`infra_failed`, by kind and by endpoint;
`training/infra_failures.summary`). The same bound as a training step's holds:
an evaluation where more than `max_infra_failure_fraction`
(`rl.max_infra_failure_fraction`) of the episodes failed so, or every one,
raises `InfraFailureError` naming the endpoints. pass^k is per task over the
trials it kept (`eval/pass_k.py`; `pass_k_tasks`: how many tasks each is over).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from orchestra_jax.agent.trajectory import Trajectory, write_jsonl
from orchestra_jax.data.pipeline import global_positions
from orchestra_jax.envs.environment import Environment
from orchestra_jax.eval.pass_k import pass_k_by_domain, pass_k_task_counts
from orchestra_jax.eval.summary import summarize
from orchestra_jax.io import paths
from orchestra_jax.parallel.multihost import is_primary
from orchestra_jax.registry import Registry
from orchestra_jax.rewards.efficiency import utility_rewards
from orchestra_jax.rollout.engine import RolloutEngine
from orchestra_jax.tasks import Task
from orchestra_jax.tools.config import ToolConfig
from orchestra_jax.tools.config_sampler import SamplerRanges
from orchestra_jax.training import infra_failures
from orchestra_jax.training.host_rollouts import gather_step
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes
from orchestra_jax.training.seeds import Stream

EVAL_PREFERENCES = (
    {"accuracy": 1.0, "cost": 0.5, "latency": 0.0},
    {"accuracy": 1.0, "cost": 0.0, "latency": 0.5},
    {"accuracy": 1.0, "cost": 0.3, "latency": 0.0, "tool": 1.0},  # + a tool to prefer
)


def eval_tool_configs(
    env: Environment, tasks: Sequence[Task], *, seed: int = 0, **config_fields: Any
) -> dict[str, ToolConfig]:
    """task id -> a held-out ToolConfig with a stated preference (see module docstring).

    `config_fields` are further ToolConfig fields (e.g. description_style).
    """
    base = list(env.eval_tool_configs(**config_fields).values())
    rng = np.random.default_rng([seed, Stream.HELDOUT_PREFERENCES])
    out = {}
    for i, task in enumerate(tasks):
        config = base[i % len(base)]
        preference = dict(EVAL_PREFERENCES[i % len(EVAL_PREFERENCES)])
        tool_features = [f for f in config.feature_names() if f.startswith("tool:")]
        if preference.pop("tool", None) and tool_features:  # none: nothing to prefer
            preference[tool_features[int(rng.integers(len(tool_features)))]] = 1.0
        out[task.id] = dataclasses.replace(config, preference=preference, preference_text=None)
    return out


def catalogue_tool_configs(
    env: Environment, tasks: Sequence[Task], *, seed: int = 0, **config_fields: Any
) -> dict[str, ToolConfig]:
    """task id -> the environment's line-up as listed: every model of its catalogue
    (or simulated line-up), in file order, at its own prices and latencies, named
    "catalogue"; accuracy is the only preference and the prompt states none.

    `seed` is not used (nothing is drawn); `config_fields` are further ToolConfig
    fields, as for `eval_tool_configs`.
    """
    del seed
    sampler = env.tool_config_sampler(ranges=SamplerRanges.as_listed(), **config_fields)
    return {
        task.id: dataclasses.replace(
            sampler.sample(task), name="catalogue", preference={"accuracy": 1.0}, preference_text=""
        )
        for task in tasks
    }


ToolTable = Callable[..., dict[str, ToolConfig]]

# An evaluation protocol's `tool_table`: `(env, tasks, *, seed, **ToolConfig fields)
# -> {task id: ToolConfig}`.
TOOL_TABLES: Registry[ToolTable] = Registry("evaluation tool table")
TOOL_TABLES.register("heldout", eval_tool_configs)
TOOL_TABLES.register("catalogue", catalogue_tool_configs)


def heldout_rewards(trajectories, *, cost_scale: float, latency_scale: float) -> np.ndarray:
    """The module docstring's R for each graded episode (`rewards.efficiency.
    utility_rewards` under the episode's own preference)."""
    if not trajectories:
        return np.zeros(0, np.float32)
    return np.concatenate(
        [
            utility_rewards(
                [t.features()],
                [bool(t.correct)],
                t.preference,
                cost_scale=cost_scale,
                latency_scale=latency_scale,
            )
            for t in trajectories
        ]
    ).astype(np.float32)


def other_party_spending(trajectories) -> dict[str, Any]:
    """Mean per episode of what conversations' other party (a simulated user) spent,
    kept apart from the policy's cost; empty where no episode had one."""
    spent = [t.metadata["other_party"] for t in trajectories if "other_party" in t.metadata]
    if not spent:
        return {}
    n = len(trajectories)
    return {
        "other_party_mean_cost_usd": sum(s.get("cost_usd", 0.0) for s in spent) / n,
        "other_party_mean_tokens": sum(
            s.get("prompt_tokens", 0) + s.get("completion_tokens", 0) for s in spent
        )
        / n,
    }


class Evaluator:
    """Held-out evaluation of any policy on one fixed test, built once per experiment.

    The test is fixed at construction: `tasks` (`trials` episodes each), their
    held-out `tool_configs` (task id -> ToolConfig), the episodes' seed and sampling,
    and the name of the evaluation protocol that set them (`protocol`, written into
    every summary), and the largest share of its episodes that may fail by
    infrastructure (`max_infra_failure_fraction`, the run's
    `rl.max_infra_failure_fraction`). Each `evaluate(name, engine)` plays the test with that policy and
    writes `<workdir>/eval_<name>.json` and `<workdir>/trajectories/eval_<name>.jsonl`.
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        tool_configs: Mapping[str, ToolConfig],
        episodes: Episodes,
        *,
        seed: int,
        cost_scale: float,
        latency_scale: float,
        workdir: str,
        max_infra_failure_fraction: float,
        data_reports: Sequence[Mapping[str, Any]] = (),
        trials: int = 1,
        protocol: str = "heldout",
    ):
        missing = [t.id for t in tasks if t.id not in tool_configs]
        if missing:
            raise ValueError(f"no held-out tool configuration for tasks {missing[:5]}")
        if trials < 1:
            raise ValueError(f"trials must be >= 1, got {trials}")
        if not 0.0 <= max_infra_failure_fraction <= 1.0:
            raise ValueError(
                f"max_infra_failure_fraction must be in [0, 1], got {max_infra_failure_fraction}"
            )
        self.max_infra_failure_fraction = max_infra_failure_fraction
        self.trials, self.protocol = trials, protocol
        self.tasks, self.tool_configs = list(tasks), dict(tool_configs)
        self.data_reports = [dict(r) for r in data_reports]
        self.episodes, self.seed, self.workdir = episodes, seed, workdir
        self.cost_scale, self.latency_scale = cost_scale, latency_scale

    async def play(self, engine: RolloutEngine) -> list[Trajectory]:
        """Every episode of the test, graded, in task order, on every host.

        On several hosts each plays its share: host h of H the tasks at places h,
        h + H, … of the test (seeded by their places, so they are the episodes one
        host would play), and the hosts exchange the trajectories (a collective:
        every host evaluates the same policies in the same order)."""
        places = global_positions(jax.process_index(), jax.process_count(), len(self.tasks))
        mine = [self.tasks[i] for i in places]
        trajectories: list[Trajectory] = []
        if mine:
            how = dataclasses.replace(self.episodes, engine=engine, group_size=self.trials)
            configs = [self.tool_configs[t.id] for t in mine]
            trajectories = await run_graded_episodes(
                mine, configs, how, seed=self.seed, task_indices=places
            )
        return gather_step(trajectories, self.trials)

    async def evaluate(
        self,
        name: str,
        engine: RolloutEngine,
        *,
        extra: Mapping[str, Any] | None = None,
        workdir: str | None = None,
    ) -> dict[str, Any]:
        """Runs `engine` on the test, writes and returns its summary (into `workdir`,
        default the evaluator's); `extra` fields are added to the summary."""
        workdir = workdir or self.workdir
        played = await self.play(engine)
        infra_failures.check_fraction(
            played, self.max_infra_failure_fraction, what=f"the evaluation of {name!r}"
        )
        trajectories = [t for t in played if t.infra_failure is None]  # the scored ones
        if not trajectories:
            raise infra_failures.InfraFailureError(
                f"every episode of the evaluation of {name!r} failed by infrastructure: "
                + infra_failures.describe(infra_failures.failures(played))
            )
        rewards = heldout_rewards(
            trajectories, cost_scale=self.cost_scale, latency_scale=self.latency_scale
        )
        for traj, r in zip(trajectories, rewards):
            traj.reward = float(r)
        categories = {
            t.id: str(t.metadata["category"]) for t in self.tasks if "category" in t.metadata
        }
        summary = {
            "policy": name,
            "protocol": self.protocol,
            **summarize(trajectories, tool_configs=self.tool_configs, categories=categories),
            "heldout_reward": float(rewards.mean()),
            "heldout_reward_stderr": float(rewards.std(ddof=1) / np.sqrt(len(rewards)))
            if len(rewards) > 1
            else 0.0,
            "reward_definition": (
                f"correct * max(0, 1 - P_cost*cost/{self.cost_scale:g} "
                f"- P_latency*latency/{self.latency_scale:g})"
            ),
            "data": self.data_reports,
            "trials": self.trials,
            "pass_k": pass_k_by_domain(trajectories),
            "pass_k_tasks": pass_k_task_counts(trajectories),
            **other_party_spending(trajectories),
            **infra_failures.summary(played),
            **(extra or {}),
        }
        if is_primary():  # on several hosts, process 0 alone writes
            write_jsonl(paths.join(workdir, "trajectories", f"eval_{name}.jsonl"), played)
            text = json.dumps(summary, indent=2, sort_keys=True)
            paths.write_text_atomic(paths.join(workdir, f"eval_{name}.json"), text)
        return summary
