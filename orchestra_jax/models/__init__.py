"""Qwen3 in Flax NNX: config, layers, attention kernels, LoRA, Hugging Face checkpoints and PEFT adapters."""
