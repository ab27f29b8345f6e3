"""End to end on the live path, over real HTTP: the project's server
(`python -m orchestra_jax.rollout.server`, a random tiny Qwen3) plays every expert
and the judge; `live_tiny` runs two GRPO steps and its evaluations on FRAMES rows
from ../shared, with a BM25 index built from the shipped corpus; then HLE rows are
evaluated with the baseline routers; and `live_tiny` trains a GRPO step with the
reference's rebuilt prompts and turn samples. Recording proxies in front of the
server see every request. Skipped, saying why, without ../shared/reference/frames.jsonl.
"""

import collections
import json
import math
import os
import re

import pytest
import yaml

from experiments.configs import grpo_hle
from experiments.evaluate import evaluate_policies
from orchestra_jax.agent.trajectory import read_jsonl
from orchestra_jax.data.config import DataConfig
from orchestra_jax.data.splits import load_split
from orchestra_jax.rewards.outcome import normalize_answer
from orchestra_jax.rl.samples import turn_samples
from orchestra_jax.tools import build_index, pricing
from orchestra_jax.training import builders, experiment, grpo_loop, loop_steps, seeds
from orchestra_jax.training.experiment import run_experiment
from orchestra_jax.training.experiment_config import validate
from tests.live_helpers import (
    RecordingProxy,
    free_port,
    start_server,
    wait_until_serving,
)
from tests.test_training_e2e import NoiseReward

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory, shared_file):
    frames = shared_file("reference/frames.jsonl")
    tmp = tmp_path_factory.mktemp("live")
    port = free_port()
    server = start_server(port, log_path=str(tmp / "server.log"))
    proxies = []
    try:
        corpus = os.path.join(grpo_hle.REPO_DIR, "experiments", "data", "live_tiny_corpus.jsonl")
        build_index.main(["--corpus", corpus, "--out", str(tmp / "index")])
        url = f"http://127.0.0.1:{port}"
        wait_until_serving(url, server)
        experts, judge = RecordingProxy(url), RecordingProxy(url)
        proxies += [experts, judge]
        catalogue = yaml.safe_load(open(grpo_hle.LOCAL_CATALOGUE))
        for model in catalogue["models"]:
            model["base_url"] = experts.url + "/v1"
        (tmp / "models.yaml").write_text(yaml.safe_dump(catalogue))

        def config(workdir):
            c = grpo_hle.get_config("live_tiny")
            c.workdir = str(workdir)
            c.tools.catalogue = str(tmp / "models.yaml")
            c.tools.search_index = str(tmp / "index")
            c.data.paths.frames = str(frames)
            c.reward.judge.base_url = judge.url + "/v1"
            return c

        yield {"config": config, "experts": experts, "judge": judge, "tmp": tmp}
    finally:
        for proxy in proxies:
            proxy.close()
        server.terminate()
        server.wait(timeout=60)


@pytest.fixture(scope="module")
def live_run(stack):
    config = stack["config"](stack["tmp"] / "run")
    validate(config)
    summaries = run_experiment(config)
    return config, summaries


def trajectories_by_file(workdir):
    folder = os.path.join(workdir, "trajectories")
    return {name: read_jsonl(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}


def test_two_grpo_steps_and_an_evaluation_served_over_http(live_run, stack):
    config, summaries = live_run
    workdir = config.workdir
    steps = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [m["step"] for m in steps] == [1, 2]
    assert all("expert_errors" in m and "tool_errors" in m and "judge/calls" in m for m in steps)
    for policy in ("warm_start", "grpo", "direct_strongest", "always_cheapest"):
        summary = json.load(open(os.path.join(workdir, f"eval_{policy}.json")))
        for key in ("accuracy", "mean_cost_usd", "mean_latency_s", "tool_call_mix"):
            assert key in summary
        assert summary["data"][0]["source"] == "frames" and summary["expert_errors"] == 0
    assert summaries["always_cheapest"]["mean_cost_usd"] > 0
    assert "| always_cheapest |" in open(os.path.join(workdir, "eval_report.md")).read()
    assert os.path.getsize(os.path.join(workdir, "eval_pareto.png")) > 0
    expert_calls, judge_calls = stack["experts"].chat_records(), stack["judge"].chat_records()
    assert expert_calls and judge_calls
    assert {r["status"] for r in expert_calls + judge_calls} == {200}
    assert {r["request"]["model"] for r in expert_calls} <= {
        "tiny-large",
        "tiny-medium",
        "tiny-small",
    }
    assert {r["request"]["model"] for r in judge_calls} == {"tiny-judge"}
    assert all("Reference answer:" in r["request"]["messages"][0]["content"] for r in judge_calls)


def tool_configs_of(config, files):
    """file name -> {(task id, group index): the ToolConfig that episode ran with},
    rebuilt from the config's seeds as the run drew them."""
    env = builders.build_env(config)
    sampler = env.tool_config_sampler(
        seed=config.seed,
        ranges=builders.sampler_ranges(config),
        **builders.tool_config_fields(config),
    )
    heldout = experiment.heldout_tool_configs(config, env, experiment.eval_tasks(config))
    data = DataConfig.from_config(config.data)
    tasks = {t.id: t for s in load_split(data, "train", config.eval.num_tasks)[0] for t in s.tasks}
    out = {}
    for name, trajectories in files.items():
        if name.startswith("eval_"):
            out[name] = {(t.task_id, t.group_index): heldout[t.task_id] for t in trajectories}
        else:  # step_00000N.jsonl: task i of the step has configuration seed (seed, step, i)
            step = int(name[len("step_") : -len(".jsonl")]) - 1
            out[name] = {
                (t.task_id, t.group_index): sampler.sample(
                    tasks[t.task_id],
                    seeds.step_tool_config_seed(config.seed, step, i // config.rl.group_size),
                )
                for i, t in enumerate(trajectories)
            }
    return out


def test_each_call_costs_its_usage_times_its_alias_price(live_run, stack):
    config, _ = live_run
    files = trajectories_by_file(config.workdir)
    configs = tool_configs_of(config, files)
    usage, checked = collections.Counter(), 0
    for name, trajectories in files.items():
        for traj in trajectories:
            tool_config = configs[name][(traj.task_id, traj.group_index)]
            for turn in traj.turns:
                for result in turn.tool_results:
                    meta = result.metadata
                    if "prompt_tokens" not in meta:
                        continue  # a malformed call: no model was asked
                    alias = tool_config.alias(meta["model"])
                    cost = pricing.token_cost(
                        meta["prompt_tokens"],
                        meta["completion_tokens"],
                        alias.price_in,
                        alias.price_out,
                    )
                    if meta["tool"] == "search":
                        cost += pricing.search_cost(
                            len(meta["doc_ids"]),
                            tool_config.search_price_per_query,
                            tool_config.search_price_per_document,
                        )
                    if meta["tool"] == "enhance_reasoning":
                        cost += pricing.code_cost(
                            meta["code_seconds"], tool_config.code_price_per_s
                        )
                    assert result.cost_usd == pytest.approx(cost, rel=1e-9, abs=1e-15)
                    usage[(meta["prompt_tokens"], meta["completion_tokens"])] += 1
                    checked += 1
    served = collections.Counter(
        (r["response"]["usage"]["prompt_tokens"], r["response"]["usage"]["completion_tokens"])
        for r in stack["experts"].chat_records()
    )
    assert checked and usage == served  # every expert call over HTTP, each priced


def test_no_gold_answer_appears_in_any_expert_request(live_run, stack, shared_file):
    rows = [json.loads(line) for line in open(shared_file("reference/frames.jsonl"))]
    answer_of = {row["question"].strip(): row["answer"] for row in rows}
    checked = 0
    for record in stack["experts"].chat_records():
        user = record["request"]["messages"][-1]["content"]
        question = user.split("\n\n")[0].removeprefix("Task: ").strip()
        gold = normalize_answer(answer_of[question])
        sent = normalize_answer(json.dumps(record["request"]))
        if len(gold) >= 3:  # "2" or "87" could be any number the tiny models write
            assert not re.search(rf"(?<!\w){re.escape(gold)}(?!\w)", sent), (gold, record)
            checked += 1
    assert checked


def test_hle_rows_evaluate_with_categories_and_skipped_images(stack):
    tmp = stack["tmp"]
    rows = [
        {
            "id": "h1",
            "question": "What is 6 x 7?",
            "answer": "42",
            "answer_type": "exactMatch",
            "category": "Math",
        },
        {
            "id": "h2",
            "question": "Which option?",
            "answer": "B",
            "answer_type": "multipleChoice",
            "category": "Biology",
        },
        {
            "id": "h3",
            "question": "Name the gene.",
            "answer": "BRCA1",
            "answer_type": "exactMatch",
            "category": "Biology",
        },
        {
            "id": "h4",
            "question": "Read the plot.",
            "answer": "3",
            "answer_type": "exactMatch",
            "category": "Math",
            "image": "data:image/png;base64,AAAA",
        },
    ]
    (tmp / "hle.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = stack["config"](tmp / "hle_eval")
    config.data.sources = "hle"
    config.data.paths.hle = str(tmp / "hle.jsonl")
    config.data.eval_fraction = 1.0  # every question is held out: an evaluation-only config
    config.eval.num_tasks = 8
    validate(config)
    summaries = evaluate_policies(config, ["direct_strongest"])
    summary = summaries["direct_strongest"]
    assert summary["num_episodes"] == 3
    [data] = summary["data"]
    assert (data["rows"], data["skipped"], data["split_tasks"]) == (4, 1, 3)
    assert set(summary["by_category"]) == {"Math", "Biology"}
    report = open(tmp / "hle_eval" / "eval_report.md").read()
    assert "Per category" in report and "| Biology | Math |" in report
    assert "| hle |" in report and (tmp / "hle_eval" / "eval_pareto.png").exists()


def test_live_tiny_trains_turn_samples_of_rebuilt_prompts(stack):
    """The reference's context and samples on the live path: each turn's prompt is
    rebuilt from the task (never the policy's own turns), each turn is a sample, and
    mini-batches of 2 samples make ⌈N / 2⌉ updates. A seeded random reward gives
    every group a ranking (a random policy answers nothing right)."""
    config = stack["config"](stack["tmp"] / "rebuild")
    config.agent.context = "rebuild"
    config.rl.sample_unit = "turn"
    config.rl.minibatch_size = 2
    config.rl.share_prompts = False  # rows are samples
    config.rl.warmup_steps = 0  # the number of updates varies from step to step
    config.num_steps = 1
    validate(config)
    run = loop_steps.setup_run(config)
    run.reward_fn = NoiseReward()
    try:
        grpo_loop.grpo_train(run)
    finally:
        run.engine.close()
    [line] = [json.loads(x) for x in open(os.path.join(config.workdir, "metrics.jsonl"))]
    [trajs] = trajectories_by_file(config.workdir).values()
    samples = turn_samples([t for t in trajs if t.advantage])  # live_tiny keeps every group
    assert line["learner/samples"] == len(samples) > 0
    assert line["learner/updates"] == math.ceil(len(samples) / 2)
    assert line["learner/skipped"] == 0
    rebuilt = [t for t in trajs if len(t.turns) > 1]
    assert rebuilt, "no episode reached a second turn"
    for traj in rebuilt:
        first, second = traj.turns[:2]
        assert second.prompt_start == first.prompt_tokens + first.num_generated_tokens
        prompt = run.tokenizer.decode(
            traj.token_ids[second.prompt_start : second.prompt_start + second.prompt_tokens]
        )
        assert prompt.count("Problem: ") == 1 and "Choose an approriate tool." in prompt
        assert first.text not in prompt  # never its own turns
