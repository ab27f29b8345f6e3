"""The "tau2" environment: τ²-bench conversations, played and graded by tau2-bench itself.

For a task (`data/tau2_tasks.py`: a tau2 task in `metadata["tau2_task"]`):

  reset(task)        tau2's own environment for the task's domain (tools and
                     database), initialised from the task's initial state, in a
                     fresh `Tau2Episode` whose record opens with tau2's greeting
                     (or the task's initial message history, replayed)
  tools(config, task=…)
                     the domain's tools (`DomainTool`: run in the episode's tau2
                     environment, tau2's error semantics), less `drop_tools`,
                     and the configuration's meta-tool: the experts, priced per
                     alias as elsewhere, through `ask_expert` (`expert_mode`
                     "advise": the expert's reply is advice the policy reads)
                     or `call_expert` ("act": the expert's reply is the agent's
                     action, a domain tool call or a message to the user)
  other_party(task)  the user: tau2's user simulator on an OpenAI-compatible
                     endpoint, or a script (`Tau2Conversation`, `envs/tau2/user.py`)
  grade(task, _, state=episode)
                     tau2's evaluator (`evaluate_simulation`, all criteria of the
                     task's `reward_basis`: DB, ENV_ASSERTION, ACTION,
                     COMMUNICATE, NL_ASSERTION) on the episode's message record;
                     correct = reward 1. A conversation the loop cut short (turn
                     or context budget, an error) is graded as tau2 grades one
                     that hit its step budget: 0. An evaluator whose service
                     fails (its NL-assertion judge's endpoint: a transport,
                     server or timeout error, `is_service_failure`) is tried
                     `evaluator_retries` more times, then is an infrastructure
                     failure ("evaluator", `orchestra_jax/infra_failure.py`): the
                     episode is not scored. Any other exception of the
                     evaluator is a bug: it propagates at once, not retried.

The policy's prompt is tau2's own agent prompt (instructions and the domain
policy), then the tool configuration's preferences, the domain tools' schemas
and the meta-tools' schemas with their prices; the conversation opens with
tau2's greeting and the user's first message. Natural-language assertions
need an LLM judge: `nl_assertions="judge"` points tau2's judge at an
OpenAI-compatible endpoint, `"skip"` leaves them out of the reward (and says
so in the grade's report). The user's and the judge's spending never enter
the policy's cost.

Needs the `tau2` extra (`envs/tau2/setup.py` says how to install it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestra_jax.agent.conversation import OtherParty
from orchestra_jax.data.tau2_tasks import read_tau2_tasks
from orchestra_jax.envs.inputs import EnvInputs
from orchestra_jax.envs.tau2.config import EXPERT_MODES, NL_ASSERTION_MODES, USER_KINDS
from orchestra_jax.envs.tau2.domain_folder import (
    domain_folder,
    is_release_domain,
    register_domain_folder,
)
from orchestra_jax.envs.tau2.episode import GREETING, Tau2Episode
from orchestra_jax.envs.tau2.setup import import_tau2
from orchestra_jax.envs.tau2.tools import (
    ASK_EXPERT,
    EXPERT_PROFILES,
    EXPERT_TOOLS,
    AskExpertTool,
    CallExpertTool,
    DomainTool,
)
from orchestra_jax.envs.tau2.user import ScriptedUser, SimulatedUser, Speaker, Tau2Conversation
from orchestra_jax.infra_failure import InfraError, is_service_failure
from orchestra_jax.rewards.judge import Judge, JudgeVerdict
from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import Tool
from orchestra_jax.tools.config import ModelProfile, ToolConfig
from orchestra_jax.tools.config_sampler import SamplerRanges, ToolConfigSampler, fixed_eval_configs
from orchestra_jax.tools.experts.client import ExpertClient, OpenAIChatExpert
from orchestra_jax.tools.registry import Backends

# tau2's success criterion: a reward of 1 (within float error).
SUCCESS_TOLERANCE = 1e-6
# `(tau2 task, tau2 environment of its domain) -> Speaker`: who plays the user.
SpeakerFactory = Callable[[Any, Any], Speaker]


@dataclasses.dataclass(frozen=True)
class Domain:
    """A tau2 domain as the orchestrator sees it: its policy and tools."""

    name: str
    policy: str
    tools: tuple[Any, ...]  # tau2's Tool objects
    template: Any  # a tau2 environment of the domain (user tools' schemas)

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.openai_schema for tool in self.tools]


class Tau2Environment:
    """The `Environment` of τ² tasks (see the module docstring).

    Args:
      speaker: who plays the user, `(tau2 task, tau2 environment) -> Speaker`
        (`simulated_user_factory`, `scripted_user_factory`).
      data_dir: tau2's data folder (default `$TAU2_DATA_DIR`).
      max_steps / max_errors: tau2's budgets of one conversation.
      experts: backend name -> expert client, for the meta-tools.
      expert_profiles: the experts on offer (names are backends of `experts`).
      meta_tools: ("ask_expert",) to offer the experts, () for none.
      expert_mode: "advise" (`ask_expert`: the expert's reply is advice) or "act"
        (`call_expert`: the expert's reply is the agent's action).
      drop_tools: domain tools kept from the policy (the expert still has them).
      nl_assertions: "skip" or "judge" (see the module docstring).
      judge_url / judge_model / judge_api_key: tau2's NL-assertion judge.
      domain: the domain `tasks(split, n)` reads: one of tau2's (from `data_dir`),
        a ToolScale domain's name (in `domains_dir`) or a domain folder's path
        (`envs/tau2/domain_folder.py`).
      evaluator_retries: extra attempts at an evaluation whose service failed
        (`rollout.infra_retries`).
      domains_dir: where domains named by tasks or `domain` that tau2 lacks are
        looked for as folders (ToolScale's ten: ../shared/toolscale/domains).
      sandbox / code_is_trusted: where a folder domain's code runs
        (`tools.sandbox`, `tools.code_is_trusted`): model-written domains run in
        the domain-code sandbox (`sandboxed_domain.py`); with `code_is_trusted`
        every folder's code is imported into this process.
      release_domains_in_process: ToolScale's ten in `domains_dir`, the
        release's own code, are imported into this process (faster) rather
        than sandboxed.
    """

    def __init__(
        self,
        speaker: SpeakerFactory,
        *,
        data_dir: str | os.PathLike | None = None,
        max_steps: int = 40,
        max_errors: int = 10,
        experts: Mapping[str, ExpertClient] | None = None,
        expert_profiles: Sequence[ModelProfile] = EXPERT_PROFILES,
        meta_tools: Sequence[str] = (),
        nl_assertions: str = "skip",
        judge_url: str = "",
        judge_model: str = "",
        judge_api_key: str = "EMPTY",
        domain: str = "",
        expert_mode: str = "advise",
        drop_tools: Sequence[str] = (),
        evaluator_retries: int = 0,
        domains_dir: str | os.PathLike | None = None,
        sandbox: str = "auto",
        code_is_trusted: bool = False,
        release_domains_in_process: bool = True,
    ):
        self.tau2 = import_tau2(data_dir)
        self.domains_dir = domains_dir
        if expert_mode not in EXPERT_MODES:
            raise ValueError(f"expert_mode must be one of {EXPERT_MODES}, got {expert_mode!r}")
        if max_steps < 1 or max_errors < 1:
            raise ValueError(
                f"max_steps and max_errors must be >= 1, got {max_steps}, {max_errors}"
            )
        unknown = [t for t in meta_tools if t != ASK_EXPERT.name]
        if unknown:
            raise ValueError(f"τ² meta-tools: only {ASK_EXPERT.name!r} is offered, got {unknown}")
        self.experts = dict(experts or {})
        missing = sorted({p.backend for p in expert_profiles} - set(self.experts))
        if meta_tools and missing:
            raise ValueError(f"τ² experts {missing} have no client (env.tau2.expert_url)")
        if nl_assertions not in NL_ASSERTION_MODES:
            raise ValueError(f"nl_assertions must be one of {NL_ASSERTION_MODES}")
        if nl_assertions == "judge":
            if not (judge_url and judge_model):
                raise ValueError("nl_assertions='judge' needs judge_url and judge_model")
            _point_nl_judge(judge_url, judge_model, judge_api_key)
        self.speaker = speaker
        self.max_steps, self.max_errors = max_steps, max_errors
        self.expert_mode = expert_mode
        self.expert_tool = EXPERT_TOOLS[expert_mode]  # the meta-tool the experts are under
        self.expert_profiles = tuple(
            dataclasses.replace(p, tool=self.expert_tool) for p in expert_profiles
        )
        self.meta_tools = (self.expert_tool,) if meta_tools else ()
        self.drop_tools = frozenset(drop_tools)
        self.nl_assertions = nl_assertions
        self.evaluator_retries = evaluator_retries
        self.sandbox, self.code_is_trusted = sandbox, code_is_trusted
        self.release_domains_in_process = release_domains_in_process
        folder = domain_folder(domain, domains_dir)
        self.domain = self.register_folder(folder) if folder else domain
        self._folder = folder
        self._tasks: dict[str, Any] = {}
        self._domains: dict[str, Domain] = {}

    # --- tasks -------------------------------------------------------------------

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first `n` tasks of `split` ("base", "train", "test") of `domain`; a
        domain folder without `split_tasks.json` has only "base", all its tasks."""
        if not self.domain:
            raise ValueError("Tau2Environment.tasks needs a domain (env.tau2.domain)")
        from tau2.utils import utils as tau2_utils

        folder = self._folder or tau2_utils.DATA_DIR / "tau2" / "domains" / self.domain
        if self._folder and not (folder / "tasks.json").exists():
            raise FileNotFoundError(
                f"{folder} holds no tasks.json: read its tasks with data.sources=toolscale "
                "(a ToolScale file, or the synthesis pipeline's tasks.json)"
            )
        if self._folder and split == "base" and not (folder / "split_tasks.json").exists():
            return read_tau2_tasks(folder, limit=n)[0]
        return read_tau2_tasks(folder, split=split, limit=n)[0]

    def tau2_task(self, task: Task) -> Any:
        """tau2's own `Task` for one of ours (validated by tau2, cached)."""
        if task.id not in self._tasks:
            row = task.metadata.get("tau2_task")
            if not isinstance(row, dict):
                raise ValueError(f"task {task.id!r} is not a τ² task (no metadata['tau2_task'])")
            from tau2.data_model.tasks import Task as Tau2Task

            self._tasks[task.id] = Tau2Task.model_validate(row)
        return self._tasks[task.id]

    def domain_of(self, name: str) -> Domain:
        """tau2's domain `name`: its policy and tools (ValueError when tau2 lacks it)."""
        if name not in self._domains:
            from tau2.registry import registry

            if name not in registry.get_domains():
                folder = domain_folder(name, self.domains_dir)
                if folder is not None:
                    self.register_folder(folder)
            try:
                environment = registry.get_env_constructor(name)()
            except Exception as e:
                raise ValueError(
                    f"τ² domain {name!r} is not available in tau2 ({e}), nor a folder in "
                    f"env.tau2.domains_dir ({self.domains_dir or 'unset'})"
                ) from None
            self._domains[name] = Domain(
                name, environment.get_policy(), tuple(environment.get_tools()), environment
            )
        return self._domains[name]

    def register_folder(self, folder: Any) -> str:
        """Registers a domain folder in tau2, its code in this process when trusted (the
        release's own, or `code_is_trusted`), else in the sandbox; returns its name."""
        in_process = self.code_is_trusted or (
            self.release_domains_in_process and is_release_domain(folder, self.domains_dir)
        )
        return register_domain_folder(
            folder,
            in_process=in_process,
            sandbox=self.sandbox,
            code_is_trusted=self.code_is_trusted,
        )

    @staticmethod
    def task_domain(task: Task) -> str:
        domain = task.metadata.get("tau2_domain")
        if not domain:
            raise ValueError(f"task {task.id!r} names no τ² domain (metadata['tau2_domain'])")
        return str(domain)

    # --- tool configurations --------------------------------------------------------

    def tool_config_sampler(
        self, seed: int = 0, ranges: SamplerRanges | None = None, **fields: Any
    ) -> ToolConfigSampler:
        """Prices and preferences per task over the experts; the meta-tools are this
        environment's (`meta_tools`), whatever `fields` enable."""
        fields["tools"] = self.meta_tools
        return ToolConfigSampler(
            self.expert_profiles, ranges=ranges or SamplerRanges(), seed=seed, **fields
        )

    def eval_tool_configs(self, ranges: SamplerRanges | None = None, **fields: Any):
        """Held-out prices over the experts (`fixed_eval_configs`)."""
        fields["tools"] = self.meta_tools
        return fixed_eval_configs(self.expert_profiles, ranges=ranges or SamplerRanges(), **fields)

    # --- episodes --------------------------------------------------------------------

    def tools(
        self,
        tool_config: ToolConfig,
        *,
        task: Task | None = None,
        seed: int = 0,
        sleep_scale: float = 0.0,
    ) -> dict[str, Tool]:
        """The task's domain tools less `drop_tools`, then the configuration's
        meta-tool (`expert_tool`)."""
        del seed, sleep_scale
        if task is None:
            raise ValueError("τ² tools depend on the task's domain: pass task=")
        domain = self.domain_of(self.task_domain(task))
        tools: dict[str, Tool] = {
            t.name: DomainTool(t) for t in domain.tools if t.name not in self.drop_tools
        }
        name = self.expert_tool
        others = [n for n in tool_config.tools if n != name]
        if others:
            raise ValueError(
                f"τ² episodes (expert_mode {self.expert_mode!r}) offer the meta-tool {name!r} "
                f"only; this tool configuration offers {others} (a configuration of another "
                "environment or mode?)"
            )
        if name in tool_config.tools:
            if name in tools:
                raise ValueError(f"{name!r} clashes with a {domain.name} tool")
            kind = CallExpertTool if self.expert_mode == "act" else AskExpertTool
            tools[name] = kind(tool_config, Backends(experts=self.experts))
        return tools

    def reset(self, task: Task) -> Tau2Episode:
        """A fresh tau2 environment for the task, initialised as tau2's orchestrator does."""
        from tau2.data_model.message import AssistantMessage
        from tau2.registry import registry

        tau2_task = self.tau2_task(task)
        domain = self.domain_of(self.task_domain(task))
        environment = registry.get_env_constructor(domain.name)()
        initial = tau2_task.initial_state
        history = [m.model_copy(deep=True) for m in (initial and initial.message_history) or []]
        for message in history:
            message.turn_idx = None  # as tau2's orchestrator does
        environment.set_state(
            initialization_data=initial.initialization_data if initial else None,
            initialization_actions=initial.initialization_actions if initial else None,
            message_history=history,  # its tool calls are replayed into the database
        )
        greeting = AssistantMessage(role="assistant", content=GREETING, cost=0.0)
        return Tau2Episode(
            domain=domain.name,
            task=tau2_task,
            environment=environment,
            policy=domain.policy,
            tool_schemas=domain.schemas(),
            max_steps=self.max_steps,
            max_errors=self.max_errors,
            messages=history or [greeting],
        )

    def other_party(self, task: Task) -> OtherParty:
        """The task's user (`speaker`) in a tau2 conversation."""
        domain = self.domain_of(self.task_domain(task))
        return Tau2Conversation(self.speaker(self.tau2_task(task), domain.template))

    async def grade(
        self,
        task: Task,
        final_answer: str | None,
        *,
        judge: Judge | None = None,
        state: Any = None,
    ) -> JudgeVerdict:
        """tau2's evaluator on the episode's record (module docstring); its reward,
        breakdown and termination go to the verdict's `info`."""
        del final_answer, judge
        if not isinstance(state, Tau2Episode):
            raise ValueError(
                f"task {task.id!r}: τ² episodes are graded from their conversation; "
                "pass the episode's state (Environment.reset's Tau2Episode)"
            )
        return await asyncio.to_thread(self._grade, state)

    def _grade(self, episode: Tau2Episode) -> JudgeVerdict:
        from tau2.data_model.simulation import SimulationRun
        from tau2.data_model.tasks import RewardType
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

        termination = episode.termination or "max_steps"
        task, not_scored = episode.task, []
        criteria = task.evaluation_criteria
        if (
            self.nl_assertions == "skip"
            and criteria is not None
            and RewardType.NL_ASSERTION in criteria.reward_basis
        ):
            basis = [b for b in criteria.reward_basis if b != RewardType.NL_ASSERTION]
            criteria = criteria.model_copy(update={"reward_basis": basis})
            task = task.model_copy(update={"evaluation_criteria": criteria})
            not_scored.append(RewardType.NL_ASSERTION.value)
        info: dict[str, Any] = {"termination": termination, "not_scored": not_scored}
        run = SimulationRun(
            id=f"{task.id}-{id(episode)}",
            task_id=task.id,
            start_time="",
            end_time="",
            duration=0.0,
            termination_reason=termination,  # type: ignore[arg-type]
            messages=list(episode.messages),
        )
        last_error = "no attempt made"
        for _ in range(self.evaluator_retries + 1):
            try:
                result = evaluate_simulation(
                    run, task, EvaluationType.ALL, solo_mode=False, domain=episode.domain
                )
                break
            except Exception as e:
                if not is_service_failure(e):  # a deterministic failure: another try
                    raise  # would raise it again, and it is a bug, not a service's
                last_error = f"{type(e).__name__}: {e}"  # its NL judge's endpoint failed
        else:
            raise InfraError(
                f"τ² evaluator failed on task {task.id!r} after "
                f"{self.evaluator_retries + 1} attempt(s); last error: {last_error}",
                kind="evaluator",
                endpoint=f"tau2 evaluator ({episode.domain})",
            )
        reward = float(result.reward)
        info["reward"] = reward
        info["reward_basis"] = [b.value for b in result.reward_basis or []]
        info["breakdown"] = {
            getattr(k, "value", str(k)): float(v)
            for k, v in (result.reward_breakdown or {}).items()
        }
        if result.info and "note" in result.info:
            info["note"] = result.info["note"]
        return JudgeVerdict(correct=abs(reward - 1.0) <= SUCCESS_TOLERANCE, info=info)


def _point_nl_judge(url: str, model: str, api_key: str) -> None:
    """tau2 reads its NL-assertion judge from module constants: point them at `url`."""
    from tau2.evaluator import evaluator_nl_assertions as nl

    nl.DEFAULT_LLM_NL_ASSERTIONS = f"openai/{model}"
    nl.DEFAULT_LLM_NL_ASSERTIONS_ARGS = {
        "temperature": 0.0,
        "api_base": url,
        "api_key": api_key,
    }


# --- building from a config ------------------------------------------------------------


def scenario_lines(task: Any) -> list[str]:
    """A scripted user's lines for a tau2 task: the reason for the call and what the
    user knows (or the free-text instructions), then a confirmation; then it stops."""
    instructions = task.user_scenario.instructions
    if isinstance(instructions, str):
        opening = instructions
    else:
        opening = " ".join(
            part for part in (instructions.reason_for_call, instructions.known_info) if part
        )
    return [opening, "Yes, that is right. Please go ahead."]


def scripted_user_factory(task: Any, environment: Any) -> Speaker:
    """`ScriptedUser(scenario_lines(task))`: an offline user for CPU demos."""
    del environment
    return ScriptedUser(scenario_lines(task))


def simulated_user_factory(
    base_url: str, model: str, *, api_key: str = "EMPTY", **options: Any
) -> SpeakerFactory:
    """tau2's user simulator served at `base_url` as `model` (`SimulatedUser` options)."""

    def make(task: Any, environment: Any) -> Speaker:
        return SimulatedUser(
            task, environment, base_url=base_url, model=model, api_key=api_key, **options
        )

    return make


def _key(variable: str) -> str:
    """The API key in environment variable `variable` ("" or unset: "EMPTY")."""
    return (os.environ.get(variable) if variable else None) or "EMPTY"


def from_config(inputs: EnvInputs) -> Tau2Environment:
    """The "tau2" environment of `env.tau2`, its domain code run in the sandbox
    `tools.sandbox`."""
    t = inputs.env.tau2
    if t.user == "simulator":
        if not (t.user_url and t.user_model):
            raise ValueError("env.tau2.user='simulator' needs env.tau2.user_url and user_model")
        speaker = simulated_user_factory(
            t.user_url,
            t.user_model,
            api_key=_key(t.user_api_key_env),
            temperature=t.user_temperature,
            price_in=t.user_price_in,
            price_out=t.user_price_out,
            retries=t.user_retries,
        )
    elif t.user == "scripted":
        speaker = scripted_user_factory
    else:
        raise ValueError(f"env.tau2.user must be one of {USER_KINDS}, got {t.user!r}")
    meta_tools = tuple(s.strip() for s in t.meta_tools.split(",") if s.strip())
    experts: dict[str, ExpertClient] = {}
    if meta_tools:
        if not t.expert_url:
            raise ValueError("env.tau2.meta_tools needs env.tau2.expert_url (the experts' server)")
        experts = {
            p.backend: OpenAIChatExpert(
                t.expert_url,
                t.expert_served_model or p.backend,
                api_key_env=t.expert_api_key_env or None,
            )
            for p in EXPERT_PROFILES
        }
    return Tau2Environment(
        speaker,
        data_dir=t.data_dir or None,
        max_steps=t.max_steps,
        max_errors=t.max_errors,
        experts=experts,
        meta_tools=meta_tools,
        nl_assertions=t.nl_assertions,
        judge_url=t.judge_url,
        judge_model=t.judge_model,
        judge_api_key=_key(t.judge_api_key_env),
        domain=t.domain,
        expert_mode=t.expert_mode,
        drop_tools=split_names(t.drop_tools),
        evaluator_retries=inputs.infra_retries,
        domains_dir=t.domains_dir or None,
        sandbox=inputs.tools.sandbox,
        code_is_trusted=inputs.tools.code_is_trusted,
        release_domains_in_process=t.release_domains_in_process,
    )


def split_names(text: str) -> tuple[str, ...]:
    """The names of a comma-separated config field, blanks dropped."""
    return tuple(s.strip() for s in text.split(",") if s.strip())
