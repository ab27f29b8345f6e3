"""The "qa" environment with live experts over real HTTP (the project's server with a
scripted engine): what the experts are sent, what each call costs, failures as
observations, and start-up errors."""

import asyncio
import collections
import copy
import json

import pytest
import yaml

from experiments.configs import grpo_hle
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.config_section import ConfigError
from orchestra_jax.envs.qa import QAEnvironment
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.envs.synthetic_models import MODEL_PROFILES
from orchestra_jax.eval.routers import RouterEngine
from orchestra_jax.eval.summary import summarize
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import serve_in_thread
from orchestra_jax.tools import build_index, pricing
from orchestra_jax.tools.base import ToolContext
from orchestra_jax.tools.experts.catalogue import load_catalogue
from orchestra_jax.tools.experts.client import OpenAIChatExpert
from orchestra_jax.training import builders
from orchestra_jax.training.rollouts import Episodes, episode_metrics, run_graded_episodes
from tests.live_helpers import RecordingProxy

CANARY = "zq-gold-{}-canary"  # answers no expert could write unless it was sent them


def expert_reply(tokenizer):
    """A scripted expert that acts its role, read from the role prompt it is sent."""

    def policy(ids, request):
        prompt = tokenizer.decode(ids)
        if "You write search queries" in prompt:
            text = "glaciers valleys"
        elif "You write Python code" in prompt:
            text = "```python\nprint(6 * 7)\n```"
        else:
            text = "The documents say so.\nFinal answer: a river"
        return tokenizer.encode(text) + [tokenizer.im_end_id]

    return policy


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Expert and judge servers (the project's, scripted engines) behind recording
    proxies, an index of the live_tiny corpus, and a config of the qa env on them."""
    tmp = tmp_path_factory.mktemp("qa")
    tokenizer = load_tokenizer("demo")
    experts = serve_in_thread(ScriptedEngine(expert_reply(tokenizer)), tokenizer=tokenizer)
    verdict = tokenizer.encode("<correct>False</correct>") + [tokenizer.im_end_id]
    judge = serve_in_thread(ScriptedEngine(lambda ids, r: verdict), tokenizer=tokenizer)
    expert_proxy = RecordingProxy(experts.url)
    build_index.main(
        [
            "--corpus",
            f"{grpo_hle.REPO_DIR}/experiments/data/live_tiny_corpus.jsonl",
            "--out",
            str(tmp / "idx"),
        ]
    )
    catalogue = yaml.safe_load(open(grpo_hle.LOCAL_CATALOGUE))
    for model in catalogue["models"]:
        model["base_url"] = expert_proxy.url + "/v1"
    (tmp / "models.yaml").write_text(yaml.safe_dump(catalogue))
    rows = [
        {
            "id": f"wiki____{i}",
            "question": f"Which river carved valley {i}?",
            "answer": CANARY.format(i),
        }
        for i in range(8)
    ]
    (tmp / "frames.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = grpo_hle.get_config("live_tiny")
    config.workdir = str(tmp / "run")
    config.tools.catalogue = str(tmp / "models.yaml")
    config.tools.search_index = str(tmp / "idx")
    config.data.paths.frames = str(tmp / "frames.jsonl")
    config.reward.judge.base_url = judge.url + "/v1"
    config.reward.judge.max_tokens = 32
    yield config, tokenizer, expert_proxy, rows
    expert_proxy.close()
    experts.stop()
    judge.stop()


def play(config, tokenizer, router="always_cheapest", *, env=None):
    env = env or builders.build_env(config)
    tasks = env.tasks("heldout", 4) + env.tasks("train", 4)
    sampler = env.tool_config_sampler(
        seed=1, ranges=builders.sampler_ranges(config), **builders.tool_config_fields(config)
    )
    configs = [sampler.sample(t) for t in tasks]
    how = Episodes(
        env=env,
        tokenizer=tokenizer,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=64),
        limits=builders.loop_limits(config),
        engine=RouterEngine(router, tokenizer, {t.id: c for t, c in zip(tasks, configs)}),
        judge=builders.build_judge(config, None),
    )
    trajectories = asyncio.run(run_graded_episodes(tasks, configs, how, seed=0))
    return tasks, configs, trajectories


def expected_cost(result, alias, tool_config):
    """The call's usage x its alias's price, plus the search and code terms."""
    meta = result.metadata
    cost = pricing.token_cost(
        meta["prompt_tokens"], meta["completion_tokens"], alias.price_in, alias.price_out
    )
    if meta["tool"] == "search":
        cost += pricing.search_cost(
            len(meta["doc_ids"]),
            tool_config.search_price_per_query,
            tool_config.search_price_per_document,
        )
    if meta["tool"] == "enhance_reasoning":
        cost += pricing.code_cost(meta["code_seconds"], tool_config.code_price_per_s)
    return cost


def test_live_experts_cost_usage_times_price_and_never_see_the_gold(live):
    config, tokenizer, proxy, rows = live
    before = len(proxy.chat_records())
    tasks, configs, trajectories = play(config, tokenizer)
    records = proxy.chat_records()[before:]
    assert len(records) == 3 * len(tasks)  # search, enhance_reasoning, answer each
    for record in records:
        sent = json.dumps(record["request"])
        assert all(CANARY.format(i) not in sent for i in range(len(rows)))
    usage = collections.Counter(
        (r["response"]["usage"]["prompt_tokens"], r["response"]["usage"]["completion_tokens"])
        for r in records
    )
    seen = collections.Counter()
    for traj, tool_config in zip(trajectories, configs):
        assert traj.finish_reason == "answer" and traj.final_answer == "a river"
        for turn in traj.turns:
            for result in turn.tool_results:
                assert result.error is None, result.text
                alias = tool_config.alias(result.metadata["model"])
                assert result.metadata["backend"] == alias.backend
                assert result.cost_usd == pytest.approx(expected_cost(result, alias, tool_config))
                seen[(result.metadata["prompt_tokens"], result.metadata["completion_tokens"])] += 1
    assert seen == usage  # every recorded call's usage is one the server reported
    # The cheapest plan picks the cheapest alias of each tool in its own task's prices.
    for traj, tool_config in zip(trajectories, configs):
        models = [r.metadata["model"] for turn in traj.turns for r in turn.tool_results]
        cheapest = [
            min(tool_config.aliases_for(t), key=lambda a: (a.price_out, a.price_in)).alias
            for t in ("search", "enhance_reasoning", "answer")
        ]
        assert models == cheapest


def test_a_failing_expert_ends_the_episode_as_the_experts_failure_counted_in_metrics(live):
    config, tokenizer, proxy, _ = live
    env = builders.build_env(config)
    failing = RecordingProxy("http://127.0.0.1:9")  # failure injection: every call is a 500
    for client in env.experts.values():
        client.url = failing.url + "/v1/chat/completions"
        client.retries, client.backoff_s = 1, 0.01
    _, _, trajectories = play(config, tokenizer, "direct_strongest", env=env)
    assert {r["status"] for r in failing.records} == {500}
    calls = sum(len(turn.tool_results) for t in trajectories for turn in t.turns)
    assert calls == len(trajectories)  # the first failed call ends the episode
    assert len(failing.records) == 2 * calls  # each call retried once
    failing.close()
    for traj in trajectories:
        [result] = traj.turns[0].tool_results
        assert result.metadata["expert_failed"] and "failed after 2 attempt(s)" in result.text
        assert traj.final_answer is None and traj.cost_usd == traj.orchestrator_cost_usd
        assert traj.finish_reason == "error" and traj.infra_failure == result.infra_failure
        assert traj.infra_failure.kind == "expert"
        assert traj.infra_failure.endpoint == failing.url + "/v1/chat/completions"
    metrics = episode_metrics(trajectories, [0.0] * len(trajectories), [True] * len(trajectories))
    assert metrics["expert_errors"] >= 1 and metrics["tool_errors"] >= metrics["expert_errors"]
    for t in trajectories:
        t.correct = False
    assert summarize(trajectories)["expert_errors"] == metrics["expert_errors"]


def test_an_unreachable_expert_endpoint_is_one_clear_error_at_start_up(live, tmp_path):
    config, *_ = live
    catalogue = yaml.safe_load(open(config.tools.catalogue))
    catalogue["models"][1]["base_url"] = "http://127.0.0.1:9/v1"
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(catalogue))
    broken = grpo_hle.get_config("live_tiny")
    broken.update_from_flattened_dict(
        {
            "tools.catalogue": str(tmp_path / "models.yaml"),
            "tools.search_index": config.tools.search_index,
        }
    )
    with pytest.raises(ConfigError) as e:
        builders.build_env(broken)
    message = str(e.value)
    assert "expert endpoint of 'tiny-medium': http://127.0.0.1:9/v1 is unreachable" in message
    assert "\n" not in message and "tiny-large" not in message


def test_simulated_experts_answer_synthetic_tasks_beside_live_ones(live):
    """tools.backends="live,answer=offline" on synthetic data: the sampler offers the
    simulated answer models and the catalogue's search and reasoning models."""
    config, tokenizer, proxy, _ = live
    catalogue = load_catalogue(config.tools.catalogue)
    profiles = [p for p in MODEL_PROFILES if p.tool == "answer"]
    profiles += catalogue.profiles(["search", "enhance_reasoning"])
    experts = {
        m.name: OpenAIChatExpert(m.base_url, m.model, api_key_env=None) for m in catalogue.models
    }
    env = QAEnvironment(
        profiles,
        experts,
        offline_backends=sorted({p.backend for p in profiles if p.tool == "answer"}),
        load_tasks=lambda split: SyntheticOrchestrationEnv(0, num_entities=20).tasks(split, 4),
    )
    sampled = env.tool_config_sampler(seed=0).sample(env.tasks("train", 1)[0])
    assert {a.backend for a in sampled.aliases_for("answer")} <= {p.backend for p in profiles[:3]}
    assert {a.backend for a in sampled.aliases_for("search")} <= set(experts)
    tools = env.tools(sampled)
    task = env.tasks("train", 1)[0]
    alias = sampled.aliases_for("answer")[0].alias
    before = len(proxy.chat_records())
    result = asyncio.run(tools["answer"]({"model": alias}, ToolContext(task=task)))
    assert result.final_answer and len(proxy.chat_records()) == before  # simulated: no HTTP


@pytest.mark.parametrize(
    ("pricing_name", "mode"), [("per_document", "per_document"), ("reference", "local")]
)
def test_the_search_is_priced_as_tools_search_pricing_says(live, pricing_name, mode):
    config, tokenizer, _, _ = live
    config = copy.deepcopy(config)
    config.tools.search_pricing = pricing_name
    charge = builders.build_env(config).build_backends().search_charge
    assert charge.mode == mode  # a local index under "reference": the query's tokens
    if mode == "local":
        tool_config = type("C", (), {"orchestrator_price": 0.2})()
        assert charge.cost("river valley", 30, tool_config) == pytest.approx(
            len(load_tokenizer(config.tokenizer).encode("river valley")) * 0.2 / 1e6
        )
