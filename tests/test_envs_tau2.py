"""τ² episodes through the project's agent loop, graded by tau2-bench's own evaluator.

A scripted policy replays a retail task's gold actions and says the facts the
task wants communicated: tau2 scores it 1. A wrong write, a missing fact, an
early end, tau2's step budget and too many tool errors each score 0. Needs the
`tau2` extra and ../shared/tau2-bench (skipped, saying which, without them).
"""

import asyncio
import copy
import json

import pytest

from orchestra_jax.agent.loop import LoopLimits
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.rollout.engine import SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.training.rollouts import Episodes, run_graded_episodes

TOK = load_tokenizer("demo")
EXCHANGE_TASK = "tau2/retail/70"  # one write: exchange a helmet; communicate "22.55"
LIMITS = LoopLimits(max_turns=8, max_context_tokens=32768, enable_thinking=False)


@pytest.fixture(scope="module")
def env(tau2_data):
    from orchestra_jax.envs.tau2.env import Tau2Environment
    from orchestra_jax.envs.tau2.user import ScriptedUser

    return Tau2Environment(
        lambda task, environment: ScriptedUser(["I want to exchange my helmet."]),
        data_dir=tau2_data,
    )


@pytest.fixture(scope="module")
def retail(tau2_data):
    from orchestra_jax.data.tau2_tasks import read_tau2_tasks

    tasks, report = read_tau2_tasks(tau2_data / "tau2" / "domains" / "retail")
    assert report.tasks == 114 and report.malformed == 0
    return {t.id: t for t in tasks}


def with_basis(task, basis):
    """The task with another reward basis (tau2's default, τ-bench's, is DB + COMMUNICATE)."""
    task = copy.deepcopy(task)
    task.metadata["tau2_task"]["evaluation_criteria"]["reward_basis"] = list(basis)
    return type(task)(**{**task.to_dict(), "id": task.id + "/" + "+".join(basis)})


def call(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def gold(task):
    return task.metadata["tau2_task"]["evaluation_criteria"]


def gold_calls(task):
    return [call(a["name"], a["arguments"]) for a in gold(task)["actions"]]


def play(env, task, plan, *, limits=LIMITS, logprobs=None):
    """One episode where turn k of the policy writes plan[k] (the last one repeats)."""

    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        out = TOK.encode(plan[min(turn, len(plan) - 1)]) + [TOK.im_end_id]
        return out if logprobs is None else (out, [logprobs(turn, i) for i in range(len(out))])

    sampler = env.tool_config_sampler(seed=0)  # no meta-tools: the policy acts alone
    how = Episodes(
        env=env,
        engine=ScriptedEngine(policy),
        tokenizer=TOK,
        sampling=SamplingParams(),
        limits=limits,
    )
    [traj] = asyncio.run(run_graded_episodes([task], [sampler.sample(task)], how, seed=0))
    return traj


def test_gold_actions_and_the_communicated_fact_score_1(env, retail):
    task = with_basis(retail[EXCHANGE_TASK], ["DB", "COMMUNICATE"])
    traj = play(env, task, gold_calls(task) + ["You will pay $22.55 for the difference."])
    assert traj.finish_reason == "conversation"
    assert traj.metadata["conversation_end"] == "user_stop"  # the script ran out: ###STOP###
    grade = traj.metadata["grade"]
    assert grade["breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0}
    assert grade["reward"] == 1.0 and traj.correct is True
    assert traj.turns[0].tool_results[0].error is None
    assert '"status": "exchange requested"' in traj.turns[0].tool_results[0].text


def test_the_released_retail_basis_without_a_judge_scores_db_and_says_what_it_left_out(env, retail):
    task = retail[EXCHANGE_TASK]  # reward basis DB + NL_ASSERTION
    traj = play(env, task, gold_calls(task) + ["Done."])
    grade = traj.metadata["grade"]
    assert traj.correct and grade["breakdown"] == {"DB": 1.0}
    assert grade["not_scored"] == ["NL_ASSERTION"]


def test_a_wrong_write_scores_0(env, retail):
    task = with_basis(retail[EXCHANGE_TASK], ["DB", "COMMUNICATE"])
    [action] = gold(task)["actions"]
    wrong = {**action["arguments"], "new_item_ids": ["8573379326"]}  # red, not blue
    traj = play(env, task, [call(action["name"], wrong), "You will pay $22.55."])
    assert traj.turns[0].tool_results[0].error is None  # the write itself succeeded
    assert traj.metadata["grade"]["breakdown"]["DB"] == 0.0
    assert traj.correct is False


def test_a_missing_communicated_fact_scores_0(env, retail):
    task = with_basis(retail[EXCHANGE_TASK], ["DB", "COMMUNICATE"])
    traj = play(env, task, gold_calls(task) + ["Your exchange is on its way."])
    assert traj.metadata["grade"]["breakdown"] == {"DB": 1.0, "COMMUNICATE": 0.0}
    assert traj.correct is False


def test_an_early_end_scores_0(env, retail):
    task = with_basis(retail[EXCHANGE_TASK], ["DB", "COMMUNICATE"])
    stopped = play(env, task, ["It costs $22.55. ###STOP###"] + gold_calls(task))
    assert stopped.metadata["conversation_end"] == "agent_stop" and len(stopped.turns) == 1
    assert stopped.metadata["grade"]["breakdown"]["DB"] == 0.0 and not stopped.correct
    # The loop's own turn budget cuts the conversation: tau2 grades it as unfinished.
    cut = play(
        env,
        task,
        gold_calls(task) + ["It costs $22.55."],
        limits=LoopLimits(max_turns=1, max_context_tokens=32768, enable_thinking=False),
    )
    assert cut.finish_reason == "max_turns" and "conversation_end" not in cut.metadata
    assert cut.metadata["grade"]["termination"] == "max_steps"
    assert cut.metadata["grade"]["reward"] == 0.0 and not cut.correct


def test_an_evaluator_whose_service_fails_is_retried_then_the_evaluators_failure(
    env, retail, monkeypatch
):
    import tau2.evaluator.evaluator as evaluator

    calls = {"n": 0}
    evaluate = evaluator.evaluate_simulation

    def flaky(*args, **kwargs):  # failure injection: the first `fail` calls raise
        calls["n"] += 1
        if calls["n"] <= fail:  # as its NL judge's endpoint does when it goes down
            raise ConnectionError("evaluator crashed")
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(evaluator, "evaluate_simulation", flaky)
    monkeypatch.setattr(env, "evaluator_retries", 1)
    task = with_basis(retail[EXCHANGE_TASK], ["DB", "COMMUNICATE"])
    plan = gold_calls(task) + ["You will pay $22.55 for the difference."]
    fail = 1  # one failure, one retry: graded as usual
    traj = play(env, task, plan)
    assert calls["n"] == 2 and traj.infra_failure is None and traj.correct is True
    fail, calls["n"] = 5, 0  # every attempt fails: not the policy's, not graded
    traj = play(env, task, plan)
    assert calls["n"] == 2 and traj.correct is False and "grade" not in traj.metadata
    assert traj.infra_failure.kind == "evaluator"
    assert traj.infra_failure.endpoint == "tau2 evaluator (retail)"
    assert "after 2 attempt(s)" in traj.infra_failure.message
    assert "evaluator crashed" in traj.infra_failure.message


def test_an_evaluator_that_raises_a_bug_is_not_retried_and_not_infrastructure(
    env, retail, monkeypatch
):
    import tau2.evaluator.evaluator as evaluator

    calls = {"n": 0}

    def broken(*args, **kwargs):  # deterministic: another attempt raises the same
        calls["n"] += 1
        raise ValueError("reward basis has an unknown criterion")

    monkeypatch.setattr(evaluator, "evaluate_simulation", broken)
    monkeypatch.setattr(env, "evaluator_retries", 3)
    task = with_basis(retail[EXCHANGE_TASK], ["DB", "COMMUNICATE"])
    with pytest.raises(ValueError, match="unknown criterion"):
        play(env, task, gold_calls(task) + ["You will pay $22.55 for the difference."])
    assert calls["n"] == 1


def test_tau2_budgets_end_the_conversation(tau2_data, retail):
    from orchestra_jax.envs.tau2.env import Tau2Environment
    from orchestra_jax.envs.tau2.user import ScriptedUser

    task = with_basis(retail[EXCHANGE_TASK], ["DB", "COMMUNICATE"])
    user = lambda task, environment: ScriptedUser(["Hi.", "Fine.", "Sure."])  # noqa: E731
    # Steps: the user's first message (1), the write and its result (3), the message (4).
    short = Tau2Environment(user, data_dir=tau2_data, max_steps=4)
    traj = play(short, task, gold_calls(task) + ["It costs $22.55."])
    assert traj.metadata["conversation_end"] == "max_steps" and not traj.correct
    assert len(traj.turns) == 2  # the budget ran out right after the policy's message
    # Domain-tool errors (tau2's: "Error: ...") count towards its error budget.
    strict = Tau2Environment(user, data_dir=tau2_data, max_errors=2)
    bad = call("get_order_details", {"order_id": "#nope"})
    traj = play(strict, task, [bad])
    assert [t.tool_results[0].text[:6] for t in traj.turns] == ["Error:", "Error:"]
    assert traj.turns[0].tool_results[0].error is not None
    assert traj.metadata["conversation_end"] == "too_many_errors" and not traj.correct


def test_user_tools_action_and_environment_assertions(tau2_data):
    """mock: the user reads and dismisses a notification with its own tools (run in
    the episode's environment, as tau2 runs them); the agent updates the task."""
    from orchestra_jax.data.tau2_tasks import read_tau2_tasks
    from orchestra_jax.envs.tau2.env import Tau2Environment
    from orchestra_jax.envs.tau2.user import ScriptedUser

    tasks, _ = read_tau2_tasks(tau2_data / "tau2" / "domains" / "mock")
    [task] = [t for t in tasks if t.id == "tau2/mock/update_task_with_user_tools"]
    # Its released basis adds DB, whose gold run has no user dismissing anything, so
    # tau2 itself scores DB 0 for the play the instructions ask for.
    task = with_basis(task, ["ACTION", "ENV_ASSERTION"])
    lines = [
        {"name": "check_notifications"},
        "I finished task_1, please mark it completed.",
        {"name": "dismiss_notification", "arguments": {"notification_id": "notif_1"}},
    ]
    env = Tau2Environment(lambda t, e: ScriptedUser(lines), data_dir=tau2_data)
    traj = play(env, task, gold_calls(task) + ["It is marked completed."])
    grade = traj.metadata["grade"]
    assert grade["breakdown"] == {"ENV_ASSERTION": 1.0, "ACTION": 1.0}
    assert traj.correct and traj.metadata["conversation_end"] == "user_stop"
    # The user's tool calls are tau2's business: the policy only read its messages.
    assert "check_notifications" not in TOK.decode(traj.token_ids)
    no_action = play(env, task, ["It is marked completed."])
    assert no_action.metadata["grade"]["breakdown"]["ACTION"] == 0.0 and not no_action.correct
    forgetful = Tau2Environment(lambda t, e: ScriptedUser(lines[:2]), data_dir=tau2_data)
    undismissed = play(forgetful, task, gold_calls(task) + ["Done."])
    assert undismissed.metadata["grade"]["breakdown"]["ENV_ASSERTION"] == 0.0


def test_tokens_masks_and_logprobs_line_up_over_user_turns(env, retail):
    """Sampled tokens (mask 1, with their own log-probs) and everything else (mask 0)
    in order: prompt, turn, tool results, turn, the user's message, turn; the whole
    is the chat template's render of the conversation the policy saw."""
    from orchestra_jax.chat.template import render
    from orchestra_jax.envs.tau2.user import ScriptedUser, agent_instructions

    task = with_basis(retail[EXCHANGE_TASK], ["DB", "COMMUNICATE"])
    plan = gold_calls(task) + ["Shall I go ahead?", "It costs $22.55."]
    said = ["I want to exchange my helmet.", "Yes please."]
    env.speaker = lambda t, e: ScriptedUser(said)
    thinking = LoopLimits(max_turns=8, max_context_tokens=32768, enable_thinking=True)
    try:
        traj, config = (
            play(env, task, plan, limits=thinking, logprobs=lambda turn, i: -(turn + 1) - i / 1000),
            env.tool_config_sampler(seed=0).sample(task),
        )
    finally:
        env.speaker = lambda t, e: ScriptedUser(["I want to exchange my helmet."])
    assert traj.correct and len(traj.turns) == 3
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    turn_ids = [TOK.encode(p) + [TOK.im_end_id] for p in plan]
    assert [traj.token_ids[i] for i in sampled] == sum(turn_ids, [])
    expected = [-(k + 1) - i / 1000 for k, ids in enumerate(turn_ids) for i in range(len(ids))]
    assert [traj.rollout_logprobs[i] for i in sampled] == pytest.approx(expected)
    assert not any(lp for lp, m in zip(traj.rollout_logprobs, traj.loss_mask) if not m)
    episode_tools = env.tools(config, task=task)
    schemas = [t.schema() for n, t in episode_tools.items() if n not in config.tools]
    policy = env.domain_of("retail").policy
    messages = [
        {"role": "system", "content": config.system_prompt(head=agent_instructions(policy))},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": said[0]},
        {"role": "assistant", "content": plan[0]},
        {"role": "tool", "content": traj.turns[0].tool_results[0].text},
        {"role": "assistant", "content": plan[1]},
        {"role": "user", "content": said[1]},
    ]
    prompt = render(messages, tools=schemas + config.tool_schemas(), add_generation_prompt=True)
    assert TOK.decode(traj.token_ids) == prompt + plan[2] + "<|im_end|>"
    assert traj.turns[1].observation.startswith("\n<|im_start|>user\nYes please.<|im_end|>")
    assert traj.metadata["other_party"]["calls"] == 3  # the opening, "Yes please.", the stop


def test_a_task_that_starts_from_its_message_history(env, tau2_data):
    """mock: the history (a task created earlier) is replayed into the database and
    shown to the policy; the user speaks after its last agent message."""
    from orchestra_jax.data.tau2_tasks import read_tau2_tasks

    tasks, _ = read_tau2_tasks(tau2_data / "tau2" / "domains" / "mock")
    [task] = [t for t in tasks if t.id == "tau2/mock/update_task_with_message_history"]
    traj = play(env, task, gold_calls(task) + ["It is completed."])
    assert traj.correct and traj.metadata["grade"]["breakdown"]["DB"] == 1.0
    prompt = TOK.decode(traj.token_ids[: traj.prompt_length])
    assert (
        prompt.index('{"name": "create_task"')
        < prompt.index("task_2")
        < prompt.index(
            "I want to exchange my helmet."  # the scripted user's first line comes last
        )
    )
    assert "Hi! How can I help you today?" not in prompt  # no greeting: the talk goes on


class Oracle:
    """An expert who knows the task: advises its gold call, then the fact to say."""

    def __init__(self, task, name):
        self.action = gold(task)["actions"][0]
        self.name, self.prompts = name, []

    async def complete(self, messages, *, max_tokens, temperature, ctx=None):
        from orchestra_jax.tools.experts.client import ExpertReply

        self.prompts.append(messages)
        talk = messages[-1]["content"].split("Conversation so far:", 1)[1]
        done = f'"name": "{self.action["name"]}"' in talk
        text = (
            "You pay $22.55 for the new helmet."
            if done
            else call(self.action["name"], self.action["arguments"])
        )
        return ExpertReply(text=text, prompt_tokens=1000, completion_tokens=50, latency_s=2.0)


def test_relay_routers_consult_priced_experts_and_report_pass_k(tau2_data, retail, tmp_path):
    """The expert_* baselines: each turn asks the chosen expert (priced per alias) and
    says its advice; an oracle expert solves the task in every trial: pass^k = 1."""
    from orchestra_jax.envs.tau2.env import Tau2Environment
    from orchestra_jax.envs.tau2.tools import EXPERT_PROFILES
    from orchestra_jax.envs.tau2.user import ScriptedUser
    from orchestra_jax.eval.routers import RouterEngine
    from orchestra_jax.training.evaluation import Evaluator, eval_tool_configs

    task = with_basis(retail[EXCHANGE_TASK], ["DB", "COMMUNICATE"])
    experts = {p.backend: Oracle(task, p.backend) for p in EXPERT_PROFILES}
    env = Tau2Environment(
        lambda t, e: ScriptedUser(["My helmet is too small."]),
        data_dir=tau2_data,
        experts=experts,
        meta_tools=("ask_expert",),
    )
    configs = eval_tool_configs(env, [task], seed=0)
    episodes = Episodes(env=env, tokenizer=TOK, sampling=SamplingParams(), limits=LIMITS)
    evaluator = Evaluator(
        [task],
        configs,
        episodes,
        seed=0,
        cost_scale=0.02,
        latency_scale=120.0,
        workdir=str(tmp_path),
        max_infra_failure_fraction=0.25,
        trials=2,
    )
    summary = asyncio.run(
        evaluator.evaluate("expert_strongest", RouterEngine("expert_strongest", TOK, configs))
    )
    assert summary["pass_k"] == {
        "all": {"pass^1": 1.0, "pass^2": 1.0},
        "retail": {"pass^1": 1.0, "pass^2": 1.0},
    }
    assert summary["trials"] == 2 and summary["num_episodes"] == 2
    config = configs[task.id]
    strongest = max(config.aliases_for("ask_expert"), key=lambda a: (a.price_out, a.price_in))
    assert strongest.backend == "gpt-5" and experts["gpt-5"].prompts
    assert not experts["Qwen3-32B"].prompts and not experts["gpt-5-mini"].prompts
    # Two consultations an episode (the call, then the fact), priced at the alias's rates.
    per_call = (1000 * strongest.price_in + 50 * strongest.price_out) / 1e6
    assert summary["mean_cost_usd"] > 2 * per_call
    [prompt] = experts["gpt-5"].prompts[:1]
    assert "My helmet is too small." in prompt[-1]["content"]  # the conversation so far
    assert "exchange_delivered_order_items" in prompt[-1]["content"]  # the domain's tools
    assert "Sofia Hernandez" not in prompt[-1]["content"]  # never the user's scenario
    assert (tmp_path / "eval_expert_strongest.json").exists()
