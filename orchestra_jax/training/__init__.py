"""A training run: config checks and builders, the GRPO loops and their steps, checkpoints, metrics, evaluation."""
