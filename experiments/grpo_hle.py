r"""Train a tool orchestrator with GRPO (ToolOrchestra, arXiv 2511.21689).

  python -m experiments.grpo_hle --config=experiments/configs/grpo_hle.py:demo
  python -m experiments.grpo_hle --config=experiments/configs/grpo_hle.py:qwen3_8b \
      --config.model.hf_path=/ckpt/Qwen3-8B --config.tokenizer=/ckpt/Qwen3-8B \
      --config.rollout.urls=http://sglang-0:30000 --config.workdir=/runs/run1

Warm start (if configured), GRPO with resume from the last checkpoint, then a
held-out evaluation against baseline routers (orchestra_jax/training/experiment.py).
"""

from ml_collections import config_flags

from orchestra_jax.training import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config: path/to/config.py:variant.", lock_config=True
)


def main(argv):
    del argv
    cli.init_distributed(_CONFIG.value)
    from orchestra_jax.training.experiment import run_experiment

    run_experiment(cli.validated(_CONFIG.value))


if __name__ == "__main__":
    cli.run(main)
