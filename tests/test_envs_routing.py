"""Several environments in one run: every task is played and graded by the one it names."""

import asyncio
import json

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.config_section import ConfigError
from orchestra_jax.envs.inputs import make_env
from orchestra_jax.envs.routing import RoutedEnvironment
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.tasks import Task
from orchestra_jax.training.experiment_config import validate
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes

TOK = load_tokenizer("demo")


def call(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class Recording(SyntheticOrchestrationEnv):
    """The synthetic world, noting which tasks it was asked about."""

    def __init__(self):
        super().__init__(0, num_entities=10)
        self.seen = []

    def reset(self, task):
        self.seen.append(task.id)


def test_tasks_go_to_the_environment_they_name_and_the_rest_to_the_default():
    default, other = Recording(), Recording()
    env = RoutedEnvironment({"synthetic": default, "other": other})
    plain = default.tasks("train", 1)[0]
    named = Task(id="o1", question="q", answer="a", metadata={"env": "other"})
    assert env.route(plain) == "synthetic" and env.route(named) == "other"
    env.reset(plain), env.reset(named)
    assert default.seen == [plain.id] and other.seen == ["o1"]
    sampler = env.tool_config_sampler(seed=0, tools=("search", "answer"))
    assert sampler.sample(plain, 3) == default.tool_config_sampler(
        seed=0, tools=("search", "answer")
    ).sample(plain, 3)
    with pytest.raises(ValueError, match="names environment 'tau9'"):
        env.route(Task(id="x", question="q", answer="a", metadata={"env": "tau9"}))
    with pytest.raises(ValueError, match="pass task="):
        env.tools(sampler.sample(plain, 0))


def _config(tau2_data):
    config = grpo_hle.get_config("tau2_demo")
    config.env.name = "routed"
    config.env.members = "synthetic,tau2"
    config.env.tau2.data_dir = str(tau2_data)
    config.data.sources = "synthetic:1,tau2:1"
    config.data.paths.tau2 = str(tau2_data / "tau2" / "domains" / "retail")
    config.data.eval_fraction = 0.3  # held-out τ² tasks (data/splits.py)
    config.data.synthetic_num_entities = 20
    config.tools.enabled = "search,enhance_reasoning,answer"
    return config


def test_one_run_mixes_qa_tasks_and_tau2_conversations(tau2_data):
    from orchestra_jax.training import builders

    config = _config(tau2_data)
    validate(config)
    # Either split of the run's sources (the domain file is split by data.eval_fraction).
    tasks = [
        task
        for split in ("train", "heldout")
        for source in builders.build_task_sources(config, split)[0]
        for task in source.tasks
    ]
    qa = next(t for t in tasks if t.domain != "retail")
    conversation = next(t for t in tasks if t.id == "tau2/retail/70")
    env = make_env(builders.env_inputs(config))
    assert isinstance(env, RoutedEnvironment) and env.route(conversation) == "tau2"
    sampler = env.tool_config_sampler(seed=0, **builders.tool_config_fields(config))
    configs = [sampler.sample(qa, 0), sampler.sample(conversation, 0)]
    assert configs[0].tools == ("search", "enhance_reasoning", "answer") and configs[1].tools == ()
    [action] = conversation.metadata["tau2_task"]["evaluation_criteria"]["actions"]
    plans = {
        qa.id: [call("answer", {"model": configs[0].aliases_for("answer")[0].alias})],
        conversation.id: [call(action["name"], action["arguments"]), "That is $22.55."],
    }

    def policy(ids, request):
        task_id, _, turn = request.request_id.rsplit("/", 2)
        plan = plans[task_id]
        return TOK.encode(plan[min(int(turn), len(plan) - 1)]) + [TOK.im_end_id]

    how = Episodes(
        env=env,
        engine=ScriptedEngine(policy),
        tokenizer=TOK,
        sampling=SamplingParams(),
        limits=LoopLimits(max_turns=4, max_context_tokens=32768, enable_thinking=False),
    )
    qa_traj, talk = asyncio.run(run_graded_episodes([qa, conversation], configs, how, seed=0))
    assert qa_traj.finish_reason == "answer" and qa_traj.correct is not None
    assert "grade" not in qa_traj.metadata  # graded from its answer
    assert talk.finish_reason == "conversation" and talk.metadata["grade"]["breakdown"]["DB"] == 1.0
    assert talk.correct


def test_config_mistakes_of_the_tau2_and_routed_sections_are_listed(tau2_data):
    config = _config(tau2_data)
    config.env.members = "synthetic,tau2,tau3"
    config.env.tau2.user = "robot"
    config.env.tau2.meta_tools = "search"
    with pytest.raises(ConfigError) as e:
        validate(config)
    message = str(e.value)
    assert "env.members" in message and "'tau3'" in message
    assert "env.tau2.user must be one of" in message
    assert "env.tau2.meta_tools: only 'ask_expert'" in message
    assert "env.tau2.meta_tools needs env.tau2.expert_url" in message
    config = grpo_hle.get_config("tau2_demo")
    config.env.tau2.data_dir = str(tau2_data)
    config.eval.baselines = "always_strongest"
    with pytest.raises(ConfigError, match="does not play 'tau2' episodes"):
        validate(config)
    config.eval.baselines = "expert_strongest"
    with pytest.raises(ConfigError, match="set env.tau2.meta_tools=ask_expert"):
        validate(config)
