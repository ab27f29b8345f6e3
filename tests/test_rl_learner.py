"""The sharded learner: exact micro-batching, meshes == one device, KL, NaN guard, SFT."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.parallel.mesh import make_mesh
from orchestra_jax.rl.batching import BatchingConfig, build_train_batch
from orchestra_jax.rl.learner import Learner, LearnerConfig, compute_logprobs, make_schedule
from tests.float_roundoff import qwen3_forward_terms, two_evaluations_apart

CONFIG = Qwen3Config.preset("tiny", num_hidden_layers=1)  # one layer: faster compiles
# adam_eps = 1 makes the first Adam update ≈ lr · g (not lr · sign g), so two
# runs whose gradients agree to float precision also agree in their parameters.
EXACT = LearnerConfig(
    learning_rate=0.1,
    adam_eps=1.0,
    weight_decay=0.01,
    kl_coef=1e-4,
    dual_clip=10.0,
    clip_low=0.2,
    clip_high=0.28,
)


@dataclasses.dataclass
class Episode:
    token_ids: list
    loss_mask: list
    rollout_logprobs: list
    advantage: float


def make_batch(seed=0, rows=8, pack=False, row_multiple=8):
    rng = np.random.default_rng(seed)
    episodes = []
    for _ in range(rows):
        length = int(rng.integers(6, 17))
        mask = [0] * 3 + [int(m) for m in rng.integers(0, 2, length - 3)]
        logprobs = [float(-5.5 + rng.normal(scale=0.3)) if m else 0.0 for m in mask]
        episodes.append(
            Episode(
                rng.integers(3, CONFIG.vocab_size, length).tolist(),
                mask,
                logprobs,
                float(rng.normal()),
            )
        )
    return build_train_batch(
        episodes,
        config=BatchingConfig(
            seq_buckets=(32 if pack else 16,), row_multiple=row_multiple, pack=pack
        ),
    )


def new_model(config=CONFIG):
    return Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))


def params_of(learner):
    return jax.device_get(nnx.state(learner.model, nnx.Param))


@pytest.fixture(scope="module")
def batch():
    return make_batch()


@pytest.fixture(scope="module")
def reference_step(batch):
    """One unsharded full-batch step: (learner, metrics, parameters after it)."""
    learner = Learner(new_model(), EXACT)
    metrics = learner.train_step(batch)
    return learner, metrics, params_of(learner)


def assert_same_step(learner, batch, reference_step):
    _, want_metrics, want_params = reference_step
    metrics = learner.train_step(batch)
    for name in (
        "loss",
        "pg_loss",
        "kl",
        "grad_norm",
        "entropy",
        "pg_clip_frac_high",
        "ratio_max",
        "logprob_gap",
    ):
        np.testing.assert_allclose(
            metrics[name], want_metrics[name], rtol=2e-5, atol=1e-7, err_msg=name
        )
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        params_of(learner),
        want_params,
    )


def test_micro_batch_accumulation_equals_one_big_batch(batch, reference_step):
    assert_same_step(
        Learner(new_model(), dataclasses.replace(EXACT, micro_batch_size=2)), batch, reference_step
    )


@pytest.mark.parametrize("shape,micro", [(dict(fsdp=4, tensor=2), 4), (dict(fsdp=8), 8)])
def test_sharded_step_equals_unsharded(batch, reference_step, shape, micro):
    mesh = make_mesh(**shape)
    learner = Learner(new_model(), dataclasses.replace(EXACT, micro_batch_size=micro), mesh=mesh)
    kernel = learner.params["model"]["layers"][0]["mlp"]["gate_proj"]["kernel"]
    assert kernel.sharding.spec[0] == "fsdp" and len(kernel.sharding.device_set) == 8
    assert_same_step(learner, batch, reference_step)


def kl_roundoff_bound(logprobs, batch, config=CONFIG):
    """The largest "mse" KL, ½ (log π − log π_ref)², that two float32 evaluations of the
    same log-probs can show: the policy's (under the gradient, with the entropy) and the
    reference's are compiled apart, and differ in the last bits on some CPUs."""
    terms = qwen3_forward_terms(config, np.asarray(batch.input_ids).shape[1])
    magnitude = float(np.abs(np.asarray(logprobs)[np.asarray(batch.loss_mask) > 0]).max())
    return 0.5 * two_evaluations_apart(terms, magnitude) ** 2


def test_kl_is_zero_when_policy_is_reference(batch):
    learner = Learner(new_model(), EXACT)
    # The reference is the policy (bit for bit) before the first step ...
    jax.tree.map(np.testing.assert_array_equal, learner.ref_params, learner.params)
    metrics = learner.train_step(batch)
    # ... so the step's KL is zero up to float32 round-off (measured ~3e-15; a reference
    # that is another model gives ~1e-2), and one compiled path gives the same bits.
    bound = kl_roundoff_bound(compute_logprobs(new_model(), batch), batch)
    assert 0.0 <= metrics["kl"] <= bound and 0.0 <= metrics["kl_loss"] <= bound, bound
    np.testing.assert_array_equal(
        compute_logprobs(new_model(), batch, 0.7), compute_logprobs(new_model(), batch, 0.7)
    )


def test_loss_falls_and_metrics_are_sane_on_a_fixed_batch(batch, reference_step):
    learner, first, _ = reference_step
    losses = [first["loss"]] + [learner.train_step(batch)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0] - 0.05, losses
    assert 0.0 <= first["pg_clip_frac_low"] <= 1.0 and first["skipped"] == 0.0
    assert first["ratio_min"] <= first["ratio_mean"] <= first["ratio_max"]
    assert first["num_loss_tokens"] == float(np.asarray(batch.loss_mask).sum())
    assert learner.step == 5


def test_nan_guard_skips_the_update(batch, reference_step):
    learner = reference_step[0]
    before, step = params_of(learner), learner.step
    poisoned = dataclasses.replace(
        batch, advantages=np.where(np.asarray(batch.loss_mask) > 0, np.nan, 0.0).astype(np.float32)
    )
    metrics = learner.train_step(poisoned)
    assert metrics["skipped"] == 1.0 and learner.step == step
    jax.tree.map(np.testing.assert_array_equal, params_of(learner), before)


def test_load_state_restores_parameters_and_optimizer(batch, reference_step):
    learner = reference_step[0]
    params, opt_state, step = (
        jax.device_get(learner.params),
        jax.device_get(learner.opt_state),
        learner.step,
    )
    after = learner.train_step(batch)
    learner.load_state(params, opt_state, step=step)
    assert learner.step == step
    jax.tree.map(np.testing.assert_array_equal, params_of(learner), params)
    again = learner.train_step(batch)  # same state, same batch: same update
    np.testing.assert_allclose(again["loss"], after["loss"], rtol=1e-6)
    np.testing.assert_allclose(again["grad_norm"], after["grad_norm"], rtol=1e-6)


def test_logprobs_use_the_sampling_temperature(batch):
    model = new_model()
    logits = nnx.jit(lambda m, b: m(b.input_ids, b.positions, segment_ids=b.segment_ids))(
        model, batch
    )
    want = jax.nn.log_softmax(logits / 0.7, axis=-1)
    want = np.take_along_axis(np.asarray(want), np.asarray(batch.target_ids)[..., None], -1)
    np.testing.assert_allclose(
        compute_logprobs(model, batch, 0.7), want[..., 0], rtol=1e-5, atol=1e-6
    )


def test_sft_step_lowers_the_masked_nll(batch):
    learner = Learner(
        new_model(), LearnerConfig(learning_rate=3e-3, kl_coef=1e-4, micro_batch_size=4)
    )
    assert learner.ref_params is not None
    nll = [learner.sft_step(batch)["nll"] for _ in range(4)]
    assert nll[-1] < nll[0] - 0.05, nll


def test_a_skipped_update_says_why(batch, caplog):
    learner = Learner(new_model(), LearnerConfig(learning_rate=1e-2, kl_coef=0.0, tis_cap=2.0))
    sampled = np.asarray(batch.loss_mask) > 0
    old = np.array(batch.old_logprobs)
    old[np.nonzero(sampled)[0][0], np.nonzero(sampled)[1][0]] = np.nan  # one token had none
    with caplog.at_level("WARNING", logger="orchestra_jax.rl.learner"):
        metrics = learner.train_step(dataclasses.replace(batch, old_logprobs=old))
    assert metrics["skipped"] == 1.0 and learner.step == 0
    assert "learner update skipped at step 0" in caplog.text
    assert "tis_weight_max=nan" in caplog.text and "loss=nan" in caplog.text
    assert f"1 of the batch's {int(sampled.sum())} sampled tokens have a non-finite" in caplog.text


def test_packed_batch_with_tis_and_sequence_aggregation_trains():
    config = LearnerConfig(
        learning_rate=1e-2,
        kl_coef=0.0,
        tis_cap=2.0,
        entropy_coef=1e-3,
        agg="seq-mean-token-mean",
        micro_batch_size=2,
    )
    learner = Learner(new_model(), config)
    assert learner.ref_params is None
    packed = make_batch(seed=1, rows=8, pack=True, row_multiple=2)
    assert packed.shape[0] < 8 and packed.segment_ids.max() >= 2  # episodes share rows
    metrics = [learner.train_step(packed) for _ in range(3)]
    assert metrics[0]["ratio_mean"] == pytest.approx(1.0)  # π_old = π under TIS
    assert 0.0 < metrics[0]["tis_weight_mean"] <= 2.0
    assert metrics[-1]["loss"] < metrics[0]["loss"]


def test_bad_configs_and_shapes_fail_clearly(batch):
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        LearnerConfig(agg="mean")
    with pytest.raises(ValueError, match="unknown KL penalty"):
        LearnerConfig(kl_type="k9")
    with pytest.raises(ValueError, match="total_steps"):
        LearnerConfig(schedule="cosine")
    learner = Learner(new_model(), LearnerConfig(micro_batch_size=3, kl_coef=0.0))
    with pytest.raises(ValueError, match="row_multiple"):
        learner.train_step(batch)


def test_schedule_warmup_then_cosine():
    schedule = make_schedule(
        LearnerConfig(learning_rate=1.0, schedule="cosine", warmup_steps=2, total_steps=6)
    )
    np.testing.assert_allclose(
        [schedule(s) for s in (0, 1, 2, 4, 6)], [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6
    )
