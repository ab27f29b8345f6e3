"""The configuration contract: each package's typed section is built from its part of
the config file, refuses its bad values with the config field named, and the rules
between sections are reported with every section's mistakes in one go."""

import dataclasses

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.agent.config import AgentConfig, RebuildConfig
from orchestra_jax.agent.context import RebuildBudgets, RebuildContext
from orchestra_jax.config_section import ConfigError, SectionError, plain
from orchestra_jax.data.config import DataConfig
from orchestra_jax.envs.config import EnvConfig
from orchestra_jax.envs.tau2.config import Tau2Config
from orchestra_jax.eval.config import EvalConfig
from orchestra_jax.models.config import LoRAConfig, ModelConfig
from orchestra_jax.parallel.config import MeshConfig
from orchestra_jax.rewards.config import JudgeConfig, RewardConfig
from orchestra_jax.rl.config import RLConfig
from orchestra_jax.rollout.config import RolloutConfig, ServerPoolConfig
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.tools.tools_config import ToolsConfig
from orchestra_jax.training import builders, experiment_config
from orchestra_jax.training.run_config import CheckpointConfig, RunConfig
from orchestra_jax.training.sft_config import SFTConfig


def _problems(cls, **values):
    with pytest.raises(SectionError) as e:
        cls(**values)
    return e.value.problems


def test_every_variant_builds_its_typed_sections_from_the_file():
    for variant in grpo_hle.VARIANTS:
        config = grpo_hle.get_config(variant)
        for name, cls in experiment_config.SECTION_CLASSES:
            values = experiment_config.section_values(config, name)
            fields = {f.name for f in dataclasses.fields(cls)}
            assert set(values.keys()) <= fields, (variant, name)
            section = cls.unchecked(values)
            for field in values.keys():  # the flag's name is the field's
                if field not in cls.NESTED and field != "overrides":
                    assert getattr(section, field) == plain(values[field]), (name, field)
        # Every top-level key is typed: a run value or a section.
        typed = {f.name for f in dataclasses.fields(RunConfig)}
        typed |= {name for name, _ in experiment_config.SECTION_CLASSES}
        assert set(config.keys()) <= typed, variant
    sections = experiment_config.sections(grpo_hle.get_config("demo"))
    demo = grpo_hle.get_config("demo")
    assert sections.rl.lr == demo.rl.lr and sections.lora.rank == demo.lora.rank


def test_the_runs_own_fields_are_checked_by_their_sections():
    assert _problems(RunConfig, num_steps=0, seed=-1) == [
        "num_steps must be > 0, got 0",
        "seed must be >= 0, got -1",
    ]
    assert _problems(RunConfig, tokenizer="/nonexistent") == [
        "tokenizer: 'demo' or a folder with tokenizer.json, got '/nonexistent'"
    ]
    assert _problems(CheckpointConfig, keep=0, every_steps=-1) == [
        "checkpoint.keep must be > 0, got 0",
        "checkpoint.every_steps must be >= 0, got -1",
    ]
    assert RunConfig(variant="micro").run_dir() == "runs/micro"
    config = grpo_hle.get_config("micro")
    config.log.trajectories = 2  # not a field: log.trajectories_every is
    assert experiment_config.problems(config) == ["log.trajectories: no such field"]


def test_a_section_refuses_its_bad_values_naming_the_config_field():
    assert _problems(RLConfig, lr=-1.0) == ["rl.lr must be > 0, got -1.0"]
    assert _problems(RLConfig, advantage_boost=-0.1) == [
        "rl.advantage_boost must be >= 0, got -0.1"
    ]
    assert _problems(RLConfig, advantage="rloo")[0].startswith("rl.advantage must be one of")
    assert _problems(RLConfig, minibatch_size=16, num_minibatches=2) == [
        "rl.minibatch_size and rl.num_minibatches both set the mini-batches: "
        "leave rl.num_minibatches at 1"
    ]
    assert _problems(LoRAConfig, rank=-1) == [
        "lora.rank must be >= 0 (0: full fine-tuning), got -1"
    ]
    assert len(_problems(LoRAConfig, rank=4, alpha=0.0, dropout=0.1, targets="q,q")) == 3
    assert _problems(MeshConfig, fsdp=0) == ["mesh.fsdp must be >= 1 or -1 (the rest), got 0"]
    assert _problems(ModelConfig, preset="demo", hf_path="/x")[0].startswith(
        "model: set exactly one of model.preset and model.hf_path"
    )
    assert _problems(SFTConfig, ema_decay=1.0) == ["sft.ema_decay must be in [0, 1), got 1.0"]
    assert _problems(SFTConfig, demo_best_of=7) == [
        "sft.demo_best_of=7 has no effect unless sft.demo_filter='best'"
    ]
    assert _problems(SFTConfig, steps=4, demo_policy="nobody")[0].startswith(
        "sft.demo_policy must be a router"
    )
    assert _problems(ModelConfig, preset="demo", dtype="fp16") == [
        "model.dtype must be one of ('float32', 'bfloat16'), got 'fp16'"
    ]


def test_every_mistake_of_a_section_is_listed_not_only_the_first():
    problems = _problems(RLConfig, lr=-1.0, group_size=1, loss_agg="nope", clip_low=0.0)
    assert len(problems) >= 4
    assert any(p.startswith("rl.lr") for p in problems)
    assert any(p.startswith("rl.group_size must be >= 2") for p in problems)


def test_a_key_that_names_no_field_is_refused():
    with pytest.raises(SectionError, match=r"rl\.learning_rate: no such field"):
        RLConfig.from_config({"learning_rate": 1e-6})


def test_rules_between_sections_are_reported_with_the_sections_mistakes():
    config = grpo_hle.get_config("micro")
    config.lora.rank, config.lora.dropout = 4, 0.1  # a lora mistake ...
    config.rollout.engine = "scripted"  # ... and LoRA x engine
    config.rl.max_staleness = 1
    config.rl.schedule, config.rl.warmup_steps = "cosine", 5  # schedule x num_steps (2)
    config.rl.seq_buckets = (128,)  # buckets x agent.max_context_tokens
    config.rl.lr = -1.0  # an rl mistake: the rl rules still run
    problems = experiment_config.problems(config)
    for needle in (
        "lora.dropout=0.1",
        "rollout.engine='scripted' with lora.rank > 0",
        "rl.lr must be > 0",
        "rl.schedule='cosine' decays after rl.warmup_steps (5)",
        "rl.seq_buckets: the largest (128) must hold agent.max_context_tokens",
    ):
        assert sum(needle in p for p in problems) == 1, needle
    with pytest.raises(ConfigError) as e:
        experiment_config.validate(config)
    assert str(e.value).splitlines()[1:] == ["  " + p for p in problems]  # one line each
    config = grpo_hle.get_config("tau2_demo")
    config.sft.steps, config.sft.demo_policy = 3, "expert_random"
    config.env.tau2.expert_mode = "act"
    assert experiment_config._sft_demo_policy(
        config, SFTConfig(steps=3, demo_policy="expert_random")
    ) == [
        "sft.demo_policy='expert_random' relays ask_expert's advice; it needs "
        "env.tau2.expert_mode='advise'"
    ]
    config = grpo_hle.get_config("micro")
    config.rl.max_staleness = 1
    config.rollout.engine = "sglang"
    config.rollout.urls, config.rollout.weights_dir = "http://a:1", "/w"
    assert experiment_config.problems(config) == [
        "rl.partial_rollouts needs rollout.engine='jax' or 'vllm' (SGLang servers load "
        "versioned folders between requests): set rl.partial_rollouts = False"
    ]


def test_a_component_is_built_from_its_section_alone():
    rl = RLConfig(lr=3e-4, loss_agg="seq-mean-token-mean", num_minibatches=2, warmup_steps=1)
    learner = rl.learner_config(temperature=0.7, total_steps=10, batch_shards=2)
    assert learner.learning_rate == 3e-4 and learner.agg == "seq-mean-token-mean"
    assert learner.warmup_steps == 2 and learner.total_steps == 20  # updates, not steps
    assert learner.micro_batch_size == 16 and learner.temperature == 0.7
    assert rl.batching(4).seq_buckets == rl.seq_buckets
    sft = SFTConfig(steps=5, lr=1e-3, warmup_steps=1).learner_config(learner)
    assert (sft.learning_rate, sft.total_steps, sft.kl_coef, sft.temperature) == (1e-3, 5, 0.0, 1.0)
    assert LoRAConfig().spec() is None
    spec = LoRAConfig(rank=8, targets="q,v").spec()
    assert spec is not None and spec.targets == ("q", "v") and spec.alpha == 16.0
    # The builders read the same section from the whole config.
    config = grpo_hle.get_config("micro")
    assert builders.build_learner_config(config, total_steps=2) == RLConfig.from_config(
        config.rl
    ).learner_config(temperature=config.rollout.temperature, total_steps=2)


def test_the_reward_section_and_its_judge():
    assert _problems(RewardConfig, type="vibes")[0].startswith("reward.type must be one of")
    assert RewardConfig(type="efficiency", efficiency_alpha=2.0).group_reward().keywords == {
        "cost_weight": 2.0,
        "latency_weight": 0.0,
        "floor": 0.0,
    }
    assert JudgeConfig(prompt="nope").prompt == "nope"  # no base_url: no judge, unchecked
    problems = _problems(JudgeConfig, base_url="ftp://j", max_tokens=0, retries=-1, prompt="x")
    assert "reward.judge.base_url must start with http:// or https://, got 'ftp://j'" in problems
    assert "reward.judge.model: the judge's model name is empty" in problems
    assert "reward.judge.max_tokens must be > 0, got 0" in problems
    assert "reward.judge.retries must be >= 0, got -1" in problems
    assert any(p.startswith("reward.judge.prompt must be one of") for p in problems)
    # A judge's mistakes and the reward's own are listed together.
    with pytest.raises(SectionError) as e:
        RewardConfig.from_config({"type": "vibes", "judge": {"base_url": "http://j", "model": ""}})
    assert len(e.value.problems) == 2
    judge = JudgeConfig.from_config(grpo_hle.get_config("live_tiny").reward.judge)
    assert judge.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}


def test_judged_sources_need_a_judge_a_rule_between_reward_and_data():
    config = grpo_hle.get_config("qwen3_8b")
    config.reward.judge.base_url = ""
    assert experiment_config._judge_for_sources(
        config, RewardConfig(), DataConfig.unchecked(config.data)
    ) == [
        "reward.judge.base_url: data.sources ['generalthought'] are graded by an LLM judge; "
        "set reward.judge.base_url and reward.judge.model"
    ]
    assert experiment_config.sections(grpo_hle.get_config("micro")).reward == RewardConfig()


def test_the_eval_section_and_its_rules():
    assert _problems(EvalConfig, num_trials=0, seed=-1) == [
        "eval.num_trials must be > 0, got 0",
        "eval.seed must be >= 0, got -1",
    ]
    assert _problems(EvalConfig, latency_scale_s=0.0) == [
        "eval.cost_scale_usd and eval.latency_scale_s must be > 0 (they scale "
        "the held-out reward and reward.type='utility')"
    ]
    assert _problems(EvalConfig, baselines="random,nobody")[0].startswith(
        "eval.baselines: unknown router 'nobody'"
    )
    assert EvalConfig(baselines=" random, ,always_cheapest").baseline_names() == [
        "random",
        "always_cheapest",
    ]
    # The protocol and the baselines against the environment are rules between sections.
    config = grpo_hle.get_config("tau2_demo")
    config.eval.baselines = "always_strongest"
    problems = experiment_config.problems(config)
    assert "eval.baselines: τ² routers ask experts: set env.tau2.meta_tools=ask_expert" in problems
    assert any(p.startswith("eval.baselines: 'always_strongest' does not play") for p in problems)
    config = grpo_hle.get_config("micro")
    config.eval.protocol = "papr"
    assert experiment_config._eval_protocol(config, EvalConfig(protocol="papr"))[0].startswith(
        "eval.protocol must be one of ['heldout', 'paper']"
    )


def test_the_tools_section_and_its_rules():
    problems = _problems(ToolsConfig, price_scale_min=3.0, keep_probability=2.0, search_top_k=0)
    assert problems == [
        "tools.price_scale_min/price_scale_max: need 0 < min <= max, got 3.0, 2.0",
        "tools.keep_probability must be a probability, got 2.0",
        "tools.search_top_k must be > 0, got 0",
    ]
    assert _problems(ToolsConfig, enabled="bogus")[0].startswith("tools.enabled: ")
    assert _problems(ToolsConfig, sandbox="x")[0].startswith("tools.sandbox must be one of")
    # The builders read the section: the task's tool fields and the sampler's ranges.
    config = grpo_hle.get_config("micro")
    tools = ToolsConfig.from_config(config.tools)
    assert builders.tool_config_fields(config) == tools.tool_config_fields()
    ranges = builders.sampler_ranges(config)
    assert ranges == tools.sampler_ranges() and ranges.price_scale == (0.5, 2.0)
    # The search's pricing against the environment is a rule between sections.
    config.tools.search_pricing = "reference"
    assert experiment_config.problems(config) == [
        "tools.search_pricing='reference' prices the live search of env.name='qa'; "
        "env.name='synthetic' has none"
    ]


def test_the_data_section_and_its_rules(tmp_path):
    assert _problems(DataConfig, sources="") == ["data.sources is empty"]
    assert _problems(DataConfig, sources="synthetic:0,frames") == [
        "data.sources: weight of 'synthetic' must be > 0",
        "data.sources: 'frames' needs a file in data.paths.frames",
    ]
    assert _problems(DataConfig, stratum_weights="logic:2") == [
        "data.stratum_weights needs data.stratify_by (the field whose values it weighs)"
    ]
    assert _problems(DataConfig, eval_fraction=1.5, synthetic_seed=-1) == [
        "data.eval_fraction must be in [0, 1], got 1.5",
        "data.synthetic_seed must be >= 0, got -1",
    ]
    train, held_out = tmp_path / "train.jsonl", tmp_path / "held_out.jsonl"
    train.write_text(""), held_out.write_text("")
    assert _problems(
        DataConfig,
        sources="frames",
        paths={"frames": str(train)},
        eval_paths={"frames": str(train)},
    ) == [
        "data.eval_paths.frames is data.paths.frames: the held-out split would overlap "
        "training (give another file, or data.eval_fraction)"
    ]
    data = DataConfig(
        sources="synthetic:3,frames:1",
        paths={"frames": str(train)},
        eval_paths={"frames": str(held_out), "hle": ""},
    )
    assert data.file_sources() == ["frames"] and data.held_out_paths() == {"frames": str(held_out)}
    # A file source without a held-out split, in an evaluated run: a rule with eval.
    bare = DataConfig(sources="frames", paths={"frames": str(train)})
    assert experiment_config._data_held_out(None, bare, EvalConfig()) == [
        "data.sources: 'frames' has no held-out split for evaluation: set "
        "data.eval_paths.frames or data.eval_fraction > 0"
    ]
    assert experiment_config._data_held_out(None, bare, EvalConfig(num_tasks=0)) == []


def test_the_env_section_checks_tau2_where_tau2_is_played():
    assert _problems(EnvConfig, name="nowhere")[0].startswith("env.name must be one of")
    assert _problems(EnvConfig, name="routed") == [
        "env.members: env.name='routed' needs environments, e.g. 'synthetic,tau2'"
    ]
    assert _problems(EnvConfig, name="routed", members="synthetic,x")[0].startswith(
        "env.members must be one of"
    )
    # τ²'s settings are read, not checked, where τ² is not played (no data folder).
    bad_tau2 = Tau2Config(user="x", max_steps=0)
    assert EnvConfig(name="synthetic", tau2=bad_tau2).played() == ["synthetic"]
    for env in (dict(name="tau2"), dict(name="routed", members="synthetic,tau2")):
        problems = _problems(EnvConfig, tau2=bad_tau2, **env)
        assert "env.tau2.user must be one of ('simulator', 'scripted'), got 'x'" in problems
        assert "env.tau2: max_steps and max_errors must be >= 1, user_retries >= 0" in problems
    config = grpo_hle.get_config("tau2_demo")
    assert EnvConfig.unchecked(config.env).tau2 == Tau2Config.from_config(config.env.tau2)


def test_the_rollout_section_checks_its_engine_sampling_and_server_pool():
    assert _problems(RolloutConfig, engine="nonesuch")[0].startswith(
        "rollout.engine must be one of"
    )
    assert _problems(RolloutConfig, engine="vllm") == [  # what its constructor needs
        "rollout.urls: the 'vllm' engine needs it",
        "rollout.weights_dir: the 'vllm' engine needs it",
    ]
    assert _problems(RolloutConfig, max_batch_size=0, temperature=-1.0, top_p=1.5) == [
        "rollout.max_batch_size must be > 0, got 0",
        "rollout.temperature must be >= 0, got -1.0",
        "rollout.top_p must be in (0, 1], got 1.5",
    ]
    # The server pool: a name that is no setting is named with the known ones.
    with pytest.raises(SectionError) as e:
        RolloutConfig.from_config({"server_pool": {"timeout_s": 0.0, "retries": 1}, "top_p": 0})
    assert e.value.problems[0].startswith(
        "rollout.server_pool.retries: no such setting (known: timeout_s, max_retries,"
    )
    assert e.value.problems[1:] == [
        "rollout.server_pool.timeout_s must be > 0.0, got 0.0",
        "rollout.top_p must be in (0, 1], got 0",  # the section's own, listed too
    ]
    assert ServerPoolConfig().settings() == ServerPoolSettings()  # the same defaults
    config = grpo_hle.get_config("qwen3_8b")
    rollout = RolloutConfig.from_config(config.rollout)
    arguments = rollout.engine_arguments(max_context_tokens=config.agent.max_context_tokens)
    assert arguments["urls"] == [config.rollout.urls] and arguments["api_key_env"]
    assert arguments["settings"] == ServerPoolSettings(**config.rollout.server_pool)
    bad_pool = RolloutConfig.unchecked({"server_pool": {"max_retries": -1}})
    assert bad_pool.engine_arguments()["settings"] is None  # the check names it
    assert builders.sampling_params(config) == SamplingParams(
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        top_k=config.rollout.top_k,
        max_new_tokens=config.agent.max_new_tokens_per_turn,
    )


def test_the_agent_section_checks_its_limits_readings_and_context():
    assert _problems(AgentConfig, max_turns=0, max_concurrent_episodes=-1) == [
        "agent.max_turns must be > 0, got 0",
        "agent.max_concurrent_episodes must be >= 0, got -1",
    ]
    assert _problems(AgentConfig, tool_calls="lenient")[0].startswith(
        "agent.tool_calls must be one of"
    )
    # agent.rebuild is read, and checked, only by a context that rebuilds the prompt.
    sloppy = RebuildConfig(cut="sloppy")
    assert AgentConfig(rebuild=sloppy).rebuild.cut == "sloppy"
    assert _problems(AgentConfig, context="rebuild", rebuild=sloppy) == [
        "agent.context='rebuild': cut must be one of ('project', 'reference'), got 'sloppy'"
    ]
    assert dataclasses.asdict(RebuildConfig()) == dataclasses.asdict(RebuildBudgets())
    agent = AgentConfig.from_config({"context": "rebuild", "rebuild": {"prompt_tokens": 1536}})
    assert agent.context_policy() == RebuildContext(RebuildBudgets(prompt_tokens=1536))
    config = grpo_hle.get_config("qwen3_8b")  # agent.context="rebuild"
    limits = builders.loop_limits(config)
    assert limits.context == RebuildContext(RebuildBudgets(**config.agent.rebuild))
    assert limits.max_batch_size == config.rollout.max_batch_size


def test_rules_between_the_agent_the_rollout_and_rl():
    jax_engine, sglang = (
        RolloutConfig(max_seq_len=2048),
        RolloutConfig.unchecked({"engine": "sglang", "max_seq_len": 2048}),
    )
    long_context = AgentConfig(max_context_tokens=4096)
    assert experiment_config._context_kv_cache(None, long_context, jax_engine) == [
        "agent.max_context_tokens (4096) exceeds rollout.max_seq_len (2048), the KV-cache length"
    ]
    assert experiment_config._context_kv_cache(None, long_context, sglang) == []  # no KV cache
    constrained = AgentConfig(constrain_enum_arguments=True)
    assert experiment_config._enum_constraint_engine(None, constrained, jax_engine) == []
    assert experiment_config._enum_constraint_engine(None, constrained, sglang) == [
        "agent.constrain_enum_arguments needs rollout.engine='jax' (got 'sglang'): the HTTP "
        "engines do not follow a token constraint"
    ]
    rebuild = AgentConfig(context="rebuild")
    assert experiment_config._context_sample_unit(None, rebuild, RLConfig()) == [
        "agent.context='rebuild' gives every turn its own prompt, so its episodes train "
        "turn by turn: set rl.sample_unit='turn'"
    ]
    assert experiment_config._context_sample_unit(None, rebuild, RLConfig(sample_unit="turn")) == []
    unread = AgentConfig.unchecked({"context": "rebuild", "tool_calls": "lenient"})
    assert experiment_config._context_sample_unit(None, unread, RLConfig()) == []  # named once
    # Through the whole config: the sections' mistakes, then the rules'.
    config = grpo_hle.get_config("micro")
    config.agent.context, config.agent.max_turns = "rebuild", 0
    config.rollout.max_seq_len = config.agent.max_context_tokens - 1
    config.rollout.temperature = -1.0
    assert experiment_config.problems(config) == [
        "rollout.temperature must be >= 0, got -1.0",
        "agent.max_turns must be > 0, got 0",
        f"agent.max_context_tokens ({config.agent.max_context_tokens}) exceeds "
        f"rollout.max_seq_len ({config.rollout.max_seq_len}), the KV-cache length",
        "agent.context='rebuild' gives every turn its own prompt, so its episodes train "
        "turn by turn: set rl.sample_unit='turn'",
    ]
