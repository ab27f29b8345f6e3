"""A trained policy on the config's engine: a GRPO checkpoint, an HF folder, an adapter.

    policy_engine(config, "checkpoint", tokenizer)           <workdir>/checkpoints
    policy_engine(config, "checkpoint:/runs/demo", tokenizer)  that workdir's
    policy_engine(config, "warm_start", tokenizer)           <workdir>/warm_start_params
    policy_engine(config, "warm_start:/runs/demo", tokenizer)  that workdir's
    policy_engine(config, "hf:/path/to/folder", tokenizer)
    policy_engine(config, "hf:<base>+<adapter>", tokenizer)  a PEFT LoRA adapter on
                                                             a base (JAX engine)

`experiments/evaluate.py` and the orchestrator service (`orchestra_jax/serve`) load
their policies here, so both play the same weights on the same engine. With a server
engine (rollout.engine=sglang) the weights are first loaded on every server under a
fresh weight version, and loading fails (`PolicyNotServed`) unless each server
reports it (`training/policy_push.py`). `config` is changed in place where the
policy says so (the workdir of `checkpoint:<workdir>` and `warm_start:<workdir>`, the
model of `hf:`). A run saves its warm start where it has one and a KL term to it
(`sft.steps` > 0, `rl.kl_coef` > 0).
"""

from __future__ import annotations

import dataclasses
from typing import Any

POLICY_FORMS = (
    "checkpoint, checkpoint:<workdir>, warm_start, warm_start:<workdir>, hf:<folder>, "
    "hf:<base>+<adapter>"
)


class PolicyError(ValueError):
    """The policy cannot be loaded as named: an unknown form, a workdir without a
    checkpoint, an adapter on an engine that serves none."""


@dataclasses.dataclass
class PolicyEngine:
    """The engine that plays the policy, the policy's short name (`grpo`,
    `hf_<folder>[+<adapter>]`) and what a summary records of it (steps, paths,
    the weight version on servers)."""

    engine: Any
    name: str
    extra: dict[str, Any]


def is_policy(policy: str) -> bool:
    """Whether `policy` names a trained policy this module loads (not a router)."""
    return policy in ("checkpoint", "warm_start") or policy.startswith(
        ("checkpoint:", "warm_start:", "hf:")
    )


def policy_engine(config: Any, policy: str, tokenizer: Any) -> PolicyEngine:
    """`policy` (one of `POLICY_FORMS`) on the config's engine; for another
    form or a workdir without a checkpoint, `PolicyError`."""
    import jax

    from orchestra_jax.rollout.engine import ServedEngine
    from orchestra_jax.training import builders, host_rollouts, loop_steps

    if policy == "warm_start" or policy.startswith("warm_start:"):
        return warm_start_engine(config, policy.partition(":")[2])
    if policy == "checkpoint" or policy.startswith("checkpoint:"):
        workdir = policy.partition(":")[2]
        if workdir:
            with config.unlocked():
                config.workdir = workdir
        run = loop_steps.setup_run(config)
        served = isinstance(run.engine, ServedEngine)
        step = loop_steps.restore(run, iterator=None, sync_engine=not served)
        if not step:
            raise PolicyError(f"no checkpoint in {run.checkpointer.directory}")
        extra: dict[str, Any] = {"steps": step}
        if served:
            weights = host_rollouts.engine_weights(
                run.learner.policy_params(), run.engine_shardings
            )
            extra["weight_version"] = push(run.engine, weights, f"checkpoint step {step}")
        return PolicyEngine(run.engine, "grpo", extra)
    if not policy.startswith("hf:") or not policy[3:].partition("+")[0]:
        raise PolicyError(f"unknown policy {policy!r}; one of {POLICY_FORMS}")
    base, _, adapter = policy[3:].partition("+")
    with config.unlocked():
        config.model.preset, config.model.hf_path = "", base
        config.lora.rank = 0
        if adapter:
            use_adapter_settings(config, adapter)
    mesh = builders.build_mesh(config)
    model, model_config = builders.build_model(config, mesh, tokenizer)
    if adapter:
        from orchestra_jax.models.peft_adapter import load_adapter

        load_adapter(model, adapter)
    if jax.process_count() > 1 and config.rollout.engine == "jax":
        # Each host plays its share of the test on its own copy of the policy.
        model, _ = host_rollouts.host_local_engine_model(model, mesh.shape["tensor"])
    engine = builders.build_engine(config, model, model_config)
    extra = {"hf_path": base, **({"adapter": adapter} if adapter else {})}
    if isinstance(engine, ServedEngine):  # servers hold what they loaded last
        extra["weight_version"] = push(engine, model, policy)
    name = "hf_" + "+".join(p.rstrip("/").split("/")[-1] for p in (base, adapter) if p)
    return PolicyEngine(engine, name, extra)


def warm_start_engine(config: Any, workdir: str = "") -> PolicyEngine:
    """The warm-start policy a run saved (`<workdir>/warm_start_params`), named
    `warm_start` as the run's own evaluation names it; `PolicyError` where there is none."""
    from orchestra_jax.io import paths
    from orchestra_jax.rollout.engine import ServedEngine
    from orchestra_jax.training import experiment, host_rollouts, loop_steps
    from orchestra_jax.training.checkpointing import restore_params
    from orchestra_jax.training.run_sync import run_sync

    if workdir:
        with config.unlocked():
            config.workdir = workdir
    path = experiment.warm_start_dir(config)
    if not paths.as_path(path).is_dir():
        raise PolicyError(
            f"no warm start in {path} (a run saves one where sft.steps > 0 and rl.kl_coef > 0)"
        )
    run = loop_steps.setup_run(config)
    run.learner.load_state(restore_params(path, run.learner.params), run.learner.opt_state, step=0)
    extra: dict[str, Any] = {"warm_start_params": path}
    if isinstance(run.engine, ServedEngine):
        weights = host_rollouts.engine_weights(run.learner.policy_params(), run.engine_shardings)
        extra["weight_version"] = push(run.engine, weights, "warm start")
    else:
        run_sync(loop_steps.sync_weights(run, 0))
    return PolicyEngine(run.engine, "warm_start", extra)


def push(engine: Any, weights: Any, name: str) -> Any:
    """Loads `weights` on every server of `engine` and checks each serves them
    (`training/policy_push.py`); the version. `PolicyNotServed` (the engine closed)
    where a server does not."""
    from orchestra_jax.training.policy_push import PolicyNotServed, push_policy
    from orchestra_jax.training.run_sync import run_sync

    try:
        return run_sync(push_policy(engine, weights, name=name))
    except PolicyNotServed:
        engine.close()
        raise


def use_adapter_settings(config: Any, adapter: str) -> None:
    """config.lora := the PEFT adapter folder's settings (rank, alpha, targets);
    `PolicyError` on an engine that serves no adapters."""
    from orchestra_jax.models.peft_adapter import read_spec
    from orchestra_jax.training.experiment_config import LORA_ENGINES

    if config.rollout.engine not in LORA_ENGINES:
        raise PolicyError(
            f"a LoRA adapter is evaluated on rollout.engine in {LORA_ENGINES}, "
            f"not {config.rollout.engine!r}"
        )
    spec = read_spec(adapter)
    config.lora.rank, config.lora.alpha = spec.rank, spec.alpha
    # Dropout acts only in training; an adapter trained with it is evaluated without.
    config.lora.targets, config.lora.dropout = ",".join(spec.targets), 0.0
