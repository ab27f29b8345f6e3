"""launch/plan.py and rl/memory_plan.py: the plan against XLA's own accounting."""

import pathlib
import sys

import jax
import jax.numpy as jnp
import pytest

from experiments.configs import grpo_hle
from orchestra_jax.models.qwen3.model import Qwen3Config, create_sharded_model
from orchestra_jax.parallel.mesh import batch_sharding, make_mesh
from orchestra_jax.rl.batching import TrainBatch
from orchestra_jax.rl.learner import Learner, LearnerConfig
from orchestra_jax.rl.memory_plan import DEVICE_KINDS, StepShape, plan_memory, shard_shape

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # launch/ is run from the repository root

from launch import plan as plan_cli  # noqa: E402


def xla_bytes(config, mesh_shape, rows, seq_len, loss_tokens, num_micro=1):
    """Per-device bytes of the real jitted GRPO step (arguments + outputs − aliased + temp)
    and the plan's estimate for the same step."""
    mesh = make_mesh(**mesh_shape)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    learner_config = LearnerConfig(micro_batch_size=rows * shards, kl_coef=1e-4)
    learner = Learner(create_sharded_model(config, mesh), learner_config, mesh=mesh)
    step_rows = rows * shards * num_micro
    sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh))  # noqa: E731
    ints, floats = sds((step_rows, seq_len), jnp.int32), sds((step_rows, seq_len), jnp.float32)
    batch = TrainBatch(
        ints, ints, ints, ints, floats, floats, floats, sds((step_rows, loss_tokens), jnp.int32)
    )
    with jax.set_mesh(mesh):
        step = learner._build_step("grpo", num_micro)
        stats = (
            step.lower(
                learner.params, learner.opt_state, learner.ref_params, learner._frozen, batch, 1.0
            )
            .compile()
            .memory_analysis()
        )
    real = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
    )
    shape = StepShape(rows, seq_len, loss_tokens, step_rows)
    return real, plan_memory(config, dict(mesh.shape), learner_config, shape)


@pytest.mark.slow
def test_plan_is_within_a_quarter_of_xla_memory_analysis():
    # FSDP x tensor parallel, scanned layers recomputed in the backward pass: every item
    # of the plan is non-zero here (one compile of the real step, ~30 s on 2 cores).
    config = Qwen3Config.preset(
        "demo", num_hidden_layers=4, vocab_size=8192, remat="full", scan_layers=True
    )
    real, plan = xla_bytes(config, dict(fsdp=4, tensor=2), rows=2, seq_len=512, loss_tokens=256)
    assert 0.75 <= plan.total / real <= 1.25, (plan.total, real, plan.items)
    # Activations are a large share here, so the check is not one of the weights alone.
    weights = sum(plan.items[k] for k in ("parameters", "gradients", "optimizer state"))
    assert plan.total > 3 * weights
    assert all(plan.items[k] > 0 for k in ("gathered weights", "layer recompute", "logits"))


def test_shard_shapes_and_items_by_hand():
    assert shard_shape(
        (8, 12), jax.sharding.PartitionSpec("fsdp", "tensor"), {"fsdp": 4, "tensor": 2}
    ) == (2, 6)
    assert shard_shape(
        (6,), jax.sharding.PartitionSpec(("data", "fsdp")), {"data": 2, "fsdp": 3}
    ) == (1,)
    config = Qwen3Config.preset("tiny")  # 2 layers, E 64, I 128, V 256, untied
    learner_config = LearnerConfig(kl_coef=1e-4)
    one = plan_memory(config, {"fsdp": 1}, learner_config, StepShape(1, 16, 8, 1))
    eight = plan_memory(config, {"fsdp": 8}, learner_config, StepShape(1, 16, 8, 8))
    # 106,880 float32 parameters, 384 of them in norm scales (replicated on any mesh).
    assert one.items["parameters"] == 106_880 * 4
    assert eight.items["parameters"] == ((106_880 - 384) // 8 + 384) * 4
    # AdamW: two moments and two int32 step counts (its own and the schedule's).
    assert one.items["optimizer state"] == 2 * one.items["parameters"] + 8
    # The float32 accumulator and one micro-batch's gradient.
    assert one.items["gradients"] == 2 * one.items["parameters"]
    assert one.items["KL reference"] == one.items["parameters"]
    assert eight.items["parameters"] < one.items["parameters"] / 4
    assert one.items["gathered weights"] == 0  # nothing to gather on one device


def test_cli_exit_status_says_whether_it_fits(capsys):
    config = grpo_hle.get_config("micro")
    kinds = DEVICE_KINDS
    errors, memory, header = plan_cli.plan(
        config, plan_cli.parse_mesh("fsdp=8"), kinds["h100-80gb"]
    )
    assert errors == [] and memory.fits and "8 x h100-80gb on 1 host(s)" in header[0]
    assert {"rollout KV cache", "activations", "logits"} <= set(memory.items)
    # Four TPU hosts cannot split the micro variant's two tasks a step.
    errors, _, _ = plan_cli.plan(config, plan_cli.parse_mesh("fsdp=16"), kinds["tpu-v5p"])
    assert len(errors) == 1 and "rl.tasks_per_step=2" in errors[0]
    with pytest.raises(ValueError, match="bad item"):
        plan_cli.parse_mesh("fsdp=0")


def test_qwen3_8b_shape_without_its_checkpoint():
    config = grpo_hle.get_config("qwen3_8b")  # hf_path /path/to/Qwen3-8B is not here
    mc = plan_cli.model_config(config)
    assert (mc.hidden_size, mc.num_hidden_layers, mc.vocab_size) == (4096, 36, 151936)
    assert mc.remat == "full" and mc.scan_layers
    config.model.hf_path = "/nowhere/my-model"
    with pytest.raises(ValueError, match="--preset"):
        plan_cli.model_config(config)


def test_packed_rows_planned_with_every_position_a_loss_position():
    """qwen3_8b packs its turns (rl.pack): a row's K loss positions can fill it."""
    config = grpo_hle.get_config("qwen3_8b")
    kind = DEVICE_KINDS["h100-80gb"]
    mesh = plan_cli.parse_mesh("fsdp=8")
    packed = plan_cli.step_shape(config, mesh, kind)
    assert packed.loss_tokens == packed.seq_len == max(config.rl.seq_buckets)
    config.rl.pack = False
    assert plan_cli.step_shape(config, mesh, kind).loss_tokens < packed.loss_tokens


def test_weights_stored_in_bfloat16_with_float32_masters():
    # The model keeps its bf16 weights; the learner trains float32 masters beside them,
    # with float32 moments and gradients, and a reference in `reference_dtype`.
    config = Qwen3Config.preset("tiny", param_dtype=jnp.bfloat16)
    shape = StepShape(1, 16, 8, 1)
    plan = plan_memory(config, {"fsdp": 1}, LearnerConfig(kl_coef=1e-4), shape)
    assert plan.items["parameters"] == 106_880 * 2
    assert plan.items["master weights"] == 106_880 * 4
    assert plan.items["optimizer state"] == 2 * 106_880 * 4 + 8
    assert plan.items["gradients"] == 2 * 106_880 * 4
    assert plan.items["KL reference"] == 106_880 * 4
    half_reference = LearnerConfig(kl_coef=1e-4, reference_dtype="bfloat16")
    assert plan_memory(config, {"fsdp": 1}, half_reference, shape).items["KL reference"] == (
        106_880 * 2
    )
    # Stored as trained: no separate masters.
    f32 = plan_memory(Qwen3Config.preset("tiny"), {"fsdp": 1}, LearnerConfig(kl_coef=1e-4), shape)
    assert f32.items["master weights"] == 0
