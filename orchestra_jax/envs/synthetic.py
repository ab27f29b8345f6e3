"""The offline orchestration environment: seeded tasks, a corpus, simulated models.

`SyntheticOrchestrationEnv(seed)` generates tasks in three domains where a
different tool is the right one (the tasks and corpus are
`data/synthetic_tasks.SyntheticTasks`; the models `synthetic_models`):

  domain       answer_type  right plan (cheapest that is reliable)
  arithmetic   numeric      enhance_reasoning(cheap coder) -> answer(cheap)
  entity_fact  exact        search(cheap) -> answer(cheap)
  logic        exact        answer(frontier)

It is the first `envs.environment.Environment` (registered as "synthetic";
`from_config` builds it from an experiment config). One call gives the agent
loop everything it needs offline:

    env = SyntheticOrchestrationEnv(seed=0)
    config = env.tool_config_sampler(seed=0).sample(task)   # per task
    tools = env.tools(config, seed=0)                       # {name: Tool}
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from orchestra_jax.data.synthetic_tasks import SyntheticTasks
from orchestra_jax.envs import synthetic_models
from orchestra_jax.envs.inputs import EnvInputs
from orchestra_jax.rewards.judge import Judge, JudgeVerdict, grade
from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import Tool
from orchestra_jax.tools.config import ToolConfig, aliases_from_profiles
from orchestra_jax.tools.config_sampler import (
    SamplerRanges,
    ToolConfigSampler,
    fixed_eval_configs,
)
from orchestra_jax.tools.registry import Backends, make_tools
from orchestra_jax.tools.retrieval.retrievers import BM25Retriever, Document
from orchestra_jax.tools.sandbox.registry import make_sandbox, run_python


class SyntheticOrchestrationEnv(SyntheticTasks):
    """The seeded tasks and corpus (`data/synthetic_tasks.SyntheticTasks`) with
    simulated backends and rule-based grading.

    Args:
      seed: everything (entities, tasks) is a function of it.
      num_entities: organisations in the corpus.
      heldout_fraction: share of organisations reserved for held-out questions.
      domain_weights: relative frequency of each domain in `DOMAINS` order.
      run_code: the sandbox of `build_backends`.
      charge_measured_time: whether tools charge the sandbox's and the
        retriever's wall time (see `tools.registry.Backends`).
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        num_entities: int = 400,
        heldout_fraction: float = 0.2,
        domain_weights: Sequence[float] = (1.0, 1.0, 1.0),
        run_code: Callable[..., Any] = run_python,
        charge_measured_time: bool = True,
    ):
        super().__init__(
            seed,
            num_entities=num_entities,
            heldout_fraction=heldout_fraction,
            domain_weights=domain_weights,
        )
        self.run_code = run_code  # the sandbox of `build_backends` by default
        self.charge_measured_time = charge_measured_time

    # --- corpus and backends -----------------------------------------------------

    def corpus(self) -> list[Document]:
        """One document per organisation (all splits), id = entity id."""
        return [Document(**row) for row in self.corpus_rows()]

    @functools.cached_property
    def retriever(self) -> BM25Retriever:
        """BM25 over `corpus()`, built once per env."""
        return BM25Retriever(self.corpus())

    def build_backends(
        self,
        tool_config: ToolConfig | None = None,
        *,
        seed: int = 0,
        sleep_scale: float = 0.0,
        run_code: Callable[..., Any] | None = None,
    ) -> Backends:
        """Simulated experts, BM25 over the generated corpus and the sandbox:
        pass to `make_tools(config, backends)` for any config of this env (the
        experts' latencies follow each config's table; `tool_config` only sets
        the default experts in `Backends.experts`).

        sleep_scale: real seconds each simulated expert call sleeps per simulated
        second of latency (0 = no sleeping; > 0 exercises agent concurrency).
        run_code: the sandbox; defaults to the one given to the constructor.
        """
        return synthetic_models.build_offline_backends(
            tool_config,
            retriever=self.retriever,
            seed=seed,
            sleep_scale=sleep_scale,
            run_code=run_code or self.run_code,
            charge_measured_time=self.charge_measured_time,
        )

    def tools(
        self,
        tool_config: ToolConfig,
        *,
        task: Task | None = None,
        seed: int = 0,
        sleep_scale: float = 0.0,
    ) -> dict[str, Tool]:
        """The tools `tool_config` enables, on this env's offline backends (the same
        for every task)."""
        del task
        return make_tools(
            tool_config, self.build_backends(tool_config, seed=seed, sleep_scale=sleep_scale)
        )

    # --- episodes ------------------------------------------------------------------

    def reset(self, task: Task) -> None:
        """No per-episode state: the world does not change during an episode."""
        del task

    def other_party(self, task: Task) -> None:
        """No conversation partner: the orchestrator talks to its tools only."""
        del task

    async def grade(
        self,
        task: Task,
        final_answer: str | None,
        *,
        judge: Judge | None = None,
        state: Any = None,
    ) -> JudgeVerdict:
        """Rule-based grading of the final answer by the task's answer type
        (`rewards/judge.grade`); the world keeps no episode state."""
        del state
        return await grade(final_answer, task, judge=judge)

    # --- tool configurations -------------------------------------------------------

    @staticmethod
    def model_profiles() -> tuple:
        """The simulated models the sampler may offer (see `synthetic_models`)."""
        return synthetic_models.MODEL_PROFILES

    def default_tool_config(
        self, preference: dict[str, float] | None = None, **fields
    ) -> ToolConfig:
        """All models at base prices, in profile order (a training-range config)."""
        profiles = self.model_profiles()
        aliases = aliases_from_profiles(profiles, [1.0] * len(profiles), [1.0] * len(profiles))
        return ToolConfig(
            aliases=aliases,
            name="default",
            preference=preference or {"accuracy": 1.0, "cost": 0.5, "latency": 0.0},
            **fields,
        )

    def tool_config_sampler(
        self, seed: int = 0, ranges: SamplerRanges | None = None, **fields
    ) -> ToolConfigSampler:
        """Training-time randomisation over this env's models."""
        return ToolConfigSampler(
            self.model_profiles(), ranges=ranges or SamplerRanges(), seed=seed, **fields
        )

    def eval_tool_configs(
        self, ranges: SamplerRanges | None = None, **fields
    ) -> dict[str, ToolConfig]:
        """Held-out price configurations the training sampler never produces."""
        return fixed_eval_configs(self.model_profiles(), ranges=ranges or SamplerRanges(), **fields)


def from_config(inputs: EnvInputs) -> SyntheticOrchestrationEnv:
    """The "synthetic" environment: `data.synthetic_seed`, `data.synthetic_num_entities`,
    the sandbox `tools.sandbox` (memoized where `tools.memoize_code`) and
    `tools.charge_measured_time`."""
    data, tools = inputs.data, inputs.tools
    return SyntheticOrchestrationEnv(
        seed=data.synthetic_seed,
        num_entities=data.synthetic_num_entities,
        run_code=make_sandbox(
            tools.sandbox, code_is_trusted=tools.code_is_trusted, memoize=tools.memoize_code
        ),
        charge_measured_time=tools.charge_measured_time,
    )
