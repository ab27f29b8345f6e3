"""From an experiment config to the objects a run needs: one builder per part.

Each builder reads only its own config section, so drivers (`grpo_hle.py`,
`sft.py`, `evaluate.py`) assemble exactly the parts they use.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from orchestra_jax.chat.tokenizer import ChatTokenizer, load_tokenizer
from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint
from orchestra_jax.models.qwen3 import Qwen3ForCausalLM
from orchestra_jax.models.qwen3_config import Qwen3Config
from orchestra_jax.parallel.mesh import (
    create_sharded_model,
    make_mesh,
    mesh_errors,
    num_batch_shards,
)
from orchestra_jax.rl.batching import BatchingConfig
from orchestra_jax.rl.learner import LearnerConfig
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.tools.config import SamplerRanges
from orchestra_jax.training.config_checks import ConfigError, parse_sources, split_list

log = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def build_tokenizer(config) -> ChatTokenizer:
    return load_tokenizer(config.tokenizer)


def build_mesh(config) -> jax.sharding.Mesh:
    """The mesh over every device of the job; a config that cannot fit it exits naming
    the fields to change (`parallel/mesh.mesh_errors`)."""
    errors = mesh_errors(config, num_devices=jax.device_count(), num_processes=jax.process_count())
    if errors:
        raise ConfigError("invalid config for this job's devices:\n  " + "\n  ".join(errors))
    return make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)


def build_model(config, mesh, tokenizer: ChatTokenizer) -> tuple[Qwen3ForCausalLM, Qwen3Config]:
    """The policy: a preset initialised on the mesh, or a Hugging Face checkpoint."""
    runtime = dict(
        param_dtype=DTYPES[config.model.param_dtype],
        dtype=DTYPES[config.model.dtype],
        scan_layers=config.model.scan_layers,
        remat=config.model.remat,
    )
    if config.model.hf_path:
        model, model_config = load_hf_checkpoint(
            config.model.hf_path,
            dtype=runtime.pop("param_dtype"),
            mesh=mesh,
            compute_dtype=runtime.pop("dtype"),
            **runtime,
        )
    else:
        overrides = dict(config.model.get("overrides", {}))
        model_config = Qwen3Config.preset(config.model.preset, **overrides, **runtime)
        model = create_sharded_model(model_config, mesh, seed=config.seed)
    if model_config.vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"model vocab {model_config.vocab_size} < tokenizer vocab "
            f"{tokenizer.vocab_size} ({config.tokenizer})"
        )
    num_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    log.info(
        "policy: %s, %.2fM parameters",
        config.model.preset or config.model.hf_path,
        num_params / 1e6,
    )
    return model, model_config


def build_learner_config(config, *, total_steps: int | None = None, mesh=None) -> LearnerConfig:
    """The GRPO learner's settings; a micro-batch holds `rl.micro_batch_size` rows on
    each of the mesh's batch shards (one device's share when `mesh` is None)."""
    rl = config.rl
    return LearnerConfig(
        learning_rate=rl.lr,
        weight_decay=rl.weight_decay,
        grad_clip=rl.grad_clip,
        schedule=rl.schedule,
        warmup_steps=rl.warmup_steps,
        total_steps=total_steps,
        micro_batch_size=rl.micro_batch_size * (num_batch_shards(mesh) if mesh else 1),
        clip_low=rl.clip_low,
        clip_high=rl.clip_high,
        dual_clip=rl.dual_clip or None,
        agg=rl.loss_agg,
        kl_coef=rl.kl_coef,
        kl_type=rl.kl_type,
        temperature=max(config.rollout.temperature, 1e-6),
        tis_cap=rl.tis_cap or None,
    )


def build_sft_learner_config(config) -> LearnerConfig:
    return dataclasses.replace(
        build_learner_config(config, total_steps=config.num_steps),
        learning_rate=config.sft.lr,
        kl_coef=0.0,
        schedule=config.sft.schedule,
        warmup_steps=config.sft.warmup_steps,
        total_steps=config.sft.steps,
        micro_batch_size=None,
        temperature=1.0,
    )


def build_batching(config, row_multiple: int) -> BatchingConfig:
    return BatchingConfig(seq_buckets=tuple(config.rl.seq_buckets), row_multiple=row_multiple)


def build_engine(config, model, model_config, tokenizer):
    """The rollout engine named by `rollout.engine` (in-process JAX or SGLang servers)."""
    from orchestra_jax.rollout.engine import make_engine

    if config.rollout.engine == "jax":
        return make_engine(
            "jax",
            model=model,
            max_batch_size=config.rollout.max_batch_size,
            max_seq_len=config.rollout.max_seq_len,
            prefix_cache=config.rollout.prefix_cache,
        )
    return make_engine(
        "sglang",
        urls=split_list(config.rollout.urls),
        model_config=model_config,
        weights_dir=config.rollout.weights_dir,
    )


def sampling_params(config) -> SamplingParams:
    r = config.rollout
    return SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=config.agent.max_new_tokens_per_turn,
    )


def loop_kwargs(config) -> dict[str, Any]:
    """Keyword arguments of `agent.loop.run_episodes` from `config.agent`."""
    a = config.agent
    return dict(
        max_turns=a.max_turns,
        max_context_tokens=a.max_context_tokens,
        max_new_tokens_per_turn=a.max_new_tokens_per_turn,
        tool_timeout_s=a.tool_timeout_s,
        enable_thinking=a.enable_thinking,
        seconds_per_generated_token=a.seconds_per_generated_token or None,
        charge_tool_failure_time=config.tools.charge_measured_time,
        max_batch_size=config.rollout.max_batch_size,
        max_concurrent_episodes=a.max_concurrent_episodes or None,
    )


def sampler_ranges(config) -> SamplerRanges:
    t = config.tools
    return SamplerRanges(
        price_scale=(t.price_scale_min, t.price_scale_max),
        latency_scale=(t.latency_scale_min, t.latency_scale_max),
        keep_probability=t.keep_probability,
        shuffle_aliases=t.shuffle_aliases,
        cost_weight=(0.0, t.cost_weight_max),
        latency_weight=(0.0, t.latency_weight_max),
        efficiency_off_probability=t.efficiency_off_prob,
        tool_preference_probability=t.preference_prob,
    )


def build_env(config):
    """The offline environment: tasks of the synthetic source, corpus, simulated
    experts, and the sandbox named by `tools.sandbox` (memoized where
    `tools.memoize_code`)."""
    from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
    from orchestra_jax.tools.python_sandbox import run_python
    from orchestra_jax.tools.sandbox_cache import MemoizedSandbox

    run_code = functools.partial(run_python, isolation=config.tools.sandbox)
    if config.tools.memoize_code:
        run_code = MemoizedSandbox(run_code)
    return SyntheticOrchestrationEnv(
        seed=config.data.synthetic_seed,
        num_entities=config.data.synthetic_num_entities,
        run_code=run_code,
        charge_measured_time=config.tools.charge_measured_time,
    )


def source_specs(config, split: str, num_synthetic: int) -> list[dict[str, Any]]:
    """`data.sources` as specs for `data.sources.load_sources`."""
    specs = []
    for name, weight in parse_sources(config.data.sources):
        spec: dict[str, Any] = {"kind": name, "weight": weight}
        if name == "synthetic":
            spec.update(
                seed=config.data.synthetic_seed,
                split=split,
                n=num_synthetic,
                num_entities=config.data.synthetic_num_entities,
            )
        else:
            spec["path"] = config.data.paths[name]
        specs.append(spec)
    return specs
