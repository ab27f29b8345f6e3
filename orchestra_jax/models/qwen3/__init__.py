"""Qwen3 in Flax NNX: the causal LM, its attention, layers, KV cache and configuration."""
