"""An experiment config, typed: every section built once from the ml-collections file
by the class its package owns, and the rules that span sections.

`sections(config)` builds the typed sections (`Sections`); each section's own check
is its class's `problems()` (`config_section.Section`). `problems(config)` lists every
mistake of a config, the sections' and the rules' below, one message each, and
`validate(config)` raises them together as a `ConfigError`, which the drivers print
and exit on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from orchestra_jax.agent.config import AgentConfig
from orchestra_jax.config_section import (
    ConfigError,
    ExperimentConfig,
    Section,
    SectionError,
    choice,
)
from orchestra_jax.data.config import DataConfig
from orchestra_jax.envs.config import EnvConfig
from orchestra_jax.eval.config import EvalConfig
from orchestra_jax.eval.routers import CONVERSATION_ROUTERS, is_router
from orchestra_jax.models.config import LoRAConfig, ModelConfig
from orchestra_jax.parallel.config import DistributedConfig, MeshConfig
from orchestra_jax.rewards.config import RewardConfig
from orchestra_jax.rl.config import RLConfig
from orchestra_jax.rl.learner import SCHEDULES
from orchestra_jax.rollout.config import RolloutConfig
from orchestra_jax.tools.live_backends import backend_config_problems
from orchestra_jax.tools.tools_config import ToolsConfig
from orchestra_jax.training.eval_protocols import EVAL_PROTOCOLS
from orchestra_jax.training.run_config import CheckpointConfig, LogConfig, RunConfig
from orchestra_jax.training.sft_config import SFTConfig


@dataclasses.dataclass(frozen=True)
class Sections:
    """The typed sections of an experiment config, each its package's class, and
    the run's own fields (`run`: the top-level values)."""

    run: RunConfig
    checkpoint: CheckpointConfig
    log: LogConfig
    model: ModelConfig
    lora: LoRAConfig
    mesh: MeshConfig
    distributed: DistributedConfig
    rl: RLConfig
    sft: SFTConfig
    reward: RewardConfig
    eval: EvalConfig
    tools: ToolsConfig
    data: DataConfig
    env: EnvConfig
    rollout: RolloutConfig
    agent: AgentConfig


# The typed sections: (config field, class), built in this order.
SECTION_CLASSES: tuple[tuple[str, type[Section]], ...] = (
    ("run", RunConfig),  # the top-level values (RunConfig.top_level)
    ("checkpoint", CheckpointConfig),
    ("log", LogConfig),
    ("model", ModelConfig),
    ("mesh", MeshConfig),
    ("distributed", DistributedConfig),
    ("lora", LoRAConfig),
    ("rl", RLConfig),
    ("sft", SFTConfig),
    ("reward", RewardConfig),
    ("eval", EvalConfig),
    ("tools", ToolsConfig),
    ("data", DataConfig),
    ("env", EnvConfig),
    ("rollout", RolloutConfig),
    ("agent", AgentConfig),
)


def section_values(config: ExperimentConfig, name: str) -> Any:
    """The part of `config` section `name` is built from: the top-level values for
    "run", else the section of that name."""
    return RunConfig.top_level(config) if name == "run" else config[name]


def _build(config: ExperimentConfig) -> tuple[dict[str, Any], list[str]]:
    """Every typed section that builds, and every section's problems."""
    built, errors = {}, []
    for name, cls in SECTION_CLASSES:
        values = section_values(config, name)
        try:
            built[name] = cls.from_config(values)
        except SectionError as e:
            errors += e.problems
            built[name] = cls.unchecked(values)
    return built, errors


def sections(config: ExperimentConfig) -> Sections:
    """The config's typed sections; a `ConfigError` listing every problem when one
    does not build or a rule between sections fails."""
    built, errors = _build(config)
    errors += _cross_section_problems(config, built)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    return Sections(**built)


# --- rules between sections -----------------------------------------------------

# Rollout engines that sample with the policy's adapters: the JAX engine runs the
# model itself, the SGLang and vLLM clients sync the adapters to their servers'
# LoRA endpoints (`rollout/http/client.py`, weight sync by adapter).
LORA_ENGINES = ("jax", "sglang", "vllm")


def _context_kv_cache(
    config: ExperimentConfig, agent: AgentConfig, rollout: RolloutConfig
) -> list[str]:
    """The agent's context × the JAX engine's KV cache: an episode's context fits."""
    del config
    if agent.max_context_tokens > rollout.max_seq_len and rollout.engine == "jax":
        return [
            f"agent.max_context_tokens ({agent.max_context_tokens}) exceeds "
            f"rollout.max_seq_len ({rollout.max_seq_len}), the KV-cache length"
        ]
    return []


def _enum_constraint_engine(
    config: ExperimentConfig, agent: AgentConfig, rollout: RolloutConfig
) -> list[str]:
    """The enum arguments' token constraint × the engine: only the JAX engine follows it."""
    del config
    if agent.constrain_enum_arguments and rollout.engine != "jax":
        return [
            f"agent.constrain_enum_arguments needs rollout.engine='jax' (got "
            f"{rollout.engine!r}): the HTTP engines do not follow a token constraint"
        ]
    return []


def _context_sample_unit(config: ExperimentConfig, agent: AgentConfig, rl: RLConfig) -> list[str]:
    """The agent's context × rl.sample_unit: a context that gives every turn its own
    prompt trains turn by turn."""
    del config
    if agent.context_problems():  # the agent's check names them
        return []
    if agent.context_policy().fresh_prompts and rl.sample_unit == "episode":
        return [
            f"agent.context={agent.context!r} gives every turn its own prompt, so "
            "its episodes train turn by turn: set rl.sample_unit='turn'"
        ]
    return []


def _lora_engine(config: ExperimentConfig, lora: LoRAConfig, rollout: RolloutConfig) -> list[str]:
    """LoRA × rollout engine: the engine must sample with the adapters."""
    del config
    engine = rollout.engine
    if lora.rank > 0 and engine not in LORA_ENGINES:
        return [
            f"rollout.engine={engine!r} with lora.rank > 0: that engine does not sample "
            "with the policy's adapters; use one that does: "
            + ", ".join(repr(e) for e in LORA_ENGINES)
        ]
    return []


def _rl_rules(
    config: ExperimentConfig, rl: RLConfig, rollout: RolloutConfig, agent: AgentConfig
) -> list[str]:
    """Partial rollouts × engine, sequence buckets × context, schedule × num_steps."""
    errors = []
    if rl.max_staleness and rl.partial_rollouts and rollout.engine not in ("jax", "vllm"):
        errors.append(
            "rl.partial_rollouts needs rollout.engine='jax' or 'vllm' (SGLang servers load "
            "versioned folders between requests): set rl.partial_rollouts = False"
        )
    buckets = list(rl.seq_buckets)
    if buckets and buckets == sorted(set(buckets)):
        if buckets[-1] < agent.max_context_tokens:
            errors.append(
                f"rl.seq_buckets: the largest ({buckets[-1]}) must hold "
                f"agent.max_context_tokens ({agent.max_context_tokens})"
            )
    if (
        rl.schedule in SCHEDULES
        and rl.schedule != "constant"
        and rl.warmup_steps >= config.num_steps
    ):
        errors.append(
            f"rl.schedule={rl.schedule!r} decays after rl.warmup_steps "
            f"({rl.warmup_steps}), which must be < num_steps ({config.num_steps})"
        )
    return errors


def _sft_demo_policy(config: ExperimentConfig, sft: SFTConfig) -> list[str]:
    """The warm start's demonstrations × τ²'s expert mode: a router that relays
    ask_expert's advice needs env.tau2.expert_mode='advise'."""
    if (
        sft.steps
        and is_router(sft.demo_policy)
        and config.env.name == "tau2"
        and config.env.tau2.expert_mode != "advise"
        and any(part in CONVERSATION_ROUTERS for part in sft.demo_policy.split("+"))
    ):
        return [
            f"sft.demo_policy={sft.demo_policy!r} relays ask_expert's advice; it needs "
            "env.tau2.expert_mode='advise'"
        ]
    return []


# Readers whose tasks an LLM judge grades (the paper's free-form answers; HLE as
# the reference grades it: exact match, then the judge).
JUDGED_SOURCES = ("frames", "generalthought", "hle")


def _judge_for_sources(
    config: ExperimentConfig, reward: RewardConfig, data: DataConfig
) -> list[str]:
    """The judge × the data: sources whose answers a judge grades need one."""
    del config
    judged = [s for s in data.file_sources() if s in JUDGED_SOURCES]
    if judged and not reward.judge.base_url:
        return [
            f"reward.judge.base_url: data.sources {judged} are graded by an LLM judge; "
            "set reward.judge.base_url and reward.judge.model"
        ]
    return []


def _eval_protocol(config: ExperimentConfig, eval_: EvalConfig) -> list[str]:
    """The evaluation protocol (training/eval_protocols.py) × the sections it sets
    or reads."""
    errors = choice("eval.protocol", eval_.protocol, EVAL_PROTOCOLS)
    if not errors:
        errors += EVAL_PROTOCOLS.get(eval_.protocol).problems(config)
    return errors


def _eval_baselines(config: ExperimentConfig, eval_: EvalConfig) -> list[str]:
    """The baseline routers × the environment: QA routers play QA episodes, τ²
    routers conversations, and these ask τ²'s experts for advice."""
    errors = []
    env = config.env.name
    conversations = env == "tau2"
    baselines = eval_.baseline_names()
    for name in baselines:
        if (
            is_router(name)
            and env in ("tau2", "synthetic")
            and conversations != all(part in CONVERSATION_ROUTERS for part in name.split("+"))
        ):
            errors.append(
                f"eval.baselines: {name!r} does not play {env!r} episodes; "
                + (f"τ² conversations take {CONVERSATION_ROUTERS}" if conversations else "")
                + ("" if conversations else f"{CONVERSATION_ROUTERS} are for τ² conversations")
            )
    if conversations and baselines and not config.env.tau2.meta_tools:
        errors.append("eval.baselines: τ² routers ask experts: set env.tau2.meta_tools=ask_expert")
    elif conversations and baselines and config.env.tau2.expert_mode != "advise":
        errors.append(
            "eval.baselines: τ² routers relay ask_expert's advice; they need "
            "env.tau2.expert_mode='advise'"
        )
    return errors


def _tools_rules(
    config: ExperimentConfig, tools: ToolsConfig, data: DataConfig, env: EnvConfig
) -> list[str]:
    """The tools × the environment and the data: what serves each tool
    (`tools/live_backends.backend_config_problems`), and the search's pricing."""
    errors = []
    del config
    if tools.search_pricing == "reference" and env.name not in ("qa", "routed"):
        errors.append(
            "tools.search_pricing='reference' prices the live search of env.name='qa'; "
            f"env.name={env.name!r} has none"
        )
    return errors + backend_config_problems(tools, env.played(), data.file_sources())


def _data_held_out(config: ExperimentConfig, data: DataConfig, eval_: EvalConfig) -> list[str]:
    """The data × the evaluation: every file source has a held-out split when the
    run is evaluated (`data.eval_paths` or `data.eval_fraction`)."""
    del config
    errors = []
    if eval_.num_tasks and data.eval_fraction == 0:
        for key in sorted(data.file_source_keys() - set(data.held_out_paths())):
            errors.append(
                f"data.sources: {key!r} has no held-out split for evaluation: set "
                f"data.eval_paths.{key} or data.eval_fraction > 0"
            )
    return errors


# Each rule: (the typed sections it reads, the rule). A section whose own check
# failed is read unchecked (`Section.unchecked`), so every rule still runs.
_RULES: tuple[tuple[tuple[str, ...], Callable[..., list[str]]], ...] = (
    (("agent", "rollout"), _context_kv_cache),
    (("agent", "rollout"), _enum_constraint_engine),
    (("agent", "rl"), _context_sample_unit),
    (("lora", "rollout"), _lora_engine),
    (("rl", "rollout", "agent"), _rl_rules),
    (("sft",), _sft_demo_policy),
    (("reward", "data"), _judge_for_sources),
    (("eval",), _eval_protocol),
    (("eval",), _eval_baselines),
    (("tools", "data", "env"), _tools_rules),
    (("data", "eval"), _data_held_out),
)


def _cross_section_problems(config: ExperimentConfig, built: dict[str, Any]) -> list[str]:
    errors = []
    for needs, rule in _RULES:
        errors += rule(config, *(built[name] for name in needs))
    return errors


# --- every problem of a config ----------------------------------------------------


def problems(config: ExperimentConfig) -> list[str]:
    """Every mistake of `config`, one message each: the run's fields, every section's
    check, and the rules between sections."""
    built, errors = _build(config)
    return errors + _cross_section_problems(config, built)


def validate(config: ExperimentConfig) -> None:
    """Raises ConfigError listing every problem of `config` (see `problems`)."""
    errors = problems(config)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
