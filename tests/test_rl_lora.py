"""LoRA GRPO in the learner: only adapters train, the base is untouched bitwise, the
reference is the base, a rank-r gradient is the full one projected, meshes agree."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from orchestra_jax.models.lora import LoRAParam, LoRASpec, adapters_off
from orchestra_jax.models.qwen3.layers import Linear
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.parallel.mesh import make_mesh
from orchestra_jax.rl.learner import Learner, compute_logprobs
from tests.float_roundoff import qwen3_forward_terms, two_evaluations_apart
from tests.test_rl_learner import EXACT, kl_roundoff_bound, make_batch

SPEC = LoRASpec(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
LORA = Qwen3Config.preset("tiny", num_hidden_layers=1, lora=SPEC)


def new_model(config=LORA):
    return Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))


def base_of(model):
    return jax.device_get(nnx.state(model, nnx.Not(LoRAParam)))


def adapters_of(model):
    return jax.device_get(nnx.state(model, LoRAParam))


@pytest.fixture(scope="module")
def batch():
    return make_batch()


@pytest.fixture(scope="module")
def reference_step(batch):
    learner = Learner(new_model(), EXACT)
    metrics = learner.train_step(batch)
    return learner, metrics, adapters_of(learner.model)


def test_only_adapters_train_and_a_bfloat16_base_stays_bitwise(batch):
    model = new_model(LORA.replace(param_dtype=jnp.bfloat16, dtype=jnp.bfloat16))
    before = base_of(model)
    learner = Learner(model, dataclasses.replace(EXACT, learning_rate=1e-2))
    # The optimizer's moments are the adapters' shapes alone; the base is never cast.
    params = jax.tree.leaves(learner.params)
    assert len(params) == 2 * 7 and all(p.dtype == jnp.float32 for p in params)
    moments = [x for x in jax.tree.leaves(learner.opt_state) if getattr(x, "ndim", 0) >= 1]
    assert sorted(m.size for m in moments) == sorted(2 * [p.size for p in params])
    for _ in range(3):
        metrics = learner.train_step(batch)
        assert metrics["skipped"] == 0.0
    after = base_of(learner.model)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        assert a.dtype == jnp.bfloat16 and np.array_equal(
            np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16)
        )
    lora_b = adapters_of(learner.model)["model"]["layers"][0]["mlp"]["down_proj"]["lora_b"]
    assert np.abs(np.asarray(lora_b[...])).max() > 0  # B left 0: only A would have moved
    assert metrics["kl"] > 0  # the policy left its reference, the base


def test_reference_is_the_base_with_adapters_off(batch, reference_step):
    learner, first, _ = reference_step
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(learner.ref_params))
    # B = 0 at the start: policy = base = reference, so the first step's KL is zero up
    # to the round-off of the policy's and the reference's separately compiled passes.
    lora_b = [
        v for k, v in nnx.to_flat_state(nnx.state(new_model(), LoRAParam)) if k[-1] == "lora_b"
    ]
    assert lora_b and all(not np.asarray(b.get_value()).any() for b in lora_b)
    plain = Qwen3ForCausalLM(LORA.replace(lora=None), rngs=nnx.Rngs(0))
    bound = kl_roundoff_bound(compute_logprobs(plain, batch), batch, LORA)
    assert 0.0 <= first["kl"] <= bound, bound
    # The same seed draws the same base with or without adapters, bit for bit ...
    with_adapters_off = new_model()
    nnx.update(with_adapters_off, adapters_off(nnx.state(with_adapters_off, LoRAParam)))
    jax.tree.map(
        np.testing.assert_array_equal,
        jax.device_get(nnx.state(plain, nnx.Param)),
        base_of(with_adapters_off),
    )
    # ... and with the adapters off the model computes the plain one's log-probs (the
    # two graphs compile apart: equal up to float32 round-off).
    want = np.asarray(compute_logprobs(plain, batch, 1.0))
    tolerance = two_evaluations_apart(
        qwen3_forward_terms(LORA, np.asarray(batch.input_ids).shape[1]), np.abs(want).max()
    )
    np.testing.assert_allclose(
        compute_logprobs(with_adapters_off, batch, 1.0), want, rtol=0, atol=tolerance
    )


def test_rank_r_gradient_is_the_full_gradient_projected():
    # y = x (W + s A B): dL/dA = s · G Bᵀ and dL/dB = s · Aᵀ G, G = dL/dW = xᵀ g.
    config = Qwen3Config.preset("tiny", lora=LoRASpec(rank=2, alpha=3.0, targets=("q",)))
    layer = Linear(3, 4, config, rngs=nnx.Rngs(0), target="q")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    g = rng.standard_normal((5, 4)).astype(np.float32)  # dL/dy of L = Σ y ∘ g
    a = rng.standard_normal((3, 2)).astype(np.float32)
    b = rng.standard_normal((2, 4)).astype(np.float32)
    layer.lora_a.set_value(jnp.asarray(a))
    layer.lora_b.set_value(jnp.asarray(b))
    graphdef, adapters, rest = nnx.split(layer, LoRAParam, ...)

    def loss(adapters):
        return jnp.sum(nnx.merge(graphdef, adapters, rest)(jnp.asarray(x)) * g)

    grads = jax.grad(loss)(adapters)
    s = 3.0 / 2
    full = x.T @ g  # [3, 4], what full fine-tuning's W would get
    np.testing.assert_allclose(np.asarray(grads["lora_a"][...]), s * full @ b.T, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grads["lora_b"][...]), s * a.T @ full, rtol=1e-5)
    # One SGD step of lr moves W_eff by -lr s² (G BᵀB + AAᵀ G) to first order: the full
    # gradient G projected onto B's row space and A's column space.
    lr = 1e-3
    new_a, new_b = a - lr * s * full @ b.T, b - lr * s * a.T @ full
    moved = s * (new_a @ new_b - a @ b)
    projected = -lr * s * s * (full @ b.T @ b + a @ a.T @ full)
    np.testing.assert_allclose(moved, projected, atol=lr * lr * 50)


@pytest.mark.parametrize("shape,micro", [(dict(fsdp=4, tensor=2), 4), (dict(data=2, fsdp=4), 8)])
def test_sharded_lora_step_equals_unsharded(batch, reference_step, shape, micro):
    _, want_metrics, want = reference_step
    mesh = make_mesh(**shape)
    learner = Learner(new_model(), dataclasses.replace(EXACT, micro_batch_size=micro), mesh=mesh)
    q = learner.params["model"]["layers"][0]["self_attn"]["q_proj"]
    assert q["lora_a"].sharding.spec[0] == "fsdp" and len(q["lora_a"].sharding.device_set) == 8
    assert q["lora_b"].sharding.spec == jax.sharding.PartitionSpec(None, "tensor")
    metrics = learner.train_step(batch)
    for name in ("loss", "pg_loss", "kl", "grad_norm"):
        np.testing.assert_allclose(metrics[name], want_metrics[name], rtol=2e-5, atol=1e-7)
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
        adapters_of(learner.model),
        want,
    )


def test_minibatches_and_micro_batches_train_adapters(batch):
    learner = Learner(
        new_model(), dataclasses.replace(EXACT, num_minibatches=2, micro_batch_size=2, tis_cap=2.0)
    )
    metrics = learner.train_step(batch)
    assert metrics["updates"] == 2.0 and metrics["skipped"] == 0.0
    counts = optax.tree_utils.tree_get_all_with_path(learner.opt_state, "count")
    assert {int(c) for _, c in counts} == {2}


def test_set_reference_takes_adapters(batch, reference_step):
    learner = Learner(new_model(), EXACT)
    learner.set_reference(reference_step[2])  # e.g. a warm start's adapters
    metrics = learner.train_step(batch)
    assert metrics["kl"] > 0
