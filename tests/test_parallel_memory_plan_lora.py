"""The memory plan of LoRA GRPO: by hand on a tiny model, and which single hosts fit
Qwen3-8B LoRA at the paper's sequence lengths."""

import pathlib
import sys

import jax.numpy as jnp
import pytest

from experiments.configs import grpo_hle
from orchestra_jax.models.lora import LoRASpec
from orchestra_jax.models.qwen3.model import Qwen3Config
from orchestra_jax.rl.learner import LearnerConfig
from orchestra_jax.rl.memory_plan import DEVICE_KINDS, StepShape, plan_memory

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from launch import plan as plan_cli  # noqa: E402


def test_lora_items_by_hand():
    # tiny: 2 layers, E 64, I 128, q 4x16, kv 2x16, V 256, untied; rank 2 on q and down.
    spec = LoRASpec(rank=2, alpha=4.0, targets=("q", "down"))
    config = Qwen3Config.preset("tiny", lora=spec, param_dtype=jnp.bfloat16)
    learner = LearnerConfig(kl_coef=1e-4)
    plan = plan_memory(config, {"fsdp": 1}, learner, StepShape(1, 16, 8, 1))
    # Per layer: q A [64, 2] + B [2, 64], down A [128, 2] + B [2, 64] = 640 float32.
    adapters = 2 * 640 * 4
    assert plan.items["parameters"] == 106_880 * 2 + adapters  # the bfloat16 base + adapters
    assert plan.items["gradients"] == 2 * adapters
    assert plan.items["optimizer state"] == 2 * adapters + 8
    assert plan.items["KL reference"] == adapters  # reference adapters, not a second base
    full = plan_memory(config.replace(lora=None), {"fsdp": 1}, learner, StepShape(1, 16, 8, 1))
    # Full fine-tuning trains float32 masters of the bf16 weights: float32 moments.
    assert full.items["optimizer state"] == 2 * 106_880 * 4 + 8


# Qwen3-8B LoRA at 32768 tokens (qwen3_8b_lora: 4 sequences in the engine).
HOSTS = [
    ("h100-80gb", "fsdp=1", True),
    ("h200", "fsdp=1", True),
    ("tpu-v6e-8", "tensor=8", True),
    ("tpu-v5e-8", "tensor=8", False),  # 16 GB chips: 32k-token activations alone take 9.8 GiB
]


@pytest.mark.parametrize("device,mesh,fits", HOSTS)
def test_which_single_hosts_fit_qwen3_8b_lora(device, mesh, fits):
    config = grpo_hle.get_config("qwen3_8b_lora")
    errors, memory, header = plan_cli.plan(config, plan_cli.parse_mesh(mesh), DEVICE_KINDS[device])
    assert errors == [] and "on 1 host(s)" in header[0] and "LoRA: rank 64" in header[-1]
    assert memory.fits == fits, memory.report()
    assert memory.items["optimizer state"] < 2 * 2**30  # adapters' moments, not the base's
