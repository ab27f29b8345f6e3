"""`eval.protocol`: "paper" (the reference release's evaluation) and "heldout" (the
project's), asserted from what the orchestrator's engine, the experts and the judge
are sent: a recording scripted engine, and the project's server (scripted engines)
behind recording proxies on loopback."""

import asyncio
import dataclasses
import json
import re

import pytest
import yaml

from experiments.configs import grpo_hle
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.eval.config import EvalConfig
from orchestra_jax.eval.routers import parse_request_id, tool_call_text
from orchestra_jax.rewards import judge as judge_lib
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.rollout.server.app import serve_in_thread
from orchestra_jax.tasks import Task
from orchestra_jax.tools import build_index
from orchestra_jax.tools.config import SYSTEM_PROMPT_HEAD
from orchestra_jax.training import builders, experiment, experiment_config
from orchestra_jax.training.eval_protocols import EVAL_PROTOCOLS, EvalProtocol
from orchestra_jax.training.evaluation import eval_tool_configs
from tests.live_helpers import RecordingProxy


def check_eval(config):
    """The eval section's problems and the rules between it and the other sections."""
    section = EvalConfig.unchecked(config.eval)
    return (
        section.problems()
        + experiment_config._eval_protocol(config, section)
        + experiment_config._eval_baselines(config, section)
    )


# question -> (gold answer, what the answering expert says). The first matches the gold
# in lower case; the second only after normalisation (articles dropped), so the paper's
# grading asks the judge and the project's does not; the orchestrator never calls a
# tool on the third, so its episode runs to the turn limit.
ROWS = {
    "Which city is the capital of France?": ("Paris", "PARIS"),
    "Which band recorded Abbey Road?": ("The Beatles", "Beatles"),
    "Loop: what is never answered?": ("nothing", ""),
}
TABLE_ROW = re.compile(r"^(\S+) \| \$+(\S+) \| \$+(\S+) \| (\S+)s$", re.MULTILINE)


def expert_reply(tokenizer):
    def policy(ids, request):
        prompt = tokenizer.decode(ids)
        said = next((said for q, (_, said) in ROWS.items() if q in prompt), "?")
        return tokenizer.encode(f"Final answer: {said}") + [tokenizer.im_end_id]

    return policy


def orchestrator(tokenizer):
    """Answers with answer-1 at once, except on the looping question: no call at all."""

    def policy(ids, request):
        if "Loop:" in tokenizer.decode(ids):
            return tokenizer.encode("Let me think.") + [tokenizer.im_end_id]
        return tokenizer.encode(tool_call_text("answer", {"model": "answer-1"})) + [
            tokenizer.im_end_id
        ]

    return policy


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Experts and judge (scripted, the project's server) behind recording proxies, a
    copy of models_paper.yaml pointing every model at them, FRAMES-like rows."""
    tmp = tmp_path_factory.mktemp("protocol")
    tokenizer = load_tokenizer("demo")
    experts = serve_in_thread(ScriptedEngine(expert_reply(tokenizer)), tokenizer=tokenizer)
    verdict = tokenizer.encode("<correct>False</correct>") + [tokenizer.im_end_id]
    judge = serve_in_thread(ScriptedEngine(lambda ids, r: verdict), tokenizer=tokenizer)
    expert_proxy, judge_proxy = RecordingProxy(experts.url), RecordingProxy(judge.url)
    build_index.main(
        [
            "--corpus",
            f"{grpo_hle.REPO_DIR}/experiments/data/live_tiny_corpus.jsonl",
            "--out",
            str(tmp / "idx"),
        ]
    )
    catalogue = yaml.safe_load(open(grpo_hle.PAPER_CATALOGUE))
    for model in catalogue["models"]:  # endpoints and keys only: the table stays the paper's
        model["base_url"] = expert_proxy.url + "/v1"
        model["api_key_env"] = None
    (tmp / "models_paper_loopback.yaml").write_text(yaml.safe_dump(catalogue))
    rows = [
        {"id": f"wiki____{i}", "question": q, "answer": gold}
        for i, (q, (gold, _)) in enumerate(ROWS.items())
    ]
    (tmp / "frames.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield {
        "tmp": tmp,
        "tokenizer": tokenizer,
        "experts": expert_proxy,
        "judge": judge_proxy,
        "judge_url": judge.url,
    }
    expert_proxy.close()
    judge_proxy.close()
    experts.stop()
    judge.stop()


def live_config(stack, protocol, workdir):
    tmp = stack["tmp"]
    config = grpo_hle.get_config("live_tiny")
    config.eval.protocol = protocol
    config.workdir = str(tmp / workdir)
    config.tools.catalogue = str(tmp / "models_paper_loopback.yaml")
    config.tools.search_index = str(tmp / "idx")
    config.data.paths.frames = str(tmp / "frames.jsonl")
    config.data.eval_fraction = 1.0
    config.eval.num_tasks = len(ROWS)
    config.reward.judge.base_url = stack["judge"].url + "/v1"
    config.reward.judge.max_tokens = 32
    # Fifty turns of a scripted policy: room in the context (no model behind it).
    config.agent.max_context_tokens = config.rollout.max_seq_len = 65536
    assert check_eval(config) == []
    return config


def evaluate(stack, protocol):
    """Builds the test as experiments/evaluate.py does and plays it with a recording
    scripted orchestrator; returns (config, evaluator, summary, engine, expert and
    judge requests, trajectories by question)."""
    config = live_config(stack, protocol, protocol)
    tokenizer = stack["tokenizer"]
    judge = builders.build_judge(config, None)
    evaluator = experiment.build_evaluator(config, None, tokenizer, judge)
    engine = ScriptedEngine(orchestrator(tokenizer))
    experts_before = len(stack["experts"].chat_records())
    judge_before = len(stack["judge"].chat_records())
    summary = experiment.evaluate(evaluator, "scripted", engine)
    with open(f"{config.workdir}/trajectories/eval_scripted.jsonl") as f:
        trajectories = [json.loads(line) for line in f]
    questions = {t.id: t.question for t in evaluator.tasks}
    return (
        config,
        evaluator,
        summary,
        engine,
        stack["experts"].chat_records()[experts_before:],
        stack["judge"].chat_records()[judge_before:],
        {questions[t["task_id"]]: t for t in trajectories},
    )


def requests_per_episode(engine):
    counts = {}
    for request in engine.requests:
        task_id, group, _ = parse_request_id(request.request_id)
        counts[(task_id, group)] = counts.get((task_id, group), 0) + 1
    return counts


def table_rows(schemas):
    """alias -> (price in, price out, latency) from the price tables of tool schemas."""
    out = {}
    for schema in schemas:
        doc = schema["function"]["parameters"]["properties"]["model"]["description"]
        out.update({m[0]: tuple(map(float, m[1:])) for m in TABLE_ROW.findall(doc)})
    return out


def test_paper_protocol_sends_the_fixed_table_at_temperature_one_for_fifty_rounds(stack):
    config, evaluator, summary, engine, expert_calls, judge_calls, by_question = evaluate(
        stack, "paper"
    )
    tokenizer = stack["tokenizer"]
    # The fixed table: every task the same, the catalogue's models at its own prices.
    [table] = {json.dumps(c.to_dict(), sort_keys=True) for c in evaluator.tool_configs.values()}
    table = evaluator.tool_configs[evaluator.tasks[0].id]
    assert table.name == "catalogue" and table.preference == {"accuracy": 1.0}
    assert table_rows(table.tool_schemas())["answer-1"] == (1.25, 10.0, 96.0)
    assert len(table.aliases) == 12
    # What the orchestrator's engine received: sampled at 1.0, seeded, one seed per turn.
    assert engine.requests
    assert {r.sampling.temperature for r in engine.requests} == {1.0}
    seeds = [r.sampling.seed for r in engine.requests]
    assert None not in seeds and len(set(seeds)) == len(seeds)
    prompt = tokenizer.decode(engine.requests[0].input_ids)
    assert "answer-1 | $1.25 | $10 | 96s" in prompt and "search-3 | $0.8 | $0.8 | 8s" in prompt
    assert "preference" not in prompt.lower() and SYSTEM_PROMPT_HEAD in prompt
    # The release's tool order: enhance_reasoning, answer, search.
    positions = [prompt.index(f'"name": "{t}"') for t in ("enhance_reasoning", "answer", "search")]
    assert positions == sorted(positions)
    # Fifty rounds: the episode without a call is cut at its 50th turn.
    looping = by_question["Loop: what is never answered?"]
    assert looping["finish_reason"] == "max_turns" and len(looping["turns"]) == 50
    counts = requests_per_episode(engine)
    assert sorted(counts.values()) == [1, 1, 50]
    # The experts: answer-1 is gpt-5 of the catalogue, asked once per answered task.
    assert [r["request"]["model"] for r in expert_calls] == ["gpt-5", "gpt-5"]
    # Grading: "PARIS" is "Paris" in lower case (no judge); "Beatles" is not "The
    # Beatles", so the judge is asked, once, and says no.
    assert len(judge_calls) == 1
    asked = judge_calls[0]["request"]["messages"][0]["content"]
    assert "Student answer: Beatles" in asked and "Reference answer: The Beatles" in asked
    assert by_question["Which city is the capital of France?"]["correct"] is True
    assert by_question["Which band recorded Abbey Road?"]["correct"] is False
    assert summary["protocol"] == "paper" and summary["trials"] == 1
    assert summary["accuracy"] == pytest.approx(1 / 3)


def test_heldout_protocol_is_the_projects_test_as_before(stack):
    config, evaluator, summary, engine, expert_calls, judge_calls, by_question = evaluate(
        stack, "heldout"
    )
    # The held-out configurations exactly as eval_tool_configs draws them.
    expected = eval_tool_configs(
        evaluator.episodes.env,
        evaluator.tasks,
        seed=config.eval.seed,
        **builders.tool_config_fields(config),
    )
    assert evaluator.tool_configs == expected
    assert {c.name for c in expected.values()} <= {
        "heldout_cheap",
        "heldout_expensive",
        "heldout_spread",
    }
    assert {r.sampling.temperature for r in engine.requests} == {config.eval.temperature}
    prompt = stack["tokenizer"].decode(engine.requests[0].input_ids)
    assert "The user's preferences for this task" in prompt
    assert sorted(requests_per_episode(engine).values()) == [1, 1, config.agent.max_turns]
    assert len(expert_calls) == 2
    # Normalised exact match settles "Beatles" against "The Beatles": no judge call.
    assert judge_calls == []
    assert by_question["Which band recorded Abbey Road?"]["correct"] is True
    assert summary["protocol"] == "heldout" and summary["accuracy"] == pytest.approx(2 / 3)


def test_the_paper_table_is_the_releases_evaluation_tools_json(shared_file, stack):
    """Every alias, price and latency of evaluation/tools.json (= the shared reference
    schemas), as the paper protocol's fixed table offers them."""
    reference = json.loads(shared_file("reference/toolorchestra_tools.json").read_text())
    config = EVAL_PROTOCOLS.get("paper").apply(live_config(stack, "paper", "table"))
    env = builders.build_env(config)
    tasks = [Task("t", "q?", "a", "judge")]
    configs = experiment.heldout_tool_configs(config, env, tasks)
    assert table_rows(configs["t"].tool_schemas()) == table_rows(reference)
    assert [s["function"]["name"] for s in configs["t"].tool_schemas()] == [
        t["function"]["name"] for t in reference
    ]


@dataclasses.dataclass
class Reply:
    text: str
    prompt_tokens: int = 10
    completion_tokens: int = 5
    latency_s: float = 0.1


class RecordingClient:
    def __init__(self):
        self.calls = []

    async def complete(self, messages, *, max_tokens, temperature):
        self.calls.append(messages)
        return Reply("<correct>True</correct>")


def test_paper_grading_is_lower_case_exact_match_then_the_judge():
    def graded(judge, prediction, gold):
        task = Task("t", "Who?", gold, "judge")
        return asyncio.run(judge_lib.grade(prediction, task, judge=judge)).correct

    client = RecordingClient()
    paper = judge_lib.MatchFirst(judge_lib.LLMJudge(client), "lowercase")
    assert graded(paper, "  marie CURIE ", "Marie Curie") and client.calls == []
    assert graded(paper, "Curie.", "Curie") and len(client.calls) == 1  # asked: "." differs
    assert not graded(paper, "", "Curie") and len(client.calls) == 1  # empty: never asked
    assert paper.stats()["judge/calls"] == 1
    client = RecordingClient()
    project = judge_lib.LLMJudge(client)  # heldout: normalised exact match settles it
    assert graded(project, "Curie.", "Curie") and client.calls == []
    with pytest.raises(ValueError, match="unknown answer match .fuzzy."):
        judge_lib.MatchFirst(project, "fuzzy")


MISNAMED = EvalProtocol(name="misnamed", tool_table="fixed", answer_match="lowercase")


def test_protocol_mistakes_are_one_line_naming_the_field():
    config = grpo_hle.get_config("micro")
    config.eval.protocol = "papr"
    [error] = check_eval(config)
    assert (
        error.startswith("eval.protocol must be one of ['heldout', 'paper']") and "\n" not in error
    )
    live = grpo_hle.get_config("live_tiny")  # models_local.yaml: not the paper's table
    live.eval.protocol = "paper"
    [error] = check_eval(live)
    assert error.startswith("eval.protocol='paper': tools.catalogue") and "\n" not in error
    assert "models_paper.yaml" in error
    config.eval.protocol = "tests.test_eval_protocol:MISNAMED"  # a protocol of one's own
    [error] = check_eval(config)
    assert error.startswith("eval.protocol='misnamed': unknown evaluation tool table 'fixed'")
    routed = grpo_hle.get_config("qwen3_8b")
    routed.eval.protocol = "paper"
    routed.env.name, routed.env.members = "routed", "qa,tau2"
    assert any("env.name='tau2'" in e for e in check_eval(routed))


def test_paper_protocol_on_tau2_is_200_steps_and_one_trial(tau2_data):
    config = grpo_hle.get_config("tau2_demo")
    config.env.tau2.data_dir = str(tau2_data)
    config.data.paths.tau2 = str(tau2_data / "tau2" / "domains" / "mock")
    config.eval.protocol = "paper"
    [error] = check_eval(config)  # the release judges NL assertions: a judge is due
    assert error.startswith("eval.protocol='paper' sets env.tau2.max_steps=200, ")
    assert error.endswith("env.tau2.nl_assertions='judge' needs env.tau2.judge_url and judge_model")
    config.env.tau2.judge_url, config.env.tau2.judge_model = "http://127.0.0.1:9/v1", "gpt-5"
    assert check_eval(config) == []
    evaluator = experiment.build_evaluator(config, None, load_tokenizer("demo"))
    assert evaluator.episodes.env.max_steps == 200 and evaluator.trials == 1
    assert evaluator.episodes.limits.max_turns == 200
    assert evaluator.episodes.sampling.temperature == 1.0
    assert evaluator.episodes.env.nl_assertions == "judge"
    assert (config.env.tau2.max_steps, config.eval.num_trials) == (40, 2)  # the run's own


def test_the_report_names_the_protocol_and_warns_when_policies_differ():
    from orchestra_jax.eval.report import protocol_line

    assert protocol_line([{"policy": "a", "protocol": "paper"}]).startswith(
        "Evaluation protocol: paper"
    )
    mixed = protocol_line([{"policy": "a", "protocol": "paper"}, {"policy": "b"}])
    assert mixed.startswith("Evaluation protocols differ (heldout: b; paper: a)")
