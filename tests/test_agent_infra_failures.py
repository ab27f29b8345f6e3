"""Each kind of infrastructure failure is recognised where it happens, through the
real loop, tools, clients and grader (failures injected with fakes and dead ports);
the policy's own failures never are."""

import asyncio
import socket

import pytest

from orchestra_jax.agent.episode import EpisodeSpec
from orchestra_jax.agent.loop import LoopLimits, run_episodes_sync
from orchestra_jax.rewards.judge import LLMJudge
from orchestra_jax.rollout.engine import Completion, SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.tasks import Task
from orchestra_jax.tools.config import ModelAlias, ToolConfig
from orchestra_jax.tools.experts.client import OpenAIChatExpert
from orchestra_jax.tools.registry import Backends, make_tools
from orchestra_jax.training.rollouts import grade_all
from tests import test_agent_conversation as conversation_tests
from tests.test_agent_loop import TOK, FakeTool, call, run, scripted, spec
from tests.test_tools_accounting import FixedExpert

TASK = Task("t0", "Where is Zorbel Works headquartered?", "Quilton")


def dead_url():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def meta_tools(expert, retriever=None, search_retries=0):
    config = ToolConfig(
        aliases=(
            ModelAlias("search-1", "search", "m", 1.0, 1.0, 1.0),
            ModelAlias("answer-1", "answer", "m", 1.0, 1.0, 1.0),
        ),
        tools=("search", "answer"),
    )
    backends = Backends(experts={"m": expert}, retriever=retriever, search_retries=search_retries)
    return config, make_tools(config, backends)


def play_meta(expert, turns, **backends):
    config, tools = meta_tools(expert, **backends)
    episode = EpisodeSpec(task=TASK, tool_config=config, tools=tools)
    [traj] = run_episodes_sync(
        [episode],
        scripted({"t0/0": turns}),
        TOK,
        sampling=SamplingParams(),
        limits=LoopLimits(max_turns=4, enable_thinking=False),
    )
    return traj


def test_an_engine_error_and_an_aborted_turn_are_the_engines():
    tools = [FakeTool("answer", final=True)]

    def raising(ids, request):
        raise ConnectionError("server gone")

    engine = ScriptedEngine(raising)
    engine.urls = ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]  # a server client's
    [traj] = run([spec(tools)], engine)
    assert traj.finish_reason == "error" and traj.infra_failure is not None
    assert traj.infra_failure.kind == "engine" and "server gone" in traj.infra_failure.message
    assert traj.infra_failure.endpoint == "http://10.0.0.1:30000,http://10.0.0.2:30000"

    class Aborting(ScriptedEngine):
        async def generate(self, requests):
            abort = Completion(
                [5], [-1.0], "abort", prompt_tokens=1, completion_tokens=1, latency_s=0
            )
            return [abort] * len(requests)

    [aborted] = run([spec(tools)], Aborting(lambda ids, r: [5]))
    assert aborted.infra_failure.kind == "engine" and aborted.infra_failure.endpoint == "Aborting"
    assert "aborted turn 0" in aborted.infra_failure.message


def test_an_expert_endpoint_that_stays_down_is_the_experts_and_ends_the_episode():
    url = dead_url()
    expert = OpenAIChatExpert(url, "m", api_key_env=None, retries=1, backoff_s=0.01)
    traj = play_meta(expert, [call("answer", model="answer-1")])
    assert traj.finish_reason == "error" and len(traj.turns) == 1
    failure = traj.infra_failure
    assert failure.kind == "expert" and failure.endpoint == url + "/chat/completions"
    assert "failed after 2 attempt(s)" in failure.message
    [result] = traj.turns[0].tool_results
    assert result.infra_failure == failure and result.metadata["expert_failed"]


class DownSearch:
    url = "https://search.test/v1"

    def __init__(self, fail_first):
        self.fail_first, self.calls = fail_first, 0

    def search(self, query, k, allowed_ids=None):
        from orchestra_jax.tools.retrieval.retrievers import Document

        self.calls += 1
        if self.calls <= self.fail_first:
            raise OSError("search backend unreachable")
        return [Document("d1", "Zorbel Works is headquartered in Quilton.", "Zorbel")]


def test_a_search_backend_failure_is_retried_then_the_searchs(monkeypatch):
    monkeypatch.setattr("orchestra_jax.tools.meta_tools.SEARCH_BACKOFF_S", 0.0)
    turns = [call("search", model="search-1"), call("answer", model="answer-1")]
    flaky = DownSearch(fail_first=1)  # one failure, one retry: the episode goes on
    recovered = play_meta(FixedExpert(), turns, retriever=flaky, search_retries=1)
    assert recovered.infra_failure is None and recovered.finish_reason == "answer"
    assert flaky.calls == 2
    down = DownSearch(fail_first=10)
    traj = play_meta(FixedExpert(), turns, retriever=down, search_retries=2)
    assert down.calls == 3 and traj.finish_reason == "error" and len(traj.turns) == 1
    assert traj.infra_failure.kind == "search" and traj.infra_failure.endpoint == down.url
    assert "after 3 attempt(s)" in traj.infra_failure.message
    assert "unreachable" in traj.infra_failure.message


def test_a_failing_user_simulator_is_the_users():
    FakeUser = conversation_tests.FakeUser
    at_open = conversation_tests.play(
        conversation_tests.conversation(FakeUser(fail_on="open")),
        conversation_tests.scripted(["Hello."]),
    )
    assert at_open.infra_failure.kind == "user_simulator"
    assert at_open.infra_failure.endpoint == "FakeUser"
    assert "user endpoint down" in at_open.infra_failure.message
    later = conversation_tests.play(
        conversation_tests.conversation(FakeUser(["a", "b", "c"], fail_on=2)),
        conversation_tests.scripted(["One.", "Two."]),
    )
    assert later.infra_failure.kind == "user_simulator" and len(later.turns) == 2


class JudgedEnv:
    """An environment whose grade asks the judge (as the QA environment does)."""

    async def grade(self, task, final_answer, *, judge=None, state=None):
        return await judge(task.question, final_answer or "", task.answer)


def test_a_judge_that_gives_no_verdict_is_the_judges_and_nothing_is_graded_wrong():
    url = dead_url()
    judge = LLMJudge(OpenAIChatExpert(url, "judge", api_key_env=None, retries=0))
    tools = [FakeTool("answer", final=True)]
    [traj] = run([spec(tools)], scripted({"t0/0": [call("answer", q="Paris")]}))
    asyncio.run(grade_all([traj], {"t0": Task("t0", "Capital?", "Rome")}, JudgedEnv(), judge=judge))
    assert traj.infra_failure.kind == "judge"
    assert traj.infra_failure.endpoint == url + "/chat/completions"
    assert traj.correct is False and "grade" not in traj.metadata


def test_a_bug_in_the_judges_client_is_a_crash_not_the_judges_failure():
    from orchestra_jax.tools.experts.client import ExpertError

    class Client:
        def __init__(self, error):
            self.error = error

        async def complete(self, messages, **kwargs):
            raise self.error

    def grade(error):
        tools = [FakeTool("answer", final=True)]
        [traj] = run([spec(tools)], scripted({"t0/0": [call("answer", q="Paris")]}))
        tasks = {"t0": Task("t0", "Capital?", "Rome")}
        asyncio.run(grade_all([traj], tasks, JudgedEnv(), judge=LLMJudge(Client(error))))
        return traj

    with pytest.raises(TypeError, match="unexpected keyword"):
        grade(TypeError("complete() got an unexpected keyword 'seed'"))
    down = grade(ExpertError("failed after 3 attempt(s)", endpoint="http://judge.test/v1"))
    assert down.infra_failure.kind == "judge" and down.correct is False


def test_an_episode_failed_in_rollout_is_not_graded():
    class Refuses:
        async def grade(self, *args, **kwargs):
            raise AssertionError("graded an episode whose engine failed")

    def raising(ids, request):
        raise ConnectionError("server gone")

    [traj] = run([spec([FakeTool("answer", final=True)])], ScriptedEngine(raising))
    asyncio.run(grade_all([traj], {}, Refuses()))
    assert traj.correct is False and traj.infra_failure.kind == "engine"


@pytest.mark.parametrize(
    "turns",
    [
        ["<tool_call>\n{not json\n</tool_call>"],  # a malformed call
        [call("nonexistent", q="1")],  # an unknown tool
        [call("search", q=1)],  # a call its tool refuses (it raises)
        ["I will just talk."],  # no call, no answer
    ],
)
def test_the_policys_own_failures_are_never_infrastructure(turns):
    tools = [FakeTool("search", raises=ValueError("bad argument")), FakeTool("answer", final=True)]
    [traj] = run([spec(tools)], scripted({"t0/0": turns}), max_turns=2)
    assert traj.infra_failure is None and traj.finish_reason == "max_turns"
    assert all(r.infra_failure is None for t in traj.turns for r in t.tool_results)


def test_only_transport_server_and_timeout_errors_are_a_services_failure():
    import aiohttp
    import httpx
    import jax
    import openai

    from orchestra_jax.envs.tau2.user import PartyError
    from orchestra_jax.infra_failure import InfraError, is_service_failure
    from orchestra_jax.rollout.http.client import RolloutServerError, ServerUnreachable
    from orchestra_jax.rollout.http.server_pool import NoServerAvailable
    from orchestra_jax.tools.experts.client import ExpertError

    request = httpx.Request("POST", "http://127.0.0.1:1/v1")
    services = [
        ConnectionRefusedError("refused"),
        asyncio.TimeoutError(),
        TimeoutError("read timed out"),
        aiohttp.ClientConnectionError("dropped"),
        aiohttp.ServerDisconnectedError(),
        openai.APIConnectionError(request=request),
        RolloutServerError("generate failed after 3 attempts"),
        ServerUnreachable("no answer"),
        NoServerAvailable("every server is out"),
        PartyError("user simulator failed after 4 attempt(s)"),
        ExpertError("failed after 3 attempt(s)", endpoint="http://expert.test/v1"),
        InfraError("judge down", kind="judge", endpoint="http://judge"),
        jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory"),
    ]
    bugs = [
        TypeError("'NoneType' object is not subscriptable"),
        KeyError("weight_version"),
        AssertionError(),
        ValueError("bad reward basis"),
        AttributeError("no attribute 'urls'"),
        RuntimeError("an unnamed runtime error"),
        FileNotFoundError("db.json"),
    ]
    assert [is_service_failure(e) for e in services] == [True] * len(services)
    assert [is_service_failure(e) for e in bugs] == [False] * len(bugs)


@pytest.mark.parametrize(
    "bug", [TypeError("bad operand"), KeyError("finish_reason"), AssertionError("bad state")]
)
def test_a_bug_in_the_engine_client_is_a_crash_not_an_infrastructure_failure(bug):
    def raising(ids, request):
        raise bug

    with pytest.raises(type(bug)):
        run([spec([FakeTool("answer", final=True)])], ScriptedEngine(raising))


def test_a_bug_in_the_other_party_is_a_crash_not_an_infrastructure_failure():
    FakeUser = conversation_tests.FakeUser

    class BuggyUser(FakeUser):
        def __init__(self, at, **kwargs):
            super().__init__(["a", "b"], **kwargs)
            self.at = at

        async def open(self, state):
            if self.at == "open":
                raise TypeError("bug at open")
            return await super().open(state)

        async def respond(self, state, turn):
            if self.at == "respond":
                raise KeyError("bug in respond")
            return await super().respond(state, turn)

    engine = conversation_tests.scripted(["Hello."])
    with pytest.raises(TypeError, match="bug at open"):
        conversation_tests.play(conversation_tests.conversation(BuggyUser("open")), engine)
    with pytest.raises(KeyError, match="bug in respond"):
        conversation_tests.play(conversation_tests.conversation(BuggyUser("respond")), engine)


def test_a_tool_that_raises_a_bug_stays_an_observation_for_the_policy():
    tools = [FakeTool("search", raises=TypeError("tool bug")), FakeTool("answer", final=True)]
    turns = [call("search", q="x"), call("answer", q="done")]
    [traj] = run([spec(tools)], scripted({"t0/0": turns}), max_turns=3)
    assert traj.infra_failure is None and traj.finish_reason == "answer"
    [result] = traj.turns[0].tool_results
    assert "TypeError: tool bug" in result.text and result.error and result.infra_failure is None


class RejectingSearch(DownSearch):
    def search(self, query, k, allowed_ids=None):
        self.calls += 1
        raise ValueError("the query has no terms the index knows")


def test_a_search_that_rejects_the_query_is_the_calls_error_not_an_outage(monkeypatch):
    monkeypatch.setattr("orchestra_jax.tools.meta_tools.SEARCH_BACKOFF_S", 0.0)
    turns = [call("search", model="search-1"), call("answer", model="answer-1")]
    rejecting = RejectingSearch(fail_first=0)
    traj = play_meta(FixedExpert(), turns, retriever=rejecting, search_retries=2)
    assert rejecting.calls == 1  # not retried
    assert traj.infra_failure is None and traj.finish_reason == "answer"
    [result] = traj.turns[0].tool_results
    assert result.error and "ValueError" in result.error and result.infra_failure is None
