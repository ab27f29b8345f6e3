"""The learner: a jit-compiled, mesh-sharded optimizer step with exact micro-batching.

    params, opt_state = train_step(params, opt_state, ref_params, batch, loss_scale)

1. The loss denominator (rl/aggregation.py) is computed once over the full batch,
   divided by `loss_scale` (1, or a remainder mini-batch's share of
   `minibatch_size`: see `minibatch_updates`).
2. The batch [B, T] is split into B / micro_batch_size micro-batches; a
   `lax.scan` adds their losses and gradients. Each micro loss is already divided
   by the full-batch denominator, so the sum equals the full-batch loss exactly.
   (A `SharedPromptBatch`'s rows are groups, each one prompt and the episodes
   continuing it: `rl/shared_prompts.py`.)
3. optax: clip by global norm -> AdamW (decay on matrices only) with a schedule.
4. If the loss or the gradient norm is not finite, parameters and optimizer
   state are left untouched, `skipped` = 1 in the metrics, and a warning says
   which values were not finite (`skip_cause`).

With LoRA adapters on the model (`models/lora.py`), `params` are the adapters
alone: the base weights are frozen, passed to the step as they are stored (e.g.
bfloat16) and never in the gradients or the optimizer state; the KL reference
is the base plus reference adapters (0 at the start: the adapters off, no
second copy of the base).

Shardings are explicit: parameters follow `parallel/mesh.py`'s rules, optimizer
moments follow their parameters, batch rows split over ("data", "fsdp"), metrics
are replicated. Without a mesh the step runs on a one-device mesh, same code.
Micro-batches are strided rows (row j·n + i goes to micro-batch i), so each one
keeps the batch's split over devices and no rows move between devices.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orchestra_jax.models.lora import LoRAParam, adapters_off, has_adapters
from orchestra_jax.parallel.mesh import BATCH_AXES, batch_sharding, make_mesh, state_shardings
from orchestra_jax.parallel.multihost import global_batch
from orchestra_jax.rl import grpo
from orchestra_jax.rl.aggregation import check_aggregation, loss_denominator
from orchestra_jax.rl.batching import TrainBatch, bucket_rows
from orchestra_jax.rl.objectives import (
    OBJECTIVES,
    combine_stats,
    compute_logprobs,
    empty_stats,
    finalize_stats,
    loss_position_logprobs,
)
from orchestra_jax.rl.shared_prompts import SharedPromptBatch, loss_rows

log = logging.getLogger(__name__)

Batch = TrainBatch | SharedPromptBatch  # rows: episodes, or groups sharing a prompt

__all__ = ["LearnerConfig", "Learner", "make_optimizer", "compute_logprobs"]

SCHEDULES = ("constant", "cosine", "linear")
FLOAT_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def cast_floats(tree: Any, dtype: str | None) -> Any:
    """`tree` with its floating-point leaves in `dtype` (None: unchanged; same dtype: no copy)."""
    if dtype is None:
        return tree
    dt = FLOAT_DTYPES[dtype]

    def cast(x):
        floating = jnp.issubdtype(x.dtype, jnp.floating)
        return x.astype(dt) if floating and x.dtype != dt else x

    return jax.tree.map(cast, tree)


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Optimizer and loss settings; defaults follow the ToolOrchestra reference."""

    learning_rate: float = 1e-6
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # global-norm clip
    schedule: str = "constant"  # "constant" | "cosine" | "linear" (decay to 0)
    warmup_steps: int = 0  # linear warm-up from 0
    total_steps: int | None = None  # warm-up included; needed by "cosine" / "linear"
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    micro_batch_size: int | None = None  # rows per micro-batch; None = whole batch
    # A GRPO batch is split into this many mini-batches, each one optimizer update
    # (strided rows, as micro-batches), and the whole batch is gone over num_epochs
    # times: num_minibatches · num_epochs updates per rollout batch (1 · 1: one update).
    num_minibatches: int = 1
    num_epochs: int = 1
    # Samples per mini-batch instead (None: num_minibatches): N samples make
    # ⌈N / minibatch_size⌉ updates an epoch, of minibatch_size samples each in order
    # and the remainder last, its loss scaled by remainder / minibatch_size; π_old
    # always the learner's log-probs before the first (the reference's PPO
    # mini-batches of 16 samples; `minibatch_sizes`, `batching.place_minibatches`).
    minibatch_size: int | None = None
    loss: str = "ppo_clip"  # rl/grpo.py POLICY_LOSSES
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 10.0
    agg: str = "token-mean"  # rl/aggregation.py AGGREGATIONS
    norm_length: int | None = None  # L of "seq-mean-token-sum-norm"; None = padded T
    kl_coef: float = 1e-4  # 0 disables the reference model entirely
    kl_type: str = "mse"  # "k1" | "mse" | "k3"
    entropy_coef: float = 0.0
    temperature: float = 1.0  # the rollout's sampling temperature
    tis_cap: float | None = None  # truncated importance sampling cap C
    # Tokens per chunk of the LM head + log-softmax at loss positions (rl/head_logprobs.py):
    # one [chunk, vocab] float32 block at a time; None = as many as fit 256 MiB of logits.
    lm_head_chunk: int | None = None
    # The learner's weights and optimizer state ("float32" masters whatever the model
    # stores; the model gets them cast to its own dtypes after each step); None = as stored.
    master_dtype: str | None = "float32"
    # The stored KL reference's dtype ("bfloat16" halves its memory); None = master dtype.
    reference_dtype: str | None = None

    def __post_init__(self):
        check_aggregation(self.agg)
        grpo.POLICY_LOSSES.get(self.loss)
        grpo.KL_PENALTIES.get(self.kl_type)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; expected one of {SCHEDULES}")
        if self.schedule != "constant" and (self.total_steps or 0) <= self.warmup_steps:
            raise ValueError(f"schedule {self.schedule!r} needs total_steps > warmup_steps")
        if self.learning_rate <= 0 or self.temperature <= 0 or self.grad_clip <= 0:
            raise ValueError("learning_rate, temperature and grad_clip must be > 0")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.num_minibatches < 1 or self.num_epochs < 1:
            raise ValueError(
                f"num_minibatches and num_epochs must be >= 1, got "
                f"{self.num_minibatches}, {self.num_epochs}"
            )
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1 or None, got {self.minibatch_size}")
        if self.minibatch_size is not None and self.num_minibatches != 1:
            raise ValueError("give minibatch_size or num_minibatches, not both")
        if self.kl_coef < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("kl_coef, weight_decay and warmup_steps must be >= 0")
        if self.lm_head_chunk is not None and self.lm_head_chunk < 1:
            raise ValueError(f"lm_head_chunk must be >= 1 or None, got {self.lm_head_chunk}")
        for name in ("master_dtype", "reference_dtype"):
            value = getattr(self, name)
            if value is not None and value not in FLOAT_DTYPES:
                raise ValueError(
                    f"{name} must be one of {sorted(FLOAT_DTYPES)} or None, got {value!r}"
                )


def make_schedule(config: LearnerConfig) -> optax.Schedule:
    """lr(step): linear warm-up 0 -> lr over `warmup_steps`, then constant/cosine/linear."""
    lr = config.learning_rate
    if config.schedule == "constant":
        main = optax.constant_schedule(lr)
    else:
        assert config.total_steps is not None  # LearnerConfig checks it for these schedules
        decay_steps = config.total_steps - config.warmup_steps
        main = (
            optax.cosine_decay_schedule(lr, decay_steps)
            if config.schedule == "cosine"
            else optax.linear_schedule(lr, 0.0, decay_steps)
        )
    if not config.warmup_steps:
        return main
    warmup = optax.linear_schedule(0.0, lr, config.warmup_steps)
    return optax.join_schedules([warmup, main], [config.warmup_steps])


def make_optimizer(config: LearnerConfig) -> optax.GradientTransformation:
    """clip_by_global_norm(grad_clip) -> AdamW(schedule); no weight decay on vectors (norms)."""
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip),
        optax.adamw(
            make_schedule(config),
            b1=config.adam_b1,
            b2=config.adam_b2,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
            mask=decay_mask,
        ),
    )


def _split_micro_batches(batch: Any, num_micro: int) -> Any:
    """[B, ...] -> [n, B / n, ...] with micro-batch i = rows i, n + i, 2n + i, …"""

    def split(x):
        return jnp.swapaxes(x.reshape(x.shape[0] // num_micro, num_micro, *x.shape[1:]), 0, 1)

    return jax.tree.map(split, batch)


def _strided_rows(batch: Batch, i: int, n: int) -> Batch:
    """Rows i, n + i, 2n + i, … of `batch` (mini-batch i of n)."""
    return jax.tree.map(lambda x: x[i::n], batch)


def skip_cause(metrics: dict[str, float], batch: Any) -> str:
    """Why an update was skipped: its non-finite metrics, and non-finite rollout
    log-probabilities among the batch's sampled tokens (they make the truncated
    importance weights, and with them the loss, NaN)."""
    bad = [f"{name}={value}" for name, value in metrics.items() if not math.isfinite(value)]
    cause = "non-finite " + ", ".join(bad) if bad else "non-finite loss or gradient norm"
    old, mask = getattr(batch, "old_logprobs", None), getattr(batch, "loss_mask", None)
    if old is not None and mask is not None:
        old, sampled = np.asarray(old), np.asarray(mask) > 0
        count = int((~np.isfinite(old) & sampled).sum())
        if count:
            cause += (
                f"; {count} of the batch's {int(sampled.sum())} sampled tokens have a "
                "non-finite rollout log-probability (the engine's old_logprobs)"
            )
    return cause


def combine_update_metrics(per_update: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from its updates' metrics: "skipped" and "num_loss_tokens"
    added up, "*_max" / "*_min" the extremes, everything else the mean; plus "updates"."""
    out: dict[str, float] = {}
    for name in per_update[0]:
        values = [m[name] for m in per_update]
        if name in ("skipped", "num_loss_tokens"):
            out[name] = float(sum(values))
        elif name.endswith("_max"):
            out[name] = max(values)
        elif name.endswith("_min"):
            out[name] = min(values)
        else:
            out[name] = float(sum(values) / len(values))
    out["updates"] = float(len(per_update))
    return out


def _update_count(opt_state: Any) -> jax.Array:
    """How many updates the optimizer has applied (its schedule's step)."""
    counts = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    if not counts:
        raise ValueError("optimizer state has no update count")
    return counts[0][1]


class Learner:
    """Owns the policy's parameters and optimizer state; `train_step` / `sft_step` update them.

    The model passed in stays valid: after every step its parameters are replaced
    by the new ones (`learner.model` is the same object), cast to the model's own
    dtypes. `params` and the optimizer state are the master weights
    (`config.master_dtype`, float32 by default, whatever the model stores); the
    step computes in the model config's compute dtype from them. The step donates
    the old parameter buffers, so arrays read from the model before a step must be
    read again after it. A reference model is kept only when `config.kl_coef != 0`:
    `reference_model`, or a frozen copy of the initial policy, stored in
    `config.reference_dtype`. With LoRA adapters on the model only they are
    trained (`params`, the optimizer state and `set_reference` hold adapters), and
    the reference starts as the base with the adapters off.
    """

    def __init__(
        self,
        model: nnx.Module,
        config: LearnerConfig,
        *,
        mesh: Mesh | None = None,
        reference_model: nnx.Module | None = None,
    ):
        spec = getattr(getattr(model, "config", None), "lora", None)
        if spec is not None and spec.dropout:
            raise ValueError(
                f"the model's LoRA adapters have dropout {spec.dropout}: training runs adapters "
                "without dropout (GRPO's ratio compares the learner's and the engine's "
                "log-probabilities of one network), so it would not train what was asked; "
                "train with dropout 0 (evaluating or merging such an adapter is fine)"
            )
        self.config, self.model = config, model
        self.mesh = mesh if mesh is not None else make_mesh(1, 1, 1, devices=jax.devices()[:1])
        self.tx = make_optimizer(config)
        self.lora = has_adapters(model)
        trainable = LoRAParam if self.lora else nnx.Param
        # `frozen`: the base weights under LoRA (as stored), else empty.
        self._graphdef, params, frozen, self._rest = nnx.split(model, trainable, nnx.Param, ...)
        self._frozen_shardings = state_shardings(frozen, self.mesh)
        self._frozen = jax.device_put(frozen, self._frozen_shardings)
        self._model_dtypes = jax.tree.map(lambda x: x.dtype, params)
        self._param_shardings = state_shardings(params, self.mesh)
        self.params = jax.device_put(
            cast_floats(params, config.master_dtype), self._param_shardings
        )
        self._rest = jax.device_put(self._rest, NamedSharding(self.mesh, P()))
        abstract_opt = jax.eval_shape(self.tx.init, self.params)
        self._replicated = NamedSharding(self.mesh, P())
        self._opt_shardings = optax.tree_map_params(
            self.tx,
            lambda _, sharding: sharding,
            abstract_opt,
            self._param_shardings,
            transform_non_params=lambda _: self._replicated,
        )
        self.opt_state = self._fresh_opt_state()
        self.ref_params = None
        if reference_model is not None and not config.kl_coef:
            raise ValueError("a reference model was given but kl_coef == 0: it would be unused")
        if config.kl_coef:
            if reference_model is not None:
                source = nnx.state(reference_model, trainable)
            elif self.lora:
                source = adapters_off(self.params)
            else:
                source = jax.tree.map(jnp.copy, self.params)
            self.ref_params = self._place_reference(source)
        self.step = 0
        # (objective, #micro-batches[, "proximal"]) -> compiled step
        self._compiled: dict[tuple[Any, ...], Any] = {}
        self._sync_model()

    def load_state(self, params: Any, opt_state: Any | None = None, *, step: int = 0) -> None:
        """Replaces parameters (and optimizer state, step) e.g. from a checkpoint.

        Arrays are placed on this learner's shardings; `opt_state=None` starts the
        optimizer afresh. The KL reference is left alone (see `set_reference`).
        """
        self.params = jax.device_put(
            cast_floats(params, self.config.master_dtype), self._param_shardings
        )
        self.opt_state = (
            jax.device_put(opt_state, self._opt_shardings)
            if opt_state is not None
            else self._fresh_opt_state()
        )
        self.step = int(step)
        self._sync_model()

    def set_reference(self, reference_params: Any) -> None:
        """Replaces the frozen KL reference (only kept when `kl_coef != 0`)."""
        if not self.config.kl_coef:
            raise ValueError("reference_params given but kl_coef == 0: no reference is kept")
        # A copy: the train step donates `params`, which may be these very buffers.
        self.ref_params = jax.tree.map(jnp.copy, self._place_reference(reference_params))

    def _place_reference(self, params: Any) -> Any:
        dtype = self.config.reference_dtype or self.config.master_dtype
        return jax.device_put(cast_floats(params, dtype), self._param_shardings)

    def policy_params(self) -> Any:
        """The current weights in the model's own dtypes (what rollout engines load)."""
        return nnx.state(self.model, nnx.Param)

    def _sync_model(self) -> None:
        """The model's parameters := the master weights, cast to the model's dtypes."""
        model_params = jax.tree.map(
            lambda x, dt: x if x.dtype == dt else x.astype(dt), self.params, self._model_dtypes
        )
        nnx.update(self.model, model_params)

    def _fresh_opt_state(self) -> Any:
        return jax.device_put(self.tx.init(self.params), self._opt_shardings)

    @property
    def num_batch_shards(self) -> int:
        return math.prod(self.mesh.shape[a] for a in BATCH_AXES)

    def row_multiple(
        self, batch_size: int | None = None, *, num_minibatches: int | None = None
    ) -> int:
        """Rows per batch must be a multiple of this (for `BatchingConfig.row_multiple`):
        every mini-batch (`num_minibatches` of them, default the config's) a whole
        number of micro-batches and of batch shards."""
        micro = self.config.micro_batch_size or batch_size or 1
        n = num_minibatches or self.config.num_minibatches
        return math.lcm(micro, self.num_batch_shards) * n

    def minibatches_for(self, num_samples: int) -> int:
        """Mini-batches of a batch of `num_samples` samples: ⌈N / minibatch_size⌉,
        or `num_minibatches` when no minibatch_size is set."""
        size = self.config.minibatch_size
        return self.config.num_minibatches if size is None else max(1, -(-num_samples // size))

    def minibatch_sizes(self, num_samples: int) -> list[int] | None:
        """Samples in each mini-batch of a batch of `num_samples` with `minibatch_size`
        m: m, m, …, then the remainder N mod m (when not 0); None without it."""
        size = self.config.minibatch_size
        if size is None:
            return None
        full, rest = divmod(num_samples, size)
        return [size] * full + ([rest] if rest else [])

    def minibatch_rows(self, num_samples: int) -> int:
        """Rows of each mini-batch with `minibatch_size` m: min(m, N) rounded up to a
        whole number of micro-batches and batch shards (`batching.bucket_rows`), so
        every batch of at least m samples trains mini-batches of one shape."""
        if self.config.minibatch_size is None:
            raise ValueError("minibatch_rows needs minibatch_size")
        unit = math.lcm(self.config.micro_batch_size or 1, self.num_batch_shards)
        return bucket_rows(min(self.config.minibatch_size, max(num_samples, 1)), unit)

    @property
    def updates_per_batch(self) -> int:
        """Optimizer updates `train_step` makes on one rollout batch (with
        `minibatch_size`, those of a batch that is one mini-batch)."""
        return self.config.num_minibatches * self.config.num_epochs

    def train_step(
        self,
        batch: Batch,
        *,
        num_minibatches: int | None = None,
        minibatch_sizes: Sequence[int] | None = None,
    ) -> dict[str, float]:
        """GRPO on `batch`: one update, or `num_epochs` passes over `num_minibatches`
        mini-batches (default: the config's; see `minibatch_updates`); metrics as
        floats (blocks until done), "updates" the number of updates made."""
        n = num_minibatches or self.config.num_minibatches
        if n * self.config.num_epochs == 1 and self.config.minibatch_size is None:
            return {**self._run("grpo", batch), "updates": 1.0}
        return self.minibatch_updates(batch, num_minibatches=n, minibatch_sizes=minibatch_sizes)

    def minibatch_updates(
        self,
        batch: Batch,
        *,
        num_minibatches: int | None = None,
        minibatch_sizes: Sequence[int] | None = None,
    ) -> dict[str, float]:
        """num_epochs × n PPO updates on one rollout batch (n = `num_minibatches`,
        default the config's).

        Mini-batch i holds rows i, n + i, 2n + i, … , the same in every epoch.
        `minibatch_sizes` (with `minibatch_size` m; a batch laid out by
        `batching.place_minibatches`, the rows past a mini-batch's samples
        placeholders with no loss token) scales mini-batch i's loss, and so its
        gradient, by sizes[i] / m: the reference divides each mini-batch's loss by
        its fixed size m, whatever the samples it holds (`dp_actor.update_policy`).
        π_old, the policy the PPO ratio ρ = π / π_old is taken against, is fixed
        for the whole batch: with `tis_cap` or `minibatch_size`, the learner's own
        log-probs before the first update (computed here), with `tis_cap` the
        rollout engine's mismatch corrected by w = min(exp(log π_old − log
        π_rollout), C); otherwise the rollout log-probs. After the first update ρ
        leaves 1 and the clips act. Metrics: means over the updates ("skipped": how
        many were skipped; ratio_max / ratio_min and tis_weight_max /
        tis_weight_min: the extremes over all of them; "updates": how many).
        """
        n = num_minibatches or self.config.num_minibatches
        rows = batch.shape[0]
        if rows % n:
            raise ValueError(
                f"batch of {rows} rows does not split into {n} mini-batches (build batches "
                f"with row_multiple={self.row_multiple(rows // n or 1, num_minibatches=n)})"
            )
        proximal = None
        recompute = self.config.tis_cap is not None or self.config.minibatch_size is not None
        if recompute:  # host copies, sliced and placed as the batch is
            proximal = np.asarray(jax.device_get(self.proximal_logprobs(batch)))
        if minibatch_sizes is not None and len(minibatch_sizes) != n:
            raise ValueError(f"{len(minibatch_sizes)} mini-batch sizes for {n} mini-batches")
        size = self.config.minibatch_size
        scales = [1.0] * n
        if minibatch_sizes is not None and size is not None:
            scales = [k / size for k in minibatch_sizes]
        minis = [_strided_rows(batch, i, n) for i in range(n)]
        prox = [None if proximal is None else proximal[i::n] for i in range(n)]
        per_update = [
            self._run("grpo", minis[i], proximal=prox[i], loss_scale=scales[i])
            for _ in range(self.config.num_epochs)
            for i in range(n)
        ]
        return combine_update_metrics(per_update)

    def proximal_logprobs(self, batch: Batch) -> jax.Array:
        """log π_θ(target) at the loss positions under the current parameters, no
        gradient: [B, K] for a TrainBatch, [g, m, K] for a SharedPromptBatch."""
        rows = batch.shape[0]
        micro = self.config.micro_batch_size or rows
        self._check_rows(rows, micro)
        key = ("proximal", rows // micro)
        if key not in self._compiled:
            self._compiled[key] = self._build_proximal(rows // micro)
        batch = global_batch(batch, batch_sharding(self.mesh))
        with jax.set_mesh(self.mesh):
            return self._compiled[key](self.params, self._frozen, batch)

    def _build_proximal(self, num_micro: int):
        config, graphdef, rest = self.config, self._graphdef, self._rest

        def logprobs(params, frozen, batch):
            model = nnx.merge(graphdef, params, frozen, rest)
            micros = _split_micro_batches(batch, num_micro)

            def one(_, micro):
                logp, _, _ = loss_position_logprobs(
                    model,
                    micro,
                    config.temperature,
                    chunk_size=config.lm_head_chunk,
                    with_entropy=False,
                )
                lead = micro.prompt_ids.shape[:1] if isinstance(micro, SharedPromptBatch) else ()
                return None, logp.reshape(*lead, -1, logp.shape[-1])

            _, out = jax.lax.scan(one, None, micros)  # [n, rows / n, ...]
            out = jnp.swapaxes(out, 0, 1)  # row j·n + i of the batch is micro i's row j
            return jax.lax.stop_gradient(out.reshape(-1, *out.shape[2:]))

        batch_sh = batch_sharding(self.mesh)
        return jax.jit(
            logprobs,
            in_shardings=(self._param_shardings, self._frozen_shardings, batch_sh),
            out_shardings=self._replicated,  # every host reads the whole array
        )

    def sft_step(self, batch: TrainBatch) -> dict[str, float]:
        """One supervised update (cross-entropy on `batch.loss_mask` tokens)."""
        return self._run("sft", batch)

    def _check_rows(self, rows: int, micro: int) -> None:
        if rows % micro or micro % self.num_batch_shards:
            raise ValueError(
                f"batch of {rows} rows: micro_batch_size {micro} must divide it and be a "
                f"multiple of the {self.num_batch_shards} batch shards of the mesh "
                f"(build batches with row_multiple={self.row_multiple(rows)})"
            )

    def _run(
        self, objective: str, batch: Batch, proximal: Any = None, loss_scale: float = 1.0
    ) -> dict[str, float]:
        rows = batch.shape[0]
        micro = self.config.micro_batch_size or rows
        self._check_rows(rows, micro)
        key = (objective, rows // micro) + (("proximal",) if proximal is not None else ())
        if key not in self._compiled:
            self._compiled[key] = self._build_step(
                objective, rows // micro, with_proximal=proximal is not None
            )
        batch = global_batch(batch, batch_sharding(self.mesh))  # the same on every host
        ref_params = self.ref_params if objective == "grpo" else None
        scale = jax.device_put(np.float32(loss_scale), self._replicated)
        args = (self.params, self.opt_state, ref_params, self._frozen, batch, scale)
        if proximal is not None:
            args += (global_batch(proximal, batch_sharding(self.mesh)),)
        with jax.set_mesh(self.mesh):  # traced under the mesh: parallel/axes.py
            self.params, self.opt_state, metrics = self._compiled[key](*args)
        self._sync_model()
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if metrics["skipped"]:
            log.warning(
                "learner update skipped at step %d (%s), parameters and optimizer state "
                "unchanged: %s",
                self.step,
                objective,
                skip_cause(metrics, batch),
            )
        self.step += int(not metrics["skipped"])
        return metrics

    def _build_step(self, objective_name: str, num_micro: int, *, with_proximal: bool = False):
        config, graphdef, rest, tx = self.config, self._graphdef, self._rest, self.tx
        param_shardings, schedule = self._param_shardings, make_schedule(config)
        objective = OBJECTIVES.get(objective_name)
        use_ref = objective_name == "grpo" and bool(config.kl_coef)
        micro_sharding = NamedSharding(self.mesh, P(None, BATCH_AXES, None))

        def micro_loss(params, ref_params, frozen, micro, denominator):
            model = nnx.merge(graphdef, params, frozen, rest)
            ref = nnx.merge(graphdef, ref_params, frozen, rest) if use_ref else None
            if with_proximal:  # (micro-batch, its π_old log-probs)
                micro, proximal = micro
                return objective(model, ref, micro, denominator, config, proximal_logprobs=proximal)
            return objective(model, ref, micro, denominator, config)

        def step(params, opt_state, ref_params, frozen, batch, loss_scale, proximal=None):
            rows = loss_rows(batch)
            denominator = (
                loss_denominator(
                    rows.loss_mask,
                    config.agg,
                    segment_ids=rows.segment_ids,
                    norm_length=config.norm_length,
                )
                / loss_scale
            )
            micros = jax.lax.with_sharding_constraint(
                _split_micro_batches(batch, num_micro), micro_sharding
            )
            if with_proximal:
                micros = (micros, _split_micro_batches(proximal, num_micro))
            grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

            def accumulate(carry, micro):
                grads, stats = carry
                (_, new_stats), new_grads = grad_fn(params, ref_params, frozen, micro, denominator)
                grads = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads, new_grads)
                return (grads, combine_stats(stats, new_stats)), None

            first_micro = jax.tree.map(lambda x: x[0], micros)
            stats_shape = jax.eval_shape(
                lambda: grad_fn(params, ref_params, frozen, first_micro, denominator)[0][1]
            )
            zero_grads = jax.lax.with_sharding_constraint(  # accumulate in the params' layout
                jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params), param_shardings
            )
            carry, _ = jax.lax.scan(accumulate, (zero_grads, empty_stats(stats_shape)), micros)
            grads, stats = carry
            metrics = finalize_stats(stats, rows.loss_mask.sum())
            grad_norm = optax.global_norm(grads)
            finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
            updates, new_opt_state = tx.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            keep = lambda new, old: jax.tree.map(  # noqa: E731
                lambda n, o: jnp.where(finite, n, o), new, old
            )
            metrics.update(
                grad_norm=grad_norm,
                skipped=1.0 - finite.astype(jnp.float32),
                num_loss_tokens=rows.loss_mask.sum(),
                learning_rate=schedule(_update_count(opt_state)),
            )
            return keep(new_params, params), keep(new_opt_state, opt_state), metrics

        batch_sh = batch_sharding(self.mesh)
        ref_sh = self._param_shardings if use_ref else None
        in_shardings = (self._param_shardings, self._opt_shardings, ref_sh, self._frozen_shardings)
        in_shardings += (batch_sh,)
        in_shardings += (self._replicated,)  # the loss scale
        return jax.jit(
            step,
            in_shardings=in_shardings + ((batch_sh,) if with_proximal else ()),
            out_shardings=(self._param_shardings, self._opt_shardings, self._replicated),
            donate_argnums=(0, 1),
        )
