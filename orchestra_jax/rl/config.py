"""The `rl` section of an experiment config as `RLConfig`: GRPO's groups, optimizer,
loss, filters and the asynchronous loop's bounds, checked once (`problems`)."""

from __future__ import annotations

import dataclasses

from orchestra_jax.config_section import Section
from orchestra_jax.models.config import DTYPES
from orchestra_jax.rl import grpo
from orchestra_jax.rl.aggregation import AGGREGATIONS
from orchestra_jax.rl.batching import BatchingConfig
from orchestra_jax.rl.learner import SCHEDULES, LearnerConfig
from orchestra_jax.rl.samples import SAMPLE_UNITS


@dataclasses.dataclass(frozen=True)
class RLConfig(Section):
    """`rl.*`, named as in the config file (experiments/configs/grpo_hle.py says what
    each field does)."""

    SECTION = "rl"

    group_size: int = 8
    tasks_per_step: int = 16
    lr: float = 1e-6
    schedule: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    micro_batch_size: int = 8
    share_prompts: bool = False
    pack: bool = False
    share_prefixes: bool = False
    num_minibatches: int = 1
    num_epochs: int = 1
    minibatch_size: int = 0
    balance_partitions: int = 0
    balance_group_size: int = 2
    sample_unit: str = "episode"
    max_staleness: int = 0
    stale_groups: str = "regenerate"
    rollout_restarts: int = 3
    async_wait_timeout_s: float = 3600.0
    partial_rollouts: bool = True
    loss: str = "ppo_clip"
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 10.0
    kl_coef: float = 1e-4
    kl_type: str = "mse"
    loss_agg: str = "token-mean"
    advantage: str = "grpo"
    adv_clip: float = 3.0
    filter_reward_std: float = 0.1
    format_filter: str = "turn"
    format_penalty: float = grpo.DEFAULT_FORMAT_PENALTY
    filter_no_answer: bool = False
    drop_no_answer: bool = False
    min_group_size_after_infra: int = 2
    max_infra_failure_fraction: float = 0.25
    advantage_boost: float = 0.0
    tis_cap: float = 2.0
    lm_head_chunk: int = 0
    reference_dtype: str = ""
    seq_buckets: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)

    def problems(self) -> list[str]:
        errors = self.positive(
            "group_size",
            "tasks_per_step",
            "lr",
            "grad_clip",
            "micro_batch_size",
            "num_minibatches",
            "num_epochs",
            "async_wait_timeout_s",
        )
        errors += self.positive(
            "kl_coef",
            "weight_decay",
            "warmup_steps",
            "filter_reward_std",
            "tis_cap",
            "lm_head_chunk",
            "max_staleness",
            "rollout_restarts",
            "advantage_boost",
            allow_zero=True,
        )
        if not isinstance(self.drop_no_answer, bool):
            errors.append(f"rl.drop_no_answer must be True or False, got {self.drop_no_answer!r}")
        if self.stale_groups not in ("regenerate", "drop"):
            errors.append(
                f"rl.stale_groups must be 'regenerate' or 'drop', got {self.stale_groups!r}"
            )
        if self.reference_dtype:
            errors += self.choice("reference_dtype", DTYPES)
        errors += self.choice("sample_unit", SAMPLE_UNITS)
        errors += self.positive("minibatch_size", "balance_partitions", allow_zero=True)
        errors += self.positive("balance_group_size")
        errors += self._minibatch_problems()
        if self.pack and self.share_prompts:
            errors.append(
                "rl.pack packs samples into rows, rl.share_prompts makes each row a group's "
                "prompt and its episodes (rl/shared_prompts.py); they do not combine: set one"
            )
        if not isinstance(self.share_prefixes, bool):
            errors.append(f"rl.share_prefixes must be True or False, got {self.share_prefixes!r}")
        elif self.share_prefixes and not self.pack:
            errors.append(
                "rl.share_prefixes packs samples that begin alike with one copy of their "
                "common prefix (rl/prefix_packing.py); it needs rl.pack = True"
            )
        if self.pack and self.loss_agg == "seq-mean-token-sum-norm":
            errors.append(
                "rl.pack with rl.loss_agg='seq-mean-token-sum-norm': its L is the padded row "
                "length, which packing changes, so the loss would not be the unpacked one; "
                "use another aggregation or rl.pack = False"
            )
        if self.group_size < 2:
            errors.append("rl.group_size must be >= 2: GRPO compares episodes of the same task")
        if not 2 <= self.min_group_size_after_infra <= max(self.group_size, 2):
            errors.append(
                f"rl.min_group_size_after_infra must be in [2, rl.group_size={self.group_size}] "
                f"(a group's reward std needs 2 episodes), got {self.min_group_size_after_infra}"
            )
        if not 0.0 <= self.max_infra_failure_fraction <= 1.0:
            errors.append(
                "rl.max_infra_failure_fraction must be in [0, 1], got "
                f"{self.max_infra_failure_fraction}"
            )
        errors += self.choice("loss", grpo.POLICY_LOSSES)
        errors += self.choice("loss_agg", AGGREGATIONS)
        errors += self.choice("advantage", grpo.ADVANTAGES)
        errors += self.choice("kl_type", grpo.KL_PENALTIES)
        format_errors = self.choice("format_filter", grpo.FORMAT_FILTERS)
        errors += format_errors
        if (
            not format_errors
            and self.format_filter != "penalty"
            and self.format_penalty != grpo.DEFAULT_FORMAT_PENALTY
        ):
            errors.append(
                f"rl.format_penalty={self.format_penalty} has no effect unless "
                "rl.format_filter='penalty'"
            )
        if self.clip_low <= 0 or self.clip_high <= 0:
            errors.append("rl.clip_low and rl.clip_high must be > 0")
        if self.dual_clip and self.dual_clip <= 1:
            errors.append(f"rl.dual_clip must be > 1 (or 0 to disable), got {self.dual_clip}")
        buckets = list(self.seq_buckets)
        if not buckets or buckets != sorted(set(buckets)):
            errors.append(f"rl.seq_buckets must be ascending and distinct, got {buckets}")
        errors += self.choice("schedule", SCHEDULES)
        return errors

    def _minibatch_problems(self) -> list[str]:
        errors = []
        if self.balance_partitions:
            size, group = self.minibatch_size, max(self.balance_group_size, 1)
            if not size:
                errors.append(
                    "rl.balance_partitions orders rl.minibatch_size's mini-batches: set it"
                )
            elif self.balance_partitions % group or size % max(self.balance_partitions // group, 1):
                errors.append(
                    f"rl.balance_partitions={self.balance_partitions} in groups of "
                    f"rl.balance_group_size={group} must split rl.minibatch_size={size} evenly"
                )
        if self.minibatch_size:
            if self.num_minibatches != 1:
                errors.append(
                    "rl.minibatch_size and rl.num_minibatches both set the mini-batches: "
                    "leave rl.num_minibatches at 1"
                )
            if self.share_prompts:
                errors.append(
                    "rl.minibatch_size counts samples, rl.share_prompts makes batch rows of "
                    "groups: set rl.share_prompts = False"
                )
            if self.schedule != "constant" or self.warmup_steps:
                errors.append(
                    "rl.minibatch_size makes a varying number of updates a step, which "
                    "rl.schedule / rl.warmup_steps (counted in updates) cannot plan: use "
                    "rl.schedule='constant' and rl.warmup_steps=0"
                )
        return errors

    def learner_config(
        self, *, temperature: float, total_steps: int | None = None, batch_shards: int = 1
    ) -> LearnerConfig:
        """The GRPO learner's settings; a micro-batch holds `micro_batch_size` rows on
        each of `batch_shards` batch shards. `total_steps` and `warmup_steps` count GRPO
        steps; the schedule counts optimizer updates (`num_minibatches` · `num_epochs` a
        step). `temperature` is the rollouts' sampling temperature."""
        updates = self.num_minibatches * self.num_epochs
        return LearnerConfig(
            learning_rate=self.lr,
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            schedule=self.schedule,
            warmup_steps=self.warmup_steps * updates,
            total_steps=None if total_steps is None else total_steps * updates,
            micro_batch_size=self.micro_batch_size * batch_shards,
            num_minibatches=self.num_minibatches,
            num_epochs=self.num_epochs,
            minibatch_size=self.minibatch_size or None,
            loss=self.loss,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            dual_clip=self.dual_clip or None,
            agg=self.loss_agg,
            kl_coef=self.kl_coef,
            kl_type=self.kl_type,
            temperature=max(temperature, 1e-6),
            tis_cap=self.tis_cap or None,
            lm_head_chunk=self.lm_head_chunk or None,
            reference_dtype=self.reference_dtype or None,
        )

    def batching(self, row_multiple: int) -> BatchingConfig:
        """How trajectories become learner rows: `seq_buckets`, `pack` (with
        `share_prefixes` the loop packs by `rl/prefix_packing.py` instead)."""
        return BatchingConfig(
            seq_buckets=tuple(self.seq_buckets), row_multiple=row_multiple, pack=bool(self.pack)
        )
