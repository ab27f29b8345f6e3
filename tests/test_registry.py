"""The generic Registry, and that every registry-backed config field takes a module of one's own.

The plug-in test writes a temporary module with a reward, a policy loss, a
tool, a meta-tool and an environment, names each in one config line, and
checks that validation accepts them and the run's builders use them.
"""

import textwrap

import numpy as np
import pytest
from flax import nnx

from experiments.configs import grpo_hle
from orchestra_jax.config_section import ConfigError
from orchestra_jax.envs.environment import ENVIRONMENTS, Environment
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.registry import Registry, import_object, is_import_path
from orchestra_jax.rl.batching import BatchingConfig, build_train_batch
from orchestra_jax.rl.learner import Learner
from orchestra_jax.rollout.engine import ENGINES
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.experts.client import ExpertReply
from orchestra_jax.tools.sandbox.registry import SANDBOXES, sandbox_config_errors
from orchestra_jax.training import builders
from orchestra_jax.training.experiment_config import validate


def test_registry_names_import_paths_and_errors():
    parts = Registry("widget")
    parts.register("b", 2)

    @parts.register("a")
    def a():
        return 1

    assert parts.names() == ["a", "b"] and list(parts) == ["a", "b"] and len(parts) == 2
    assert parts.get("a") is a and "b" in parts and "c" not in parts
    assert parts.get("json:dumps") is import_object("json:dumps")  # any importable attribute
    assert parts.get("os.path:join.__name__") == "join"  # dotted attribute paths
    with pytest.raises(ValueError, match=r"unknown widget 'c'; choose one of \['a', 'b'\]"):
        parts.get("c")
    with pytest.raises(ValueError, match="cannot import 'no_such_module'"):
        parts.get("no_such_module:x")
    with pytest.raises(ValueError, match="has no attribute 'nothing'"):
        parts.get("json:nothing")
    assert parts.problem("a") is None and "unknown widget" in parts.problem("zzz")
    with pytest.raises(ValueError, match="already registered"):
        parts.register("a", 3)
    with pytest.raises(ValueError, match="no ':'"):
        parts.register("x:y", 3)
    assert is_import_path("a.b:c") and not is_import_path("abc") and not is_import_path("a:b:c")


def test_lazy_entries_import_on_first_use():
    parts = Registry("widget")
    parts.register_lazy("dumps", "json:dumps")
    assert parts.names() == ["dumps"] and "dumps" in parts
    import json

    assert parts.get("dumps") is json.dumps
    with pytest.raises(ValueError, match="not 'package.module:attr'"):
        parts.register_lazy("bad", "json.dumps")


def test_the_library_registries():
    assert {"jax", "sglang", "vllm", "scripted"} <= set(ENGINES.names())
    assert ENGINES.problem("vllm") is None  # imports without vLLM installed
    assert ENVIRONMENTS.names() == ["qa", "routed", "synthetic", "tau2"]
    assert SANDBOXES.names() == ["bwrap", "rlimits", "wasm"]
    assert sandbox_config_errors("rlimits", code_is_trusted=True) == []
    assert "got 'docker'" in sandbox_config_errors("docker", code_is_trusted=False)[0]
    assert isinstance(SyntheticOrchestrationEnv(0, num_entities=10), Environment)


PLUGIN = '''
import functools

import jax.numpy as jnp
import numpy as np

from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.rl.aggregation import aggregate
from orchestra_jax.tools.function_tools import FunctionTool
from orchestra_jax.tools.meta_tool_table import MetaToolSpec


def brevity(section):
    """A reward of one's own: right answers score 1 minus a token penalty."""

    def reward(features, correct, preference):
        del preference
        return np.asarray([float(c) * 0.5 for c in correct], np.float32)

    return reward


def plain_pg(logprobs, old_logprobs, advantages, loss_mask, config, *,
             importance_weights=None, denominator=None, segment_ids=None):
    """A policy loss of one's own: -A * ratio, no clipping."""
    ratio = jnp.exp(logprobs - old_logprobs)
    loss, total, denom = aggregate(-advantages[:, None] * ratio, loss_mask, config.agg,
                                   segment_ids=segment_ids, denominator=denominator)
    mask = loss_mask.astype(jnp.float32)
    return loss, {"loss_sum": total, "loss_denominator": denom,
                  "plugin_ratio": (ratio * mask).sum() / jnp.maximum(mask.sum(), 1.0)}


lookup = FunctionTool("lookup", "Look a word up.", {"word": {"type": "string"}},
                      lambda word: f"{word}: a word")

critique = MetaToolSpec(name="critique", alias_prefix="critic", role="critic",
                        role_prompt="You criticise answers.", description="Criticise the work.",
                        argument_wording="criticise")

BUILT = []


def small_world(inputs):  # envs/inputs.EnvInputs: the sections an environment reads
    BUILT.append(inputs.data.synthetic_seed)
    return SyntheticOrchestrationEnv(inputs.data.synthetic_seed, num_entities=20)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "lab_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    import lab_plugin

    return lab_plugin


def test_parts_from_ones_own_module_take_one_config_line_each(plugin):
    config = grpo_hle.get_config("micro")
    config.reward.type = "lab_plugin:brevity"
    config.rl.loss = "lab_plugin:plain_pg"
    config.tools.enabled = "search,enhance_reasoning,answer,lab_plugin:lookup"
    config.env.name = "lab_plugin:small_world"
    validate(config)

    reward = builders.build_reward(config)
    assert reward([{}, {}], [True, False], {}).tolist() == [0.5, 0.0]

    env = builders.build_env(config)
    assert plugin.BUILT == [config.data.synthetic_seed] and len(env.entities) == 20
    sampler = env.tool_config_sampler(seed=0, **builders.tool_config_fields(config))
    tool_config = sampler.sample(env.tasks("train", 1)[0])
    assert tool_config.tools[-1] == "lookup"
    assert "lookup" in [s["function"]["name"] for s in tool_config.tool_schemas()]
    tools = env.tools(tool_config)
    result = __import__("asyncio").run(
        tools["lookup"]({"word": "orchestra"}, ToolContext(task=env.tasks("train", 1)[0]))
    )
    assert result.text == "orchestra: a word"

    # The configured loss is the learner's: its own metric comes back from a step.
    learner_config = builders.build_learner_config(config, total_steps=config.num_steps)
    assert learner_config.loss == "lab_plugin:plain_pg"
    model = Qwen3ForCausalLM(Qwen3Config.preset("tiny", num_hidden_layers=1), rngs=nnx.Rngs(0))
    learner = Learner(model, learner_config)
    rng = np.random.default_rng(0)
    episodes = [
        type(
            "Episode",
            (),
            dict(
                token_ids=rng.integers(3, 250, 12).tolist(),
                loss_mask=[0] * 4 + [1] * 8,
                rollout_logprobs=[0.0] * 4 + [-6.0] * 8,
                advantage=float(a),
            ),
        )()
        for a in (1.0, -1.0)
    ] * 4
    batch = build_train_batch(
        episodes, config=BatchingConfig(seq_buckets=(16,), row_multiple=learner.row_multiple())
    )
    metrics = learner.train_step(batch)
    assert "plugin_ratio" in metrics and np.isfinite(metrics["loss"])


def test_a_meta_tool_is_one_table_entry(plugin):
    from orchestra_jax.tools.config import ModelAlias, ToolConfig
    from orchestra_jax.tools.enabled import enabled_tools
    from orchestra_jax.tools.registry import Backends, make_tools

    assert enabled_tools("answer,lab_plugin:critique") == ("answer", "critique")

    class Critic:
        async def complete(self, messages, *, max_tokens, temperature, ctx):
            assert messages[0]["content"] == "You criticise answers."
            return ExpertReply(
                "Too long.", prompt_tokens=1_000_000, completion_tokens=0, latency_s=0.5
            )

    aliases = [
        ModelAlias("answer-1", "answer", "critic-model", 1.0, 1.0, 1.0),
        ModelAlias("critic-1", "critique", "critic-model", 2.0, 2.0, 1.0),
    ]
    tool_config = ToolConfig(aliases=tuple(aliases), tools=("answer", "critique"))
    schema = tool_config.tool_schemas()[1]["function"]
    assert schema["name"] == "critique" and "The model used to criticise." in str(schema)
    tools = make_tools(tool_config, Backends(experts={"critic-model": Critic()}))
    task = SyntheticOrchestrationEnv(0, num_entities=10).tasks("train", 1)[0]
    result = __import__("asyncio").run(
        tools["critique"]({"model": "critic-1"}, ToolContext(task=task))
    )
    assert result.text == "Too long." and result.cost_usd == pytest.approx(2.0)
    assert result.final_answer is None


def test_bad_import_paths_are_config_errors(plugin):
    config = grpo_hle.get_config("micro")
    config.reward.type = "lab_plugin:nothing"
    config.rl.loss = "no_such_lab:loss"
    config.env.name = "lab_plugin:nothing_either"
    config.tools.enabled = "search,answer,lab_plugin:BUILT"
    with pytest.raises(ConfigError) as e:
        validate(config)
    message = str(e.value)
    for needle in ("reward.type", "rl.loss", "env.name", "tools.enabled", "no_such_lab"):
        assert needle in message
