"""Start-up validation of an experiment config: every mistake named, in one go.

`validate(config)` collects one line per problem and raises `ConfigError` with
all of them, so a researcher fixes a config in one round instead of one crash
per field. The drivers catch `ConfigError` and exit with its message.
"""

from __future__ import annotations

import os
from typing import Any

ENGINES = ("jax", "sglang")
REWARDS = ("preference", "efficiency", "utility", "outcome")
BACKENDS = ("offline",)
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "mse", "k3")


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem, one per line."""


def _positive(errors, config, *names, allow_zero=False):
    for name in names:
        value = config
        for part in name.split("."):
            value = value[part]
        ok = value >= 0 if allow_zero else value > 0
        if not ok:
            errors.append(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def parse_weighted(spec: str, field: str) -> list[tuple[str, float]]:
    """ "synthetic:3,frames:1" -> [("synthetic", 3.0), ("frames", 1.0)]; weight defaults to 1.

    `field` is the config field the spec came from, named in the error.
    """
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, _, weight = item.partition(":")
        try:
            out.append((name.strip(), float(weight) if weight else 1.0))
        except ValueError:
            raise ConfigError(f"{field}: bad weight in {item!r} (want name:weight)") from None
    return out


def parse_sources(spec: str) -> list[tuple[str, float]]:
    """`data.sources`, e.g. "synthetic:3,frames:1" (see `parse_weighted`)."""
    return parse_weighted(spec, "data.sources")


def stratum_weights(config: Any) -> dict[str, float]:
    """`data.stratum_weights` ("logic:2") as {value: weight}."""
    return dict(parse_weighted(config.data.stratum_weights, "data.stratum_weights"))


def split_list(spec: str) -> list[str]:
    return [s.strip() for s in spec.split(",") if s.strip()]


def validate(config: Any) -> None:
    """Raises ConfigError listing every problem of `config` (see module docstring)."""
    from orchestra_jax.data.pipeline import STRATIFY_FIELDS
    from orchestra_jax.data.readers import READERS
    from orchestra_jax.models.qwen3 import Qwen3Config
    from orchestra_jax.tools.python_sandbox import sandbox_config_errors

    errors: list[str] = []
    model = config.model
    if bool(model.preset) == bool(model.hf_path):
        errors.append(
            "model: set exactly one of model.preset and model.hf_path "
            f"(got preset={model.preset!r}, hf_path={model.hf_path!r})"
        )
    if model.preset:
        try:
            Qwen3Config.preset(model.preset)
        except (KeyError, ValueError) as e:
            errors.append(f"model.preset: {e}")
    if model.hf_path and not os.path.isfile(os.path.join(model.hf_path, "config.json")):
        errors.append(f"model.hf_path: no config.json in {model.hf_path!r}")
    for name in ("param_dtype", "dtype"):
        if model[name] not in ("float32", "bfloat16"):
            errors.append(f"model.{name} must be 'float32' or 'bfloat16', got {model[name]!r}")
    if config.tokenizer != "demo" and not os.path.exists(
        os.path.join(config.tokenizer, "tokenizer.json")
    ):
        errors.append(
            f"tokenizer: 'demo' or a folder with tokenizer.json, got {config.tokenizer!r}"
        )
    for axis in ("data", "fsdp", "tensor"):
        if config.mesh[axis] == 0 or config.mesh[axis] < -1:
            errors.append(f"mesh.{axis} must be >= 1 or -1 (the rest), got {config.mesh[axis]}")

    rollout = config.rollout
    if rollout.engine not in ENGINES:
        errors.append(f"rollout.engine must be one of {ENGINES}, got {rollout.engine!r}")
    if rollout.engine == "sglang":
        if not split_list(rollout.urls):
            errors.append("rollout.urls: sglang needs at least one server URL")
        if not rollout.weights_dir:
            errors.append("rollout.weights_dir: sglang needs a folder for weight syncs")
    _positive(
        errors,
        config,
        "rollout.max_batch_size",
        "rollout.max_seq_len",
        "agent.max_turns",
        "agent.max_context_tokens",
        "agent.max_new_tokens_per_turn",
        "agent.tool_timeout_s",
        "num_steps",
        "rl.group_size",
        "rl.tasks_per_step",
        "rl.lr",
        "rl.grad_clip",
        "rl.micro_batch_size",
        "checkpoint.keep",
    )
    _positive(
        errors,
        config,
        "rl.kl_coef",
        "rl.weight_decay",
        "rl.warmup_steps",
        "rl.filter_reward_std",
        "rl.tis_cap",
        "sft.steps",
        "eval.every_steps",
        "eval.num_tasks",
        "checkpoint.every_steps",
        "rollout.temperature",
        "agent.seconds_per_generated_token",
        "agent.max_concurrent_episodes",
        "seed",
        "data.synthetic_seed",
        "eval.seed",
        allow_zero=True,
    )
    if not 0 < rollout.top_p <= 1:
        errors.append(f"rollout.top_p must be in (0, 1], got {rollout.top_p}")
    if config.agent.max_context_tokens > rollout.max_seq_len and rollout.engine == "jax":
        errors.append(
            f"agent.max_context_tokens ({config.agent.max_context_tokens}) exceeds "
            f"rollout.max_seq_len ({rollout.max_seq_len}), the KV-cache length"
        )
    if config.rl.group_size < 2:
        errors.append("rl.group_size must be >= 2: GRPO compares episodes of the same task")

    try:
        sources = parse_sources(config.data.sources)
        if not sources:
            errors.append("data.sources is empty")
        for name, weight in sources:
            if name not in READERS:
                errors.append(f"data.sources: unknown source {name!r}; known: {sorted(READERS)}")
            elif name != "synthetic" and name not in config.data.paths:
                errors.append(f"data.sources: {name!r} needs a file in data.paths.{name}")
            if weight <= 0:
                errors.append(f"data.sources: weight of {name!r} must be > 0")
    except ConfigError as e:
        errors.append(str(e))
    if config.data.stratify_by and config.data.stratify_by not in STRATIFY_FIELDS:
        errors.append(
            f"data.stratify_by must be empty or one of {STRATIFY_FIELDS}, "
            f"got {config.data.stratify_by!r}"
        )
    try:
        weights = stratum_weights(config)
        if weights and not config.data.stratify_by:
            errors.append(
                "data.stratum_weights needs data.stratify_by (the field whose values it weighs)"
            )
        for value, weight in weights.items():
            if weight <= 0:
                errors.append(f"data.stratum_weights: weight of {value!r} must be > 0")
    except ConfigError as e:
        errors.append(str(e))
    errors += sandbox_config_errors(config.tools.sandbox, config.tools.code_is_trusted)
    if config.tools.backends not in BACKENDS:
        errors.append(f"tools.backends must be one of {BACKENDS}, got {config.tools.backends!r}")
    for lo, hi in (
        ("price_scale_min", "price_scale_max"),
        ("latency_scale_min", "latency_scale_max"),
    ):
        if not 0 < config.tools[lo] <= config.tools[hi]:
            errors.append(
                f"tools.{lo}/{hi}: need 0 < min <= max, got {config.tools[lo]}, {config.tools[hi]}"
            )
    for name in ("keep_probability", "preference_prob"):
        if not 0 <= config.tools[name] <= 1:
            errors.append(f"tools.{name} must be a probability, got {config.tools[name]}")
    if config.reward.type not in REWARDS:
        errors.append(f"reward.type must be one of {REWARDS}, got {config.reward.type!r}")
    if config.rl.loss_agg not in LOSS_AGGS:
        errors.append(f"rl.loss_agg must be one of {LOSS_AGGS}, got {config.rl.loss_agg!r}")
    from orchestra_jax.rl.grpo import ADVANTAGES, DEFAULT_FORMAT_PENALTY, FORMAT_FILTERS
    from orchestra_jax.rl.learner import SCHEDULES
    from orchestra_jax.eval.routers import ROUTERS, is_router
    from orchestra_jax.training.warm_start import DEFAULT_DEMO_BEST_OF, DEMO_FILTERS

    if config.rl.format_filter not in FORMAT_FILTERS:
        errors.append(
            f"rl.format_filter must be one of {FORMAT_FILTERS}, got {config.rl.format_filter!r}"
        )
    elif (
        config.rl.format_filter != "penalty" and config.rl.format_penalty != DEFAULT_FORMAT_PENALTY
    ):
        errors.append(
            f"rl.format_penalty={config.rl.format_penalty} has no effect unless "
            "rl.format_filter='penalty'"
        )
    if config.rl.advantage not in ADVANTAGES:
        errors.append(
            f"rl.advantage must be one of {ADVANTAGES.names()}, got {config.rl.advantage!r}"
        )
    if config.rl.kl_type not in KL_TYPES:
        errors.append(f"rl.kl_type must be one of {KL_TYPES}, got {config.rl.kl_type!r}")
    if config.rl.clip_low <= 0 or config.rl.clip_high <= 0:
        errors.append("rl.clip_low and rl.clip_high must be > 0")
    if config.rl.dual_clip and config.rl.dual_clip <= 1:
        errors.append(f"rl.dual_clip must be > 1 (or 0 to disable), got {config.rl.dual_clip}")
    buckets = list(config.rl.seq_buckets)
    if not buckets or buckets != sorted(set(buckets)):
        errors.append(f"rl.seq_buckets must be ascending and distinct, got {buckets}")
    elif buckets[-1] < config.agent.max_context_tokens:
        errors.append(
            f"rl.seq_buckets: the largest ({buckets[-1]}) must hold "
            f"agent.max_context_tokens ({config.agent.max_context_tokens})"
        )
    if config.eval.cost_scale_usd <= 0 or config.eval.latency_scale_s <= 0:
        errors.append(
            "eval.cost_scale_usd and eval.latency_scale_s must be > 0 (they scale "
            "the held-out reward and reward.type='utility')"
        )
    for name in split_list(config.eval.baselines):
        if not is_router(name):
            errors.append(
                f"eval.baselines: unknown router {name!r}; known: {sorted(ROUTERS)} "
                "or a '+' mixture of them"
            )
    if config.rl.schedule not in SCHEDULES:
        errors.append(f"rl.schedule must be one of {SCHEDULES}, got {config.rl.schedule!r}")
    elif config.rl.schedule != "constant" and config.rl.warmup_steps >= config.num_steps:
        errors.append(
            f"rl.schedule={config.rl.schedule!r} decays after rl.warmup_steps "
            f"({config.rl.warmup_steps}), which must be < num_steps ({config.num_steps})"
        )
    if config.sft.schedule not in SCHEDULES:
        errors.append(f"sft.schedule must be one of {SCHEDULES}, got {config.sft.schedule!r}")
    if config.sft.warmup_steps < 0 or (
        config.sft.steps and config.sft.warmup_steps >= config.sft.steps
    ):
        errors.append(f"sft.warmup_steps must be in [0, sft.steps), got {config.sft.warmup_steps}")
    if not 0 <= config.sft.ema_decay < 1:
        errors.append(f"sft.ema_decay must be in [0, 1), got {config.sft.ema_decay}")
    if config.sft.demo_filter not in DEMO_FILTERS:
        errors.append(
            f"sft.demo_filter must be one of {DEMO_FILTERS}, got {config.sft.demo_filter!r}"
        )
    if config.sft.demo_best_of < 1:
        errors.append(f"sft.demo_best_of must be >= 1, got {config.sft.demo_best_of}")
    elif config.sft.demo_filter != "best" and config.sft.demo_best_of != DEFAULT_DEMO_BEST_OF:
        errors.append(
            f"sft.demo_best_of={config.sft.demo_best_of} has no effect unless "
            "sft.demo_filter='best'"
        )
    if config.sft.steps and not is_router(config.sft.demo_policy):
        errors.append(
            f"sft.demo_policy must be a router {sorted(ROUTERS)} or a '+' mixture of them, "
            f"got {config.sft.demo_policy!r}"
        )
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
