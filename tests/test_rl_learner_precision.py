"""The learner's float32 master weights, bf16 KL reference and chunked LM head."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rl.batching import BatchingConfig, build_train_batch
from orchestra_jax.rl.learner import Learner, LearnerConfig

CONFIG = Qwen3Config.preset("tiny", num_hidden_layers=1)
# adam_eps = 1: the first update is about lr · g, so runs whose gradients agree to float
# precision agree in their parameters too.
EXACT = LearnerConfig(learning_rate=0.1, adam_eps=1.0, kl_coef=1e-4)


@dataclasses.dataclass
class Episode:
    token_ids: list
    loss_mask: list
    rollout_logprobs: list
    advantage: float


def new_model(config=CONFIG):
    return Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(3)
    episodes = []
    for _ in range(8):
        n = int(rng.integers(6, 17))
        mask = [0] * 3 + rng.integers(0, 2, n - 3).tolist()
        logprobs = [float(-5.5 + rng.normal(scale=0.3)) if m else 0.0 for m in mask]
        ids = rng.integers(3, CONFIG.vocab_size, n).tolist()
        episodes.append(Episode(ids, mask, logprobs, float(rng.normal())))
    return build_train_batch(episodes, config=BatchingConfig(seq_buckets=(16,), row_multiple=8))


def _leaves(tree):
    return jax.tree.leaves(jax.device_get(tree))


def test_chunked_head_step_equals_whole_head_step(batch):
    """Chunks of 8 loss tokens against all at once: same metrics and parameters."""
    results = []
    for chunk in (1 << 30, 8):
        learner = Learner(new_model(), dataclasses.replace(EXACT, lm_head_chunk=chunk))
        results.append((learner.train_step(batch), _leaves(learner.params)))
    (m0, p0), (m1, p1) = results
    for name in ("loss", "grad_norm", "entropy", "kl"):
        np.testing.assert_allclose(m1[name], m0[name], rtol=1e-5, atol=1e-8)
    for a, b in zip(p0, p1):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_bf16_model_gets_float32_master_weights(batch):
    """A bf16-stored model: the learner keeps float32 weights and optimizer state, and the
    model receives them rounded to bf16 after each step; the KL reference may be bf16."""
    model = new_model(CONFIG.replace(param_dtype=jnp.bfloat16, dtype=jnp.bfloat16))
    config = dataclasses.replace(EXACT, learning_rate=1e-3, reference_dtype="bfloat16")
    learner = Learner(model, config)
    assert all(x.dtype == jnp.float32 for x in _leaves(learner.params))
    assert all(x.dtype == jnp.bfloat16 for x in _leaves(learner.ref_params))
    before = _leaves(learner.params)
    metrics = learner.train_step(batch)
    assert metrics["skipped"] == 0.0
    opt_floats = [x for x in _leaves(learner.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert all(x.dtype == jnp.float32 for x in opt_floats)
    masters = _leaves(learner.params)
    model_params = _leaves(nnx.state(learner.model, nnx.Param))
    assert all(x.dtype == jnp.bfloat16 for x in model_params)
    for master, stored in zip(masters, model_params):
        np.testing.assert_array_equal(np.asarray(master.astype(jnp.bfloat16)), np.asarray(stored))
    # Norm scales start at 1.0; an update below 1e-3 moves their float32 masters, while
    # in bf16 (spacing 2^-8 just below 1) it rounds away: the masters keep what bf16 loses.
    scales = [(b, a) for b, a in zip(before, masters) if b.ndim == 1]
    assert any(
        not np.array_equal(b, a) and np.array_equal(b.astype(jnp.bfloat16), a.astype(jnp.bfloat16))
        for b, a in scales
    )
    assert _leaves(learner.policy_params())[0].dtype == jnp.bfloat16


def test_master_dtype_none_keeps_the_model_dtype(batch):
    model = new_model(CONFIG.replace(param_dtype=jnp.bfloat16, dtype=jnp.bfloat16))
    learner = Learner(model, dataclasses.replace(EXACT, master_dtype=None))
    assert all(x.dtype == jnp.bfloat16 for x in _leaves(learner.params))


def test_bad_precision_settings_are_clear_errors():
    with pytest.raises(ValueError, match="master_dtype"):
        LearnerConfig(master_dtype="float64")
    with pytest.raises(ValueError, match="lm_head_chunk"):
        LearnerConfig(lm_head_chunk=0)
