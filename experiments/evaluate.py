r"""Evaluate policies on held-out tasks under an evaluation protocol; compare them.

  python -m experiments.evaluate --config=experiments/configs/grpo_hle.py:demo \
      --policies=checkpoint,always_strongest,always_cheapest,random

Policies (comma-separated):
  checkpoint           the latest GRPO checkpoint in <workdir>/checkpoints
                       (checkpoint:<workdir>: that workdir's)
  hf:/path/to/folder   a Hugging Face Qwen3 folder (e.g. one written by sft.py)
  hf:<base>+<adapter>  a Hugging Face Qwen3 folder with a PEFT LoRA adapter folder
                       (e.g. <workdir>/adapter of a LoRA run), on the JAX engine
  <router>             a baseline router: always_strongest, always_cheapest,
                       direct_strongest, random; for τ² conversations
                       expert_strongest, expert_cheapest, expert_random

Writes <workdir>/eval_<policy>.json (accuracy, mean cost and latency, tool-call
mix, per domain and per category, the data read), the episodes for the
trajectory viewer, and eval_report.md + eval_pareto.png over every policy
evaluated in the folder. With a server engine (rollout.engine=sglang), the
checkpoint's or folder's weights are first loaded on every server under a fresh
weight version, and evaluation refuses to start unless each server reports it
(`orchestra_jax/training/policy_push.py`). --config.eval.protocol picks the settings: "heldout"
(the default: held-out prices with a stated preference per task) or "paper"
(the reference release's evaluation: fixed table, temperature 1.0, 50 rounds;
docs/reproduction.md, "Evaluation protocol"). With --config.eval.num_trials=k
each task is played k times and the report adds pass^1..pass^k per domain
(τ²-bench's metric), with cost and latency per episode. On the paper's
benchmarks with live experts, search and judge (HLE, FRAMES, τ²): see
docs/live_setup.md and docs/reproduction.md, e.g.

  python -m experiments.evaluate --config=experiments/configs/grpo_hle.py:qwen3_8b \
      --config.eval.protocol=paper \
      --config.data.sources=frames --config.data.paths.frames=frames.jsonl \
      --config.data.eval_fraction=1.0 --config.eval.num_tasks=824 \
      --policies=hf:/ckpt/Orchestrator-8B,direct_strongest,always_cheapest,random
"""

import logging

from absl import flags
from ml_collections import config_flags

from orchestra_jax.training import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config: path/to/config.py:variant.", lock_config=True
)
_POLICIES = flags.DEFINE_string(
    "policies",
    "checkpoint,always_strongest,always_cheapest,random",
    "Comma-separated policies: checkpoint, hf:<folder>, or a router name "
    "(or a '+' mixture of routers).",
)


def evaluate_policies(config, policies):
    """Evaluates each of `policies` (see the module docstring) on the config's held-out
    test under `eval.protocol`; writes the summaries and the report into the workdir;
    returns the summaries."""
    from orchestra_jax.eval.report import write_report
    from orchestra_jax.eval.routers import is_router
    from orchestra_jax.parallel.multihost import is_primary
    from orchestra_jax.training import builders, experiment, loop_steps
    from orchestra_jax.training.policy_engines import PolicyError, is_policy, policy_engine
    from orchestra_jax.training.policy_push import PolicyNotServed

    tokenizer = builders.build_tokenizer(config)
    judge = builders.build_judge(
        config, loop_steps.judge_cache_path(config), also_read=loop_steps.judge_cache_files(config)
    )
    # The environment is built for the evaluation protocol's config (eval.protocol).
    evaluator = experiment.build_evaluator(config, None, tokenizer, judge)
    summaries = {}
    for policy in policies:
        if is_router(policy):
            engine, extra = (
                experiment.baseline_router(config, policy, tokenizer, evaluator.tool_configs),
                {"baseline": True},
            )
        elif is_policy(policy):
            try:
                loaded = policy_engine(config, policy, tokenizer)
            except (PolicyNotServed, PolicyError) as e:
                raise SystemExit(f"error: {e}") from e
            engine, extra, policy = loaded.engine, loaded.extra, loaded.name
        else:
            raise SystemExit(f"error: unknown policy {policy!r}; see --help")
        summaries[policy] = experiment.evaluate(evaluator, policy, engine, extra=extra)
        engine.close()
        if judge is not None:
            judge.flush()
    if is_primary():  # on several hosts, process 0 alone writes the report
        md, png = write_report(loop_steps.workdir_of(config))
        logging.info("report: %s, %s", md, png)
    return summaries


def main(argv):
    del argv
    cli.init_distributed(_CONFIG.value)
    from orchestra_jax.config_section import split_list

    evaluate_policies(cli.validated(_CONFIG.value), split_list(_POLICIES.value))


if __name__ == "__main__":
    cli.run(main)
