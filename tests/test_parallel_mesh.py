"""Sharded Qwen3 on 8 fake CPU devices equals the unsharded model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint, save_hf_checkpoint
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM, create_sharded_model
from orchestra_jax.parallel.mesh import batch_sharding, make_mesh, partition_spec, shard_model

MESHES = [dict(fsdp=4, tensor=2), dict(fsdp=8)]


@nnx.jit
def forward(model, ids, positions):
    return model(ids, positions)


def _inputs(mesh=None):
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 256, (8, 6)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), ids.shape)
    if mesh is not None:
        ids, pos = jax.device_put((ids, pos), batch_sharding(mesh))
    return ids, pos


# Scanned layers on a mesh are covered by test_shard_model_and_sharded_load.
@pytest.mark.parametrize("shape", MESHES)
def test_sharded_forward_equals_unsharded(shape):
    config = Qwen3Config.preset("tiny")
    want = forward(Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), *_inputs())
    mesh = make_mesh(**shape)
    model = create_sharded_model(config, mesh, seed=0)
    q = model.model.layers[0].self_attn.q_proj
    assert q.kernel[...].sharding.spec == P("fsdp", "tensor")
    got = forward(model, *_inputs(mesh))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_shard_model_and_sharded_load(tmp_path):
    config = Qwen3Config.preset("tiny")
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    want = forward(model, *_inputs())
    mesh = make_mesh(fsdp=4, tensor=2)
    save_hf_checkpoint(model, config, tmp_path)
    sharded = shard_model(model, mesh)
    assert len(sharded.model.embed_tokens.embedding[...].sharding.device_set) == 8
    np.testing.assert_allclose(forward(sharded, *_inputs(mesh)), want, atol=1e-5)
    loaded, _ = load_hf_checkpoint(tmp_path, mesh=mesh, scan_layers=True)
    down = loaded.model.layers.mlp.down_proj.kernel[...]
    assert down.sharding.spec == P(None, "tensor", "fsdp")
    np.testing.assert_allclose(forward(loaded, *_inputs(mesh)), want, atol=1e-5)


def test_make_mesh_sizes_and_errors():
    assert dict(make_mesh().shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert dict(make_mesh(data=2, tensor=2).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    with pytest.raises(ValueError, match="needs"):
        make_mesh(data=2, fsdp=2, tensor=1)
    with pytest.raises(ValueError, match="at most one"):
        make_mesh(data=-1, fsdp=-1)


def test_indivisible_dimension_is_replicated():
    mesh = make_mesh(fsdp=8)
    # 12 rows do not split 8 ways; the size-1 tensor axis divides anything.
    assert partition_spec(("lm_head", "kernel"), (12, 256), mesh) == P(None, "tensor")
    with pytest.raises(ValueError, match="no partition rule"):
        partition_spec(("mystery", "kernel"), (8, 8), mesh)
