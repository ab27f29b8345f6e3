"""`qwen3_8b` is the reference release's training recipe; `qwen3_8b_project` keeps the
project's defaults for every field where the two differ (docs/reproduction.md)."""

from experiments.configs import grpo_hle
from orchestra_jax.training import builders

# field: the reference's value (its file in docs/reproduction.md and the variant).
REFERENCE = {
    "agent.context": "rebuild",
    "rl.sample_unit": "turn",
    "rl.minibatch_size": 16,
    "rl.tis_cap": 0.0,
    "reward.type": "toolorchestra_reference",
    "rl.advantage_boost": 0.1,
    "rl.drop_no_answer": True,
    "tools.experts": "reference",
    "tools.search_top_k": 30,
    "eval.protocol": "paper",
    "eval.every_steps": 0,
    "checkpoint.every_steps": 1,
}
HYPERPARAMETERS = {
    "rl.group_size": 8,
    "rl.tasks_per_step": 16,
    "rl.lr": 1e-6,
    "rl.schedule": "constant",
    "rl.warmup_steps": 0,
    "rl.weight_decay": 0.01,
    "rl.grad_clip": 1.0,
    "rl.clip_low": 0.2,
    "rl.clip_high": 0.28,
    "rl.dual_clip": 10.0,
    "rl.kl_coef": 1e-4,
    "rl.kl_type": "mse",
    "rl.loss_agg": "token-mean",
    "rl.num_epochs": 1,
    "rl.adv_clip": 3.0,
    "rl.filter_reward_std": 0.1,
    "rl.format_filter": "turn",
    "rollout.temperature": 1.0,
    "rollout.top_p": 1.0,
    "rollout.top_k": -1,
    "agent.max_turns": 30,
    "agent.max_new_tokens_per_turn": 8768,
    "agent.rebuild.prompt_tokens": 24000,
}


def field(config, name):
    for part in name.split("."):
        config = config[part]
    return config


def test_qwen3_8b_sets_the_reference_recipe_and_its_hyperparameters():
    config = grpo_hle.get_config("qwen3_8b")
    for name, value in {**REFERENCE, **HYPERPARAMETERS}.items():
        assert field(config, name) == value, name
    assert max(config.rl.seq_buckets) >= 24000 + 8768 <= config.agent.max_context_tokens
    learner = builders.build_learner_config(config, total_steps=config.num_steps)
    assert (learner.minibatch_size, learner.tis_cap, learner.entropy_coef) == (16, None, 0.0)


def test_qwen3_8b_project_keeps_the_defaults_and_the_hyperparameters():
    project, base = grpo_hle.get_config("qwen3_8b_project"), grpo_hle._base()
    own = {  # the project's 8B settings: the live variants' depth, held-out curves
        "tools.search_top_k": 50,
        "eval.every_steps": 50,
        "checkpoint.every_steps": 25,
    }
    for name in REFERENCE:
        assert field(project, name) == own.get(name, field(base, name)), name
    for name, value in HYPERPARAMETERS.items():
        assert field(project, name) == value, name
