"""Every variant's learner step on any mesh; what cannot work is a start-up error."""

import dataclasses

import jax
import numpy as np
import pytest

from experiments.configs import grpo_hle
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.config_section import ConfigError
from orchestra_jax.parallel.mesh import make_mesh, num_batch_shards
from orchestra_jax.rl.batching import build_train_batch
from orchestra_jax.rl.learner import Learner
from orchestra_jax.rl.shared_prompts import build_shared_prompt_batch
from orchestra_jax.training import builders


@dataclasses.dataclass
class Episode:
    token_ids: list
    loss_mask: list
    rollout_logprobs: list
    advantage: float


def tiny_variant(name):
    """The variant's config with a tiny model and short sequences; everything else its own
    (group size, tasks per step, micro-batch, remat, scanned layers, dtypes, KL)."""
    config = grpo_hle.get_config(name)
    config.model.preset, config.model.hf_path, config.tokenizer = "tiny", "", "demo"
    config.model.overrides = {"vocab_size": 4096, "max_position_embeddings": 4096}
    config.rollout.engine = "jax"
    config.rl.seq_buckets = (32, 64)
    return config


def episodes(config, seed=0):
    """G episodes per task; a task's episodes share its prompt (rl.share_prompts groups them)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(config.rl.tasks_per_step):
        prompt = rng.integers(3, 4000, int(rng.integers(8, 20))).tolist()
        for _ in range(config.rl.group_size):
            reply = rng.integers(3, 4000, int(rng.integers(4, 12))).tolist()
            out.append(
                Episode(
                    prompt + reply,
                    [0] * len(prompt) + [1] * len(reply),
                    [0.0] * len(prompt) + [-8.3] * len(reply),
                    float(rng.normal()),
                )
            )
    return out


def device_errors(config, num_devices, num_processes=1):
    return builders.device_errors(config, num_devices, num_processes)


def one_step(config, devices):
    assert device_errors(config, num_devices=len(devices)) == []
    mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices=devices)
    model, _ = builders.build_model(config, mesh, load_tokenizer("demo"))
    learner_config = builders.build_learner_config(config, total_steps=config.num_steps, mesh=mesh)
    assert learner_config.micro_batch_size == config.rl.micro_batch_size * num_batch_shards(mesh)
    learner = Learner(model, learner_config, mesh=mesh)
    batching = builders.build_batching(config, learner.row_multiple())
    build = build_shared_prompt_batch if config.rl.share_prompts else build_train_batch
    metrics = learner.train_step(build(episodes(config), config=batching))
    assert metrics["skipped"] == 0 and np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    return metrics


# 8 devices in every variant's own default mesh (fsdp=-1); fewer below, in the other layouts.
@pytest.mark.slow
@pytest.mark.parametrize("variant", grpo_hle.VARIANTS)
def test_every_variant_runs_a_grpo_step_on_8_devices_with_its_own_mesh(variant):
    config = tiny_variant(variant)
    assert (config.mesh.data, config.mesh.fsdp, config.mesh.tensor) == (1, -1, 1)
    one_step(config, jax.devices())


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, devices, layout",
    [
        ("qwen3_8b", 1, dict(data=1, fsdp=1, tensor=1)),
        ("demo", 2, dict(data=2, fsdp=1, tensor=1)),
        ("qwen3_0p6b", 4, dict(data=1, fsdp=2, tensor=2)),
    ],
)
def test_variants_on_1_2_4_devices_in_data_fsdp_tensor_layouts(variant, devices, layout):
    config = tiny_variant(variant)
    config.mesh.update(layout)
    one_step(config, jax.devices()[:devices])


def test_mesh_errors_name_the_fields_to_change():
    config = grpo_hle.get_config("qwen3_8b")
    assert device_errors(config, num_devices=64, num_processes=16) == []
    config.mesh.update(data=2, fsdp=4, tensor=2)
    [error] = device_errors(config, num_devices=8)
    assert "mesh.data=2 x mesh.fsdp=4 x mesh.tensor=2 needs 16 devices" in error
    assert "change mesh.data, mesh.fsdp and mesh.tensor" in error
    config.mesh.update(data=3, fsdp=-1, tensor=1)
    [error] = device_errors(config, num_devices=8)
    assert "mesh.fsdp=-1" in error and "mesh.data=3" in error
    config.mesh.update(data=1, fsdp=-1, tensor=1)
    config.rl.tasks_per_step = 6
    [error] = device_errors(config, num_devices=16, num_processes=4)
    assert error.startswith("rl.tasks_per_step=6 is not a multiple of the 4 hosts")
    # The JAX engine runs a copy per host: its tensor axis must fit a host.
    config.rl.tasks_per_step, config.rollout.engine = 8, "jax"
    config.mesh.update(fsdp=1, tensor=8)
    [error] = device_errors(config, num_devices=8, num_processes=2)
    assert "mesh.tensor=8 does not divide a host's 4 devices" in error
    assert "rollout.engine='sglang'" in error
    config.rollout.engine = "sglang"
    assert device_errors(config, num_devices=8, num_processes=2) == []


def test_start_up_exits_with_the_mesh_errors():
    config = tiny_variant("micro")
    config.mesh.update(data=3, fsdp=1, tensor=1)
    with pytest.raises(ConfigError, match="mesh.data=3 x mesh.fsdp=1 x mesh.tensor=1"):
        builders.build_mesh(config)
