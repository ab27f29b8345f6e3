"""GRPO: pure loss/advantage math (grpo.py, aggregation.py, sft.py), trajectories to
fixed-shape batches (batching.py), and the sharded, jit-compiled learner (learner.py)."""
