"""Question answering on benchmark data (HLE, FRAMES, GeneralThought, jsonl) with live tools.

The paper's QA setup as an `Environment` ("qa"): the tasks are the rows of
`data.sources` (training and held-out splits of `data/splits.py`), the
orchestrator's meta-tools call the expert models of a catalogue
(`tools/experts/catalogue.py`) over HTTP, `search` queries a local index or the web,
code runs in the sandbox, and free-form answers are graded by the LLM judge of
`reward.judge` (exact matches first). Which backend serves each tool is a
config choice (`tools/live_backends.py`):

    tools.backends = "live"        experts: the catalogue's models (OpenAIChatExpert;
                                   cost = the reply's token usage x the alias's
                                   price in the task's configuration; latency
                                   measured); a failing call, after retries, is a
                                   tool error the policy reads, counted in metrics
    tools.search   = "index" | "tavily" | "index+tavily"
    tools.sandbox  = a sandbox of `tools/sandbox/registry.py` ("auto": the safest here)

Simulated experts ("offline") read the gold answer, so they are allowed only
with synthetic data (a config check); the tool-configuration sampler then
offers the simulated line-up for those tools and the catalogue's for the rest,
and randomises availability, aliases, prices and latencies over both alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.data.splits import load_split
from orchestra_jax.envs import synthetic_models
from orchestra_jax.envs.inputs import EnvInputs
from orchestra_jax.rewards.judge import Judge, JudgeVerdict, grade
from orchestra_jax.tasks import Task
from orchestra_jax.tools import live_backends
from orchestra_jax.tools.base import Tool
from orchestra_jax.tools.config import ModelProfile, ToolConfig
from orchestra_jax.tools.config_sampler import (
    SamplerRanges,
    ToolConfigSampler,
    fixed_eval_configs,
)
from orchestra_jax.tools.enabled import enabled_tools
from orchestra_jax.tools.experts.catalogue import load_catalogue
from orchestra_jax.tools.experts.client import ExpertClient, ExpertError
from orchestra_jax.tools.experts.protocols import EXPERT_PROTOCOLS, PROJECT, ExpertProtocol
from orchestra_jax.tools.registry import Backends, make_tools
from orchestra_jax.tools.retrieval.retrievers import Retriever
from orchestra_jax.tools.retrieval.search_pricing import PER_DOCUMENT, SearchCharge, search_charge
from orchestra_jax.tools.sandbox.registry import make_sandbox, run_python


class QAEnvironment:
    """Tasks from files, tools on live (or, for synthetic data, simulated) backends.

    Args:
      profiles: the models the sampler may offer, per meta-tool (catalogue
        profiles for live tools, simulated ones for offline tools).
      experts: backend name -> client, for every live profile's backend.
      retriever: serves `search` (None: search calls return an error).
      run_code: the sandbox.
      load_tasks: split -> its tasks ("train" or the held-out split's name).
      offline_backends: backends of `profiles` that are simulated experts.
      charge_measured_time, expert_max_tokens, expert_temperature,
      expert_protocol, families, search_retries: see `Backends`.
    """

    def __init__(
        self,
        profiles: Sequence[ModelProfile],
        experts: Mapping[str, ExpertClient],
        *,
        retriever: Retriever | None = None,
        run_code: Callable[..., Any] = run_python,
        load_tasks: Callable[[str], Sequence[Task]] | None = None,
        offline_backends: Sequence[str] = (),
        charge_measured_time: bool = True,
        expert_max_tokens: int = 2048,
        expert_temperature: float = 0.0,
        expert_protocol: ExpertProtocol = PROJECT,
        families: Mapping[str, str] | None = None,
        search_retries: int = 0,
        search_charge: SearchCharge = PER_DOCUMENT,
    ):
        self.profiles = tuple(profiles)
        self.experts = dict(experts)
        missing = sorted(
            {p.backend for p in self.profiles} - set(self.experts) - set(offline_backends)
        )
        if missing:
            raise ValueError(f"no expert client for backends {missing}")
        self.retriever = retriever
        self.run_code = run_code
        self._load_tasks = load_tasks
        self._splits: dict[str, tuple[Task, ...]] = {}
        self.offline_backends = tuple(offline_backends)
        self.charge_measured_time = charge_measured_time
        self.expert_max_tokens = expert_max_tokens
        self.expert_temperature = expert_temperature
        self.expert_protocol = expert_protocol
        self.families = dict(families or {})
        self.search_retries = search_retries
        self.search_charge = search_charge

    # --- tasks -----------------------------------------------------------------------

    def _split(self, split: str) -> tuple[Task, ...]:
        if self._load_tasks is None:
            raise ValueError("this QAEnvironment was built without tasks (load_tasks)")
        if split not in self._splits:  # each split is read once
            self._splits[split] = tuple(self._load_tasks(split))
        return self._splits[split]

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first `n` tasks of `split` (fewer when the split is smaller)."""
        return list(self._split(split)[:n])

    # --- tools -----------------------------------------------------------------------

    def build_backends(self, *, seed: int = 0, sleep_scale: float = 0.0) -> Backends:
        """The live experts, plus simulated ones for offline tools (their latencies
        follow each task's configuration), the retriever and the sandbox."""
        per_config: Callable[[ToolConfig], dict[str, ExpertClient]] | None = None
        experts: dict[str, ExpertClient] = dict(self.experts)
        if self.offline_backends:
            simulated = functools.partial(
                synthetic_models.simulated_experts,
                seed=seed,
                sleep_scale=sleep_scale,
                other_backends=tuple(self.experts),
            )
            experts = {**simulated(), **self.experts}

            def experts_of(config: ToolConfig) -> dict[str, ExpertClient]:
                return {**simulated(config), **self.experts}

            per_config = experts_of

        return Backends(
            experts=experts,
            retriever=self.retriever,
            run_code=self.run_code,
            expert_max_tokens=self.expert_max_tokens,
            expert_temperature=self.expert_temperature,
            expert_protocol=self.expert_protocol,
            families=self.families,
            experts_for_config=per_config,
            charge_measured_time=self.charge_measured_time,
            search_retries=self.search_retries,
            search_charge=self.search_charge,
        )

    def tools(
        self,
        tool_config: ToolConfig,
        *,
        task: Task | None = None,
        seed: int = 0,
        sleep_scale: float = 0.0,
    ) -> dict[str, Tool]:
        """The tools `tool_config` enables (the same for every task)."""
        del task
        return make_tools(tool_config, self.build_backends(seed=seed, sleep_scale=sleep_scale))

    def tool_config_sampler(
        self, seed: int = 0, ranges: SamplerRanges | None = None, **fields: Any
    ) -> ToolConfigSampler:
        """Training-time randomisation over this env's models (as the synthetic world's)."""
        return ToolConfigSampler(
            self.profiles, ranges=ranges or SamplerRanges(), seed=seed, **fields
        )

    def eval_tool_configs(
        self, ranges: SamplerRanges | None = None, **fields: Any
    ) -> dict[str, ToolConfig]:
        """Held-out price configurations the training sampler never produces."""
        return fixed_eval_configs(self.profiles, ranges=ranges or SamplerRanges(), **fields)

    # --- episodes --------------------------------------------------------------------

    def reset(self, task: Task) -> None:
        """No per-episode state."""
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
        """By the task's answer type: rule-based, or exact match then the LLM judge
        (no episode state: only the final answer counts)."""
        del state
        return await grade(final_answer, task, judge=judge)


def from_config(inputs: EnvInputs) -> QAEnvironment:
    """The "qa" environment.

    Reads the catalogue (`tools.catalogue`) for live tools, makes one HTTP client
    per catalogue model those tools offer and checks that every endpoint answers
    (ExpertError naming the unreachable ones), opens the search backend
    (`tools.search`, `tools.search_index`) when `search` is enabled, and builds
    the sandbox `tools.sandbox`; experts are asked as `tools.experts` says, each
    by its catalogue family. Tasks come from `data.*` (`data/splits.py`).
    """
    t = inputs.tools
    tools = enabled_tools(t.enabled)
    kinds = live_backends.parse_backends(t.backends, tools)
    live = live_backends.tools_of_kind(kinds, "live")
    offline = live_backends.tools_of_kind(kinds, "offline")
    profiles = [p for p in synthetic_models.MODEL_PROFILES if p.tool in offline]
    experts: dict[str, ExpertClient] = {}
    families: dict[str, str] = {}
    if live:
        catalogue = load_catalogue(t.catalogue)
        models = catalogue.models_for(live)
        problems = live_backends.unreachable_endpoints(models)
        if problems:
            raise ExpertError("; ".join(problems))
        experts.update(
            live_backends.make_live_experts(
                models, retries=t.expert_retries, timeout_s=t.expert_timeout_s
            )
        )
        profiles += catalogue.profiles(live)
        families = {m.name: m.family for m in models}
    retriever = None
    charge = SearchCharge()
    if "search" in tools:
        retriever = live_backends.make_retriever(
            t.search, t.search_index, min_docs=t.search_min_docs
        )
        count_tokens: Callable[[str], int] | None = None
        if t.search_pricing == "reference" and "tavily" not in t.search:
            tokenizer = load_tokenizer(inputs.tokenizer)  # the orchestrator's, as the release's
            count_tokens = lambda text: len(tokenizer.encode(text))  # noqa: E731
        charge = search_charge(t.search_pricing, t.search, count_tokens)

    def load_tasks(split: str) -> list[Task]:
        sources, _ = load_split(inputs.data, split, inputs.eval_num_tasks)
        return [task for source in sources for task in source.tasks]

    return QAEnvironment(
        profiles,
        experts,
        retriever=retriever,
        run_code=make_sandbox(t.sandbox, code_is_trusted=t.code_is_trusted, memoize=t.memoize_code),
        load_tasks=load_tasks,
        offline_backends=sorted({p.backend for p in profiles if p.tool in offline}),
        charge_measured_time=t.charge_measured_time,
        expert_max_tokens=t.expert_max_tokens,
        expert_temperature=t.expert_temperature,
        expert_protocol=EXPERT_PROTOCOLS.get(t.experts),
        families=families,
        search_retries=inputs.infra_retries,
        search_charge=charge,
    )
