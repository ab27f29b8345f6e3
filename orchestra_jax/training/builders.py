"""From an experiment config to the parts a run needs: one builder per part.

`build_*(config)` builds a part, reading the typed section of its package
(`RLConfig`, `ModelConfig`, `LoRAConfig`, `RewardConfig`, `JudgeConfig`,
`ToolsConfig`, `RolloutConfig`, `AgentConfig`, ...). The config is checked before,
by `experiment_config.validate` (every section's check and the rules between
sections). Drivers (`grpo_hle.py`, `sft.py`, `evaluate.py`) assemble exactly the
parts they use.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from orchestra_jax.agent.config import AgentConfig
from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.chat.tokenizer import ChatTokenizer, load_tokenizer
from orchestra_jax.config_section import ConfigError
from orchestra_jax.data.config import DataConfig
from orchestra_jax.data.splits import load_split
from orchestra_jax.envs.config import EnvConfig
from orchestra_jax.envs.environment import Environment
from orchestra_jax.envs.inputs import EnvInputs, make_env
from orchestra_jax.models.config import DTYPES, LoRAConfig, ModelConfig
from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint
from orchestra_jax.models.lora import LoRAParam, LoRASpec
from orchestra_jax.models.qwen3.config import Qwen3Config
from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM, create_sharded_model
from orchestra_jax.parallel.config import MeshConfig
from orchestra_jax.parallel.mesh import make_mesh, mesh_errors, num_batch_shards
from orchestra_jax.rewards.config import JudgeConfig, RewardConfig
from orchestra_jax.rewards.judge import JUDGE_PROMPTS, JudgeCache, LLMJudge
from orchestra_jax.rewards.registry import GroupReward
from orchestra_jax.rl.batching import BatchingConfig
from orchestra_jax.rl.config import RLConfig
from orchestra_jax.rl.learner import LearnerConfig
from orchestra_jax.rollout.config import RolloutConfig, engine_parameters
from orchestra_jax.rollout.engine import ENGINES, RolloutEngine, SamplingParams
from orchestra_jax.tools.config_sampler import SamplerRanges
from orchestra_jax.tools.experts.client import ExpertError, OpenAIChatExpert, probe_endpoint
from orchestra_jax.tools.tools_config import ToolsConfig
from orchestra_jax.training.sft_config import SFTConfig

log = logging.getLogger(__name__)


# --- the policy: tokenizer, mesh, model --------------------------------------------


def build_tokenizer(config: Any) -> ChatTokenizer:
    return load_tokenizer(config.tokenizer)


def build_mesh(config: Any) -> jax.sharding.Mesh:
    """The mesh over every device of the job; a config that cannot run on them fails
    naming the fields to change (`parallel/mesh.mesh_errors`)."""
    errors = device_errors(config, jax.device_count(), jax.process_count())
    if errors:
        raise ConfigError("invalid config for this job's devices:\n  " + "\n  ".join(errors))
    return make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)


def device_errors(config: Any, num_devices: int, num_processes: int) -> list[str]:
    """What of `config` cannot run on `num_devices` devices over `num_processes` hosts
    (`parallel/mesh.mesh_errors` on the mesh section, `rl.tasks_per_step` and
    `rollout.engine`)."""
    return mesh_errors(
        MeshConfig.from_config(config.mesh),
        tasks_per_step=config.rl.tasks_per_step,
        rollout_engine=config.rollout.engine,
        num_devices=num_devices,
        num_processes=num_processes,
    )


def build_model(
    config: Any, mesh: jax.sharding.Mesh, tokenizer: ChatTokenizer
) -> tuple[Qwen3ForCausalLM, Qwen3Config]:
    """The policy: a preset initialised on the mesh, or a Hugging Face checkpoint."""
    m = ModelConfig.from_config(config.model)
    runtime = dict(
        param_dtype=DTYPES[m.param_dtype],
        dtype=DTYPES[m.dtype],
        scan_layers=m.scan_layers,
        remat=m.remat,
        attention=m.attention,
        lora=lora_spec(config),
    )
    if m.hf_path:
        model, model_config = load_hf_checkpoint(
            m.hf_path,
            dtype=runtime.pop("param_dtype"),
            mesh=mesh,
            compute_dtype=runtime.pop("dtype"),
            seed=config.seed,
            **runtime,
        )
    else:
        model_config = Qwen3Config.preset(m.preset, **m.overrides, **runtime)
        model = create_sharded_model(model_config, mesh, seed=config.seed)
    if model_config.vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"model vocab {model_config.vocab_size} < tokenizer vocab "
            f"{tokenizer.vocab_size} ({config.tokenizer})"
        )
    num_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    log.info(
        "policy: %s, %.2fM parameters",
        m.preset or m.hf_path,
        num_params / 1e6,
    )
    if model_config.lora is not None:
        adapters = sum(x.size for x in jax.tree.leaves(nnx.state(model, LoRAParam)))
        log.info("LoRA: %.2fM adapter parameters train, the base is frozen", adapters / 1e6)
    return model, model_config


def lora_spec(config: Any) -> LoRASpec | None:
    """The policy's LoRA adapters (`lora.*`), or None when `lora.rank` is 0."""
    return LoRAConfig.from_config(config.lora).spec()


# --- rollouts: engine, sampling, episode limits ------------------------------------


def _engine_arguments(config: Any, model: Any = None, model_config: Any = None) -> dict:
    """Everything a rollout engine may take from the config
    (`RolloutConfig.engine_arguments`); each engine takes the arguments its
    constructor names (`build_engine`)."""
    return RolloutConfig.from_config(config.rollout).engine_arguments(
        model,
        model_config,
        max_context_tokens=AgentConfig.from_config(config.agent).max_context_tokens,
    )


def build_engine(config: Any, model: Any, model_config: Any) -> RolloutEngine:
    """The rollout engine `rollout.engine` names ("jax": in process, "sglang", "vllm":
    servers),
    given the config's arguments its constructor takes."""
    engine_class = ENGINES.get(config.rollout.engine)
    parameters = engine_parameters(config.rollout.engine)
    arguments = _engine_arguments(config, model, model_config)
    return engine_class(**{k: v for k, v in arguments.items() if k in parameters})


def sampling_params(config: Any) -> SamplingParams:
    """Training rollouts' sampling (`rollout.*`, `RolloutConfig.sampling_params`)."""
    return RolloutConfig.from_config(config.rollout).sampling_params(
        AgentConfig.from_config(config.agent).max_new_tokens_per_turn
    )


def eval_sampling_params(config: Any) -> SamplingParams:
    """Held-out evaluation's sampling: `eval.temperature`, no truncation."""
    return SamplingParams(
        temperature=config.eval.temperature,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=AgentConfig.from_config(config.agent).max_new_tokens_per_turn,
    )


def loop_limits(config: Any) -> LoopLimits:
    """The agent loop's limits from `agent.*`, `tools.charge_measured_time` and
    `rollout.max_batch_size`."""
    a = AgentConfig.from_config(config.agent)
    return LoopLimits(
        max_turns=a.max_turns,
        max_context_tokens=a.max_context_tokens,
        max_new_tokens_per_turn=a.max_new_tokens_per_turn,
        tool_timeout_s=a.tool_timeout_s,
        enable_thinking=a.enable_thinking,
        seconds_per_generated_token=a.seconds_per_generated_token or None,
        charge_tool_failure_time=config.tools.charge_measured_time,
        max_concurrent_episodes=a.max_concurrent_episodes or None,
        max_batch_size=RolloutConfig.from_config(config.rollout).max_batch_size,
        context=a.context_policy(),
        tool_calls=a.tool_calls,
        accounting=a.accounting,
        constrain_enum_arguments=a.constrain_enum_arguments,
    )


# --- tasks ----------------------------------------------------------------------


def build_task_sources(config: Any, split: str) -> tuple[list[Any], list[dict[str, Any]]]:
    """The `data.sources` tasks of `split` ("train" or the held-out split) as weighted
    sources for the pipeline, and a read report per source (`data/splits.load_split`:
    file sources are split by `data.eval_paths` or `data.eval_fraction`)."""

    return load_split(DataConfig.from_config(config.data), split, config.eval.num_tasks)


# --- the environment and its tools ------------------------------------------------


def env_inputs(config: Any) -> EnvInputs:
    """What the environment factory gets (`envs/inputs.EnvInputs`): the `env`, `data`
    and `tools` sections, the tokenizer, `eval.num_tasks` and `rollout.infra_retries`."""
    return EnvInputs(
        env=EnvConfig.from_config(config.env),
        data=DataConfig.from_config(config.data),
        tools=ToolsConfig.from_config(config.tools),
        tokenizer=config.tokenizer,
        eval_num_tasks=config.eval.num_tasks,
        infra_retries=config.rollout.infra_retries,
    )


def build_env(config: Any) -> Environment:
    """The environment `env.name` names (`envs/environment.ENVIRONMENTS`), e.g. the
    offline synthetic world with the sandbox `tools.sandbox`. An expert endpoint that
    does not answer, or a key that is not set, is a `ConfigError` naming it."""
    try:
        return make_env(env_inputs(config))
    except ExpertError as e:
        raise ConfigError(f"env.name={config.env.name!r}: {e}") from None


def tool_config_fields(config: Any) -> dict[str, Any]:
    """`ToolConfig` fields every task's configuration gets
    (`ToolsConfig.tool_config_fields`)."""
    return ToolsConfig.from_config(config.tools).tool_config_fields()


def sampler_ranges(config: Any) -> SamplerRanges:
    """The ranges of each training task's tool configuration (`ToolsConfig.sampler_ranges`)."""
    return ToolsConfig.from_config(config.tools).sampler_ranges()


# --- reward ------------------------------------------------------------------------


def build_reward(config: Any) -> GroupReward:
    """The group reward `reward.type` names, its weights from the `reward` section
    (`RewardConfig.group_reward`)."""
    return RewardConfig.from_config(config.reward).group_reward()


def build_judge(
    config: Any, cache_path: str | None = None, *, also_read: Sequence[str] = ()
) -> LLMJudge | None:
    """The LLM judge of `reward.judge` (`JudgeConfig`; None when its `base_url` is
    empty): an `OpenAIChatExpert` on that endpoint, the prompt style `prompt`,
    verdicts cached in `cache_path` (JSON lines, local or `gs://`; the files in
    `also_read`, other hosts' caches, are read too). Its endpoint must answer now
    (ConfigError naming it otherwise)."""
    j = JudgeConfig.from_config(config.reward.judge)
    if not j.base_url:
        return None
    problem = probe_endpoint(j.base_url, api_key_env=j.api_key_env or None)
    if problem:
        raise ConfigError(f"reward.judge: the judge {j.model!r}: {problem}")
    name = f"{j.model} ({j.prompt} prompt)"
    client = OpenAIChatExpert(
        j.base_url,
        j.model,
        api_key_env=j.api_key_env or None,
        retries=j.retries,
        timeout=j.timeout_s,
        name=f"judge {j.model}",
        extra_body=dict(j.extra_body or {}),
        reasoning_model=j.reasoning_model,
    )
    return LLMJudge(
        client,
        JudgeCache(cache_path, also_read=also_read),
        price_in=j.price_in,
        price_out=j.price_out,
        max_tokens=j.max_tokens,
        name=name,
        prompt=JUDGE_PROMPTS.get(j.prompt),
        answer_match=j.answer_match,
    )


# --- the learner ----------------------------------------------------------------------


def build_learner_config(
    config: Any, *, total_steps: int | None = None, mesh: Any = None
) -> LearnerConfig:
    """The GRPO learner's settings (`RLConfig.learner_config`); a micro-batch holds
    `rl.micro_batch_size` rows on each of the mesh's batch shards (one device's share
    when `mesh` is None)."""
    return RLConfig.from_config(config.rl).learner_config(
        temperature=config.rollout.temperature,
        total_steps=total_steps,
        batch_shards=num_batch_shards(mesh) if mesh else 1,
    )


def build_batching(config: Any, row_multiple: int) -> BatchingConfig:
    return RLConfig.from_config(config.rl).batching(row_multiple)


# --- the warm start ----------------------------------------------------------------


def build_sft_learner_config(config: Any) -> LearnerConfig:
    """The warm start's learner settings (`SFTConfig.learner_config`)."""
    grpo = build_learner_config(config, total_steps=config.num_steps)
    return SFTConfig.from_config(config.sft).learner_config(grpo)
