"""The reference release's training recipe, field by field: what `qwen3_8b` sets.

Each `ReferenceSetting` names a config field, the value that makes the run behave
as the authors' release does, where the release does it (files under the
release's `training/`: gen = `lead_agent/llm_agent/generation_quick3.py`, sh =
`train_orchestrator.sh`, yaml = `verl/trainer/config/ppo_trainer.yaml`), and what
any other value means. `differences(config)` lists the settings a config does not
share with the release (`python -m experiments.reference_diff`); it is empty for
`qwen3_8b` (`tests/test_reference_diff.py`). docs/reproduction.md explains each.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ReferenceSetting:
    """`field` set to `value` behaves as the release's `source` does; `otherwise`
    says what a different value (the project's default) does instead."""

    field: str
    value: Any
    source: str
    otherwise: str


def _s(field: str, value: Any, source: str, otherwise: str) -> ReferenceSetting:
    return ReferenceSetting(field, value, source, otherwise)


HYPERPARAMETER = "a different hyperparameter from the release's"
# Settings whose project default is already the release's value.
SHARED = "a different value from the release's, which the project's default shares"

REFERENCE_SETTINGS: tuple[ReferenceSetting, ...] = (
    # What the orchestrator reads and what is trained.
    _s("agent.context", "rebuild", "gen run_llm_loop", "one growing sequence per episode"),
    _s("rl.sample_unit", "turn", "gen run_llm_loop", "one sample per episode"),
    _s(
        "agent.rebuild.programs",
        "stdout",
        "gen 234-235, 2024",
        "programs shown with stderr, exit status and '(no output)', silent ones too",
    ),
    _s(
        "agent.rebuild.cut",
        "reference",
        "gen 97-107 cut_seq",
        "text under budget kept as it is, special-token text kept",
    ),
    _s("tools.document_text", "content", "gen 592-595", "documents shown as 'title: text'"),
    _s("tools.experts", "reference", "gen call_tool", "experts asked with the project's prompts"),
    _s("tools.search_top_k", 30, "sh data.topk_doc", "another number of documents per search"),
    # What an episode is paid.
    _s(
        "reward.type",
        "toolorchestra_reference",
        "gen run_llm_loop",
        "the paper's formula with cost and latency negated consistently",
    ),
    _s(
        "agent.tool_calls",
        "reference",
        "gen 2104-2129 postprocess_predictions",
        "calls in <think> ignored, duplicates run, any invalid call makes the turn malformed",
    ),
    _s(
        "agent.accounting",
        "reference",
        "gen 1282, 1337, 2041, 2074-2075",
        "answer call charged, generation time and the slowest tool as latency, one token price",
    ),
    _s(
        "tools.search_pricing",
        "reference",
        "gen 563-567",
        "a search charged per query and per returned document",
    ),
    _s(
        "tools.search_price_per_query",
        0.01,
        "rollout/tau2/utils/llm_utils.py TOOL_PRICING tavily.search",
        SHARED,
    ),
    _s(
        "tools.search_price_per_document",
        0.002,
        "rollout/tau2/utils/llm_utils.py TOOL_PRICING tavily.extract",
        "another price per extracted document",
    ),
    _s(
        "reward.judge.answer_match",
        "lowercase",
        "gen 431-440",
        "answers settled by the normalised match (punctuation and articles dropped)",
    ),
    _s(
        "env.tau2.user_temperature",
        1.0,
        "rollout/tau2/config.py 33, cli.py 106-108",
        "the user simulator samples at another temperature",
    ),
    _s(
        "env.tau2.nl_assertions",
        "judge",
        "rollout/tau2/run.py 164 (EvaluationType.ALL)",
        "natural-language assertions left out of a τ² episode's reward",
    ),
    _s("env.tau2.expert_mode", "act", "gen call_tool (func_call)", "an expert's reply is advice"),
    _s(
        "env.tau2.drop_tools",
        "transfer_to_human_agents",
        "rollout/tau2/utils/llm_utils.py generate",
        "the policy offered other domain tools",
    ),
    _s(
        "env.tau2.train_message_turns",
        False,
        "gen postprocess_predictions, run_llm_loop",
        "turns that message the user train",
    ),
    # Filters, advantages, updates.
    _s("rl.drop_no_answer", True, "gen run_llm_loop valid_answers", "unanswered episodes train"),
    _s(
        "rl.advantage_boost",
        0.1,
        "sh correct_sample_advantage_boost_value",
        "advantages ≥ 1 not boosted",
    ),
    _s(
        "rl.minibatch_size",
        16,
        "sh PPO_MINI_BATCH_SIZE",
        "another number of samples per update",
    ),
    _s(
        "rl.balance_partitions",
        16,
        "recipe/algo/grpo_ray_trainer_quick3.py 415, verl/trainer/ppo/ray_trainer.py 906-917",
        "samples kept in rollout order before mini-batches are cut",
    ),
    _s(
        "rl.balance_group_size",
        2,
        "sh ulysses_sequence_parallel_size",
        SHARED,
    ),
    _s("rl.tis_cap", 0.0, "recipe/algo/grpo_ray_trainer_quick3.py compute_log_prob", "TIS on"),
    _s("eval.protocol", "paper", "evaluation/eval_hle.py", "held-out prices and preferences"),
    _s("eval.every_steps", 0, "sh trainer.test_freq", "evaluations during training"),
    _s("checkpoint.every_steps", 1, "sh trainer.save_freq", "checkpoints less often"),
    # Hyperparameters, the same in qwen3_8b_project (HYPERPARAMETER).
    _s("rl.group_size", 8, "sh ROLLOUT", HYPERPARAMETER),
    _s("rl.tasks_per_step", 16, "sh TRAIN_BATCH_SIZE", HYPERPARAMETER),
    _s("rl.lr", 1e-6, "sh LR", HYPERPARAMETER),
    _s("rl.schedule", "constant", "yaml optim.warmup_style", HYPERPARAMETER),
    _s("rl.warmup_steps", 0, "yaml optim.lr_warmup_steps", HYPERPARAMETER),
    _s("rl.weight_decay", 0.01, "yaml actor.optim.weight_decay", HYPERPARAMETER),
    _s("rl.grad_clip", 1.0, "yaml actor.grad_clip", HYPERPARAMETER),
    _s("rl.clip_low", 0.2, "sh clip_ratio_low", HYPERPARAMETER),
    _s("rl.clip_high", 0.28, "sh clip_ratio_high", HYPERPARAMETER),
    _s("rl.dual_clip", 10.0, "sh clip_ratio_c", HYPERPARAMETER),
    _s("rl.kl_coef", 1e-4, "sh kl_loss_coef", HYPERPARAMETER),
    _s("rl.kl_type", "mse", "sh kl_loss_type", HYPERPARAMETER),
    _s("rl.loss_agg", "token-mean", "yaml actor.loss_agg_mode", HYPERPARAMETER),
    _s("rl.num_epochs", 1, "sh PPO_EPOCHS", HYPERPARAMETER),
    _s("rl.adv_clip", 3.0, "gen run_llm_loop", HYPERPARAMETER),
    _s("rl.filter_reward_std", 0.1, "gen run_llm_loop", HYPERPARAMETER),
    _s("rl.format_filter", "turn", "gen run_llm_loop", HYPERPARAMETER),
    _s("rollout.temperature", 1.0, "sh TEMP", HYPERPARAMETER),
    _s("rollout.top_p", 1.0, "yaml rollout.top_p", HYPERPARAMETER),
    _s("rollout.top_k", -1, "yaml rollout.top_k", HYPERPARAMETER),
    _s("agent.max_turns", 30, "sh +max_turns", HYPERPARAMETER),
    _s("agent.max_new_tokens_per_turn", 8768, "sh max_response_length", HYPERPARAMETER),
    _s("agent.rebuild.prompt_tokens", 24000, "sh max_prompt_length", HYPERPARAMETER),
)


def config_value(config: Any, field: str) -> Any:
    """The value of the dotted `field` in `config`."""
    value = config
    for part in field.split("."):
        value = value[part]
    return value


def differences(config: Any) -> list[tuple[ReferenceSetting, Any]]:
    """(setting, the config's value) for every setting the config does not share
    with the release, in `REFERENCE_SETTINGS` order."""
    return [
        (s, config_value(config, s.field))
        for s in REFERENCE_SETTINGS
        if config_value(config, s.field) != s.value
    ]


def report(config: Any) -> list[str]:
    """One line per setting `config` does not share with the release
    (`python -m experiments.reference_diff`)."""
    return [
        f"{s.field} = {value!r} (the release: {s.value!r}, {s.source}): {s.otherwise}"
        for s, value in differences(config)
    ]
