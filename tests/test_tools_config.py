"""ToolConfig, its rendering, the sampler and the held-out configurations."""

import json
import re

import pytest

from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.tasks import Task
from orchestra_jax.tools import descriptions
from orchestra_jax.tools.config import ModelAlias, ToolConfig
from orchestra_jax.tools.config_sampler import SamplerRanges, ToolConfigSampler, fixed_eval_configs

ROW = re.compile(r"^(\S+) \| \$(\S+) \| \$(\S+) \| (\S+)s$", re.MULTILINE)
PROFILES = SyntheticOrchestrationEnv.model_profiles()
TASK = Task("t1", "What is 2 + 2?", "4", "numeric", "arithmetic")


def table_rows(schema):
    doc = schema["function"]["parameters"]["properties"]["model"]["description"]
    return {m[0]: (float(m[1]), float(m[2]), float(m[3])) for m in ROW.findall(doc)}


def test_schema_lists_aliases_with_prices_like_the_reference(shared_file):
    reference = json.loads(shared_file("reference/toolorchestra_tools.json").read_text())
    ref = {t["function"]["name"]: t for t in reference}
    aliases = [
        ModelAlias(f"reasoner-{i}", "enhance_reasoning", "b", pin, pout, lat)
        for i, (pin, pout, lat) in enumerate([(1.25, 10, 31), (0.25, 2, 25), (0.8, 0.8, 9)], 1)
    ]
    ours = descriptions.meta_tool_schema("enhance_reasoning", aliases)
    assert table_rows(ours) == table_rows(ref["enhance_reasoning"])
    assert ours["function"]["parameters"]["required"] == ["model"]
    assert set(ours["function"]["parameters"]["properties"]) == {"model"}


def test_sampled_prices_stay_in_range_and_change_descriptions():
    ranges = SamplerRanges(price_scale=(0.5, 2.0), latency_scale=(0.8, 1.25))
    sampler = ToolConfigSampler(PROFILES, ranges=ranges, seed=0)
    base = {(p.tool, p.backend): p for p in PROFILES}
    rendered = set()
    for i in range(30):
        config = sampler.sample(Task(f"t{i}", "q", "a"))
        for a in config.aliases:
            p = base[(a.tool, a.backend)]
            assert 0.5 * 0.995 <= a.price_out / p.price_out <= 2.0 * 1.005
            assert 0.8 * 0.995 <= a.latency_s / p.latency_s <= 1.25 * 1.005
        for schema in config.tool_schemas():
            for alias, (pin, pout, _) in table_rows(schema).items():
                assert (pin, pout) == (config.alias(alias).price_in, config.alias(alias).price_out)
        rendered.add(json.dumps(config.tool_schemas()))
    assert len(rendered) == 30  # every task saw different descriptions


def test_sampler_randomises_names_and_availability():
    sampler = ToolConfigSampler(PROFILES, seed=1)
    backends_of_search1, counts = set(), set()
    for i in range(40):
        config = sampler.sample(Task(f"t{i}", "q", "a"))
        backends_of_search1.add(config.alias("search-1").backend)
        counts.add(len(config.aliases))
        for tool in config.tools:
            assert config.aliases_for(tool)
    assert len(backends_of_search1) > 1 and len(counts) > 1


def test_same_seed_same_config_and_rng_argument():
    a = ToolConfigSampler(PROFILES, seed=5).sample(TASK)
    b = ToolConfigSampler(PROFILES, seed=5).sample(TASK)
    c = ToolConfigSampler(PROFILES, seed=6).sample(TASK)
    assert a == b and a != c
    assert ToolConfigSampler(PROFILES).sample(TASK, 11) == ToolConfigSampler(
        PROFILES, seed=99
    ).sample(TASK, 11)


def test_preferences_are_valid_features():
    sampler = ToolConfigSampler(
        PROFILES, seed=2, ranges=SamplerRanges(tool_preference_probability=1)
    )
    for i in range(10):
        config = sampler.sample(Task(f"t{i}", "q", "a"))
        assert set(config.preference) <= set(config.feature_names())
        assert any(f.startswith("tool:") for f in config.preference)
        assert "preferences" in config.system_prompt()


def test_heldout_prices_lie_outside_training_ranges():
    ranges = SamplerRanges()
    base = {(p.tool, p.backend): p for p in PROFILES}
    held = fixed_eval_configs(PROFILES, ranges=ranges)
    assert set(held) == {"heldout_cheap", "heldout_expensive", "heldout_spread"}
    for config in held.values():
        for a in config.aliases:
            scale = a.price_out / base[(a.tool, a.backend)].price_out
            assert scale < ranges.price_scale[0] * 0.9 or scale > ranges.price_scale[1] * 1.1


def test_round_trip_and_validation():
    config = ToolConfigSampler(PROFILES, seed=3).sample(TASK)
    assert ToolConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    alias = ModelAlias("answer-1", "answer", "b", 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="no alias"):
        ToolConfig(aliases=(alias,))  # search has no alias
    with pytest.raises(ValueError, match="not available"):
        ToolConfig(aliases=(alias,), tools=("answer",), preference={"tool:x": 1.0})
    with pytest.raises(ValueError, match="unknown tool"):
        ToolConfig(aliases=(alias,), tools=("answer", "teleport"))
    with pytest.raises(KeyError, match="answer-1"):
        ToolConfig(aliases=(alias,), tools=("answer",)).alias("answer-9")
    config = ToolConfig(
        aliases=(alias,), tools=("answer", "python"), preference={"tool:python": -0.5}
    )
    assert [s["function"]["name"] for s in config.tool_schemas()] == ["answer", "python"]
    assert "avoiding python" in config.system_prompt()


def sampled_configs(randomize, seed):
    """Configurations of several tasks drawn as a GRPO run's sampler draws them from its config."""
    from experiments.configs import grpo_hle
    from orchestra_jax.training import builders, seeds

    config = grpo_hle.get_config("demo")
    config.tools.randomize = randomize
    sampler = SyntheticOrchestrationEnv(0, num_entities=20).tool_config_sampler(
        seed=seed, ranges=builders.sampler_ranges(config), **builders.tool_config_fields(config)
    )
    tasks = [Task(f"t{i}", "q", "a") for i in range(8)]
    return [
        sampler.sample(t, seeds.step_tool_config_seed(seed, 0, i)) for i, t in enumerate(tasks)
    ], sampler


def test_randomize_true_draws_a_configuration_per_task():
    configs, _ = sampled_configs(True, seed=0)
    assert len({json.dumps(c.tool_schemas()) + str(c.preference) for c in configs}) > 1


def test_randomize_false_gives_every_task_and_seed_the_nominal_configuration():
    configs, sampler = sampled_configs(False, seed=0)
    other_seed, _ = sampled_configs(False, seed=7)
    nominal = configs[0]
    assert all(c == nominal for c in configs + other_seed)  # one configuration for all
    assert nominal == sampler.nominal()
    offered = [p for p in PROFILES if p.tool in nominal.tools]
    assert [(a.tool, a.backend) for a in nominal.aliases] == [(p.tool, p.backend) for p in offered]
    for alias, profile in zip(nominal.aliases, offered):  # the catalogue's own prices
        assert (alias.price_in, alias.price_out) == (profile.price_in, profile.price_out)
    ranges = sampler.ranges
    assert nominal.preference == {
        "accuracy": 1.0,
        "cost": sum(ranges.cost_weight) / 2,
        "latency": sum(ranges.latency_weight) / 2,
    }
