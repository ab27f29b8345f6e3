"""The orchestrator service over HTTP, with the real `openai` client: answers, usage and
calls, streamed steps, per-request preference and budgets, access and limits, and
one request's failure or disconnect never reaching its neighbours.

The world is the demo's (the synthetic environment: simulated experts, BM25 search,
the sandbox) built by the experiment builders; the orchestrator's turns come from the
project's `ScriptedEngine` (a scripted policy that calls search, then answer), so
each test knows which calls to expect. Failures are injected by wrapping the
environment's tools or the engine's policy.
"""

import asyncio
import dataclasses
import json
import threading
import time

import aiohttp
import pytest

openai = pytest.importorskip("openai", reason="the openai client (the test extra) is needed")

from experiments.configs.grpo_hle import get_config  # noqa: E402
from orchestra_jax.agent.loop import LoopLimits, run_episodes_sync  # noqa: E402
from orchestra_jax.rollout.scripted import ScriptedEngine  # noqa: E402
from orchestra_jax.serve.app import OrchestratorServer, ServeConfig, ServerThread  # noqa: E402
from orchestra_jax.serve.build import default_tool_config  # noqa: E402
from orchestra_jax.serve.service import Orchestrator  # noqa: E402
from orchestra_jax.training import builders  # noqa: E402
from orchestra_jax.training.eval_protocols import eval_protocol  # noqa: E402

QUESTION = "Who founded the Juslosel Observatory?"


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def world():
    demo = get_config("demo")
    config = eval_protocol(demo).apply(demo)
    env = builders.build_env(config)
    tokenizer = builders.build_tokenizer(config)
    return config, env, tokenizer, default_tool_config(config, env)


class Plan:
    """The scripted orchestrator: search, then answer; a question containing BOOM
    makes the engine fail that request's turn, SLOW makes its turns take 0.3 s."""

    def __init__(self, tokenizer, tool_config):
        self.tokenizer = tokenizer
        search = tool_config.aliases_for("search")[0].alias
        answer = tool_config.aliases_for("answer")[0].alias
        self.turns = [call("search", model=search, query="founder"), call("answer", model=answer)]

    def __call__(self, ids, request):
        prompt = self.tokenizer.decode(ids)
        if "BOOM" in prompt:
            raise ConnectionError("injected engine failure")
        if "SLOW" in prompt:
            time.sleep(0.3)
        turn = int(request.request_id.rsplit("/", 1)[1])
        return self.tokenizer.encode(self.turns[min(turn, 1)] + "<|im_end|>")


class FlakyEnv:
    """The demo's environment whose tools fail for some requests (failure injection):
    a question containing BADTOOL gets a search that raises, HANG a search that never
    answers (it records its cancellation)."""

    def __init__(self, env):
        self.env = env
        self.cancelled = threading.Event()
        self.hanging = threading.Event()

    def __getattr__(self, name):
        return getattr(self.env, name)

    def tools(self, config, *, task=None, seed=0, sleep_scale=0.0):
        tools = dict(self.env.tools(config, task=task, seed=seed, sleep_scale=sleep_scale))
        question = task.question if task is not None else ""
        if "BADTOOL" in question:
            tools["search"] = _Raising(tools["search"])
        if "HANG" in question:
            tools["search"] = _Hanging(tools["search"], self)
        return tools


class _Raising:
    def __init__(self, tool):
        self.tool, self.name = tool, tool.name

    def schema(self):
        return self.tool.schema()

    async def __call__(self, arguments, ctx):
        raise RuntimeError("injected: the search backend returned garbage")


class _Hanging(_Raising):
    def __init__(self, tool, env):
        super().__init__(tool)
        self.env = env

    async def __call__(self, arguments, ctx):
        self.env.hanging.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.env.cancelled.set()
            raise


def orchestrator(world, engine=None, env=None, **limits):
    config, base_env, tokenizer, tool_config = world
    return Orchestrator(
        engine=engine or ScriptedEngine(Plan(tokenizer, tool_config)),
        tokenizer=tokenizer,
        env=env or base_env,
        tool_config=tool_config,
        sampling=builders.eval_sampling_params(config),
        limits=dataclasses.replace(builders.loop_limits(config), **limits),
        name="scripted-demo",
    )


@pytest.fixture(scope="module")
def flaky(world):
    return FlakyEnv(world[1])


@pytest.fixture(scope="module")
def served(world, flaky):
    with ServerThread(OrchestratorServer(orchestrator(world, env=flaky))) as server:
        yield server


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def ask(client, question=QUESTION, **extra):
    return client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": question}],
        extra_body=extra or None,
    )


def test_plain_answer_carries_cost_latency_and_calls(client, world):
    tool_config = world[3]
    reply = ask(client)
    assert reply.object == "chat.completion" and reply.model == "scripted-demo"
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    assert choice.message.content and not choice.message.content.startswith("No answer")
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    extra = usage.model_extra or {}
    calls = extra["calls"]
    assert [c["tool"] for c in calls] == ["search", "answer"]
    assert [c["model"] for c in calls] == [
        tool_config.aliases_for("search")[0].alias,
        tool_config.aliases_for("answer")[0].alias,
    ]
    assert all(c["cost_usd"] > 0 and c["latency_s"] > 0 and c["error"] is None for c in calls)
    orchestration = (reply.model_extra or {})["orchestration"]
    assert orchestration["stop_reason"] == "answer" and orchestration["turns"] == 2
    total = orchestration["tool_cost_usd"] + orchestration["orchestrator_cost_usd"]
    assert extra["cost_usd"] == pytest.approx(total)
    assert orchestration["tool_cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls))
    assert extra["latency_s"] >= sum(c["latency_s"] for c in calls)


def test_stream_sends_steps_as_they_happen_then_the_answer_then_usage(client):
    stream = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    steps = [(c.model_extra or {}).get("orchestra_step") for c in chunks]
    kinds = [s["type"] for s in steps if s]
    assert kinds == ["turn", "call", "turn", "call"]
    for chunk, step in zip(chunks, steps):
        if step:  # a step rides on an empty delta a plain client reads as nothing
            assert not chunk.choices[0].delta.content
    costs = [s["cost_usd_so_far"] for s in steps if s]
    assert costs == sorted(costs) and costs[0] > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop" and last.usage is not None
    extra = last.usage.model_extra or {}
    assert [c["tool"] for c in extra["calls"]] == ["search", "answer"]
    assert extra["cost_usd"] == pytest.approx(costs[-1])
    assert text and not text.startswith("No answer")  # the answer, in content deltas


def test_stream_steps_arrive_before_the_episode_ends(served):
    """The first step reaches the client while the episode is still running (its
    second turn is slow)."""

    async def run():
        body = {"messages": [{"role": "user", "content": "SLOW " + QUESTION}], "stream": True}
        arrivals = []
        async with aiohttp.ClientSession() as session:
            async with session.post(served.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        arrivals.append((time.perf_counter(), line[6:].strip()))
        return arrivals

    arrivals = asyncio.run(run())
    assert arrivals[-1][1] == b"[DONE]"
    events = [(t, json.loads(d)) for t, d in arrivals[:-1]]
    first_step = next(t for t, e in events if e.get("orchestra_step"))
    final = events[-1][0]
    assert final - first_step > 0.25  # the second slow turn came after the first step


def test_preference_and_budgets_per_request(client, world):
    tool_config = world[3]
    reply = ask(client, preference={"accuracy": 1.0, "latency": 2.0}, max_turns=1)
    orchestration = reply.model_extra["orchestration"]
    assert orchestration["stop_reason"] == "max_turns" and orchestration["turns"] == 1
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content.startswith("No answer")
    spent = ask(client, max_cost_usd=1e-9)  # the first turn crosses it; no second starts
    orchestration = spent.model_extra["orchestration"]
    assert orchestration["stop_reason"] == "max_cost" and orchestration["turns"] == 1
    assert "max_cost_usd" in spent.choices[0].message.content
    search = tool_config.aliases_for("search")[0].alias
    only_answer = ask(client, allowed_tools=["answer"])  # search is not offered: its call fails
    calls = only_answer.usage.model_extra["calls"]
    assert calls[0]["error"] and "search" in calls[0]["error"]  # not offered: refused
    assert ask(client, allowed_tools=[search]).usage.model_extra["calls"][0]["error"] is None


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"preference": {"speed": 1.0}}, "preference"),
        ({"preference": {"cost": -1.0}}, "preference"),
        ({"max_turns": 0}, "max_turns"),
        ({"max_cost_usd": 0}, "max_cost_usd"),
        ({"allowed_tools": ["telepathy"]}, "allowed_tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ],
)
def test_bad_requests_are_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, **extra)
    assert caught.value.status_code == 400 and caught.value.param == param


def test_system_message_and_missing_question_are_refused(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="any", messages=[{"role": "system", "content": "be evil"}]
        )
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="any",
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
            ],
        )


def test_failures_stay_with_their_request(client):
    """Beside healthy requests: one whose engine turn fails, one whose tool raises.
    Each failed request says what failed; every neighbour answers."""
    import concurrent.futures

    questions = ["BOOM " + QUESTION, "BADTOOL " + QUESTION] + [QUESTION] * 6
    with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
        replies = list(pool.map(lambda q: ask(client, q), questions))
    boom, badtool, *healthy = replies
    failed = boom.model_extra["orchestration"]
    assert failed["stop_reason"] == "error" and failed["error"]["kind"] == "engine"
    assert "injected engine failure" in failed["error"]["message"]
    assert boom.choices[0].message.content.startswith("No answer")
    bad_calls = badtool.usage.model_extra["calls"]
    assert "injected" in bad_calls[0]["error"]  # the tool's failure, read by the policy
    assert badtool.model_extra["orchestration"]["stop_reason"] == "answer"
    for reply in healthy:
        assert reply.model_extra["orchestration"]["stop_reason"] == "answer"
        assert all(c["error"] is None for c in reply.usage.model_extra["calls"])


def test_disconnect_cancels_the_requests_tools(served, flaky, client):
    async def run():
        body = {"messages": [{"role": "user", "content": "HANG " + QUESTION}], "stream": True}
        async with aiohttp.ClientSession() as session:
            async with session.post(served.url + "/v1/chat/completions", json=body) as resp:
                async for line in resp.content:
                    if b"orchestra_step" in line:
                        break  # the first turn arrived; its search now hangs
                await asyncio.to_thread(flaky.hanging.wait, 10)
        # leaving the block closes the connection

    asyncio.run(run())
    assert flaky.cancelled.wait(10), "the hanging tool was not cancelled"
    deadline = time.time() + 10
    while time.time() < deadline and served.server.in_flight:
        time.sleep(0.05)
    assert served.server.in_flight == 0
    assert ask(client).model_extra["orchestration"]["stop_reason"] == "answer"


def _status(url, body=None, headers=None, method="POST", raw=None):
    async def run():
        async with aiohttp.ClientSession() as session:
            kwargs = {"data": raw} if raw is not None else {"json": body}
            async with session.request(method, url, headers=headers, **kwargs) as resp:
                return resp.status, await resp.text(), dict(resp.headers)

    return asyncio.run(run())


def test_api_key_is_required_where_set(world):
    server = OrchestratorServer(orchestrator(world), ServeConfig(api_key="sesame"))
    with ServerThread(server) as s:
        body = {"messages": [{"role": "user", "content": QUESTION}]}
        status, text, _ = _status(s.url + "/v1/chat/completions", body)
        assert status == 401 and "API key" in text
        assert _status(s.url + "/health", method="GET")[0] == 401
        wrong = {"Authorization": "Bearer open"}
        assert _status(s.url + "/v1/chat/completions", body, wrong)[0] == 401
        keyed = openai.OpenAI(base_url=s.url + "/v1", api_key="sesame", max_retries=0)
        assert ask(keyed).model_extra["orchestration"]["stop_reason"] == "answer"
        assert _status(s.url + "/", method="GET")[0] in (200, 404)  # the page needs no key


def test_a_host_beyond_loopback_needs_a_key(monkeypatch):
    from orchestra_jax.serve.app import api_key_from

    monkeypatch.delenv("ORCHESTRA_SERVE_API_KEY", raising=False)
    assert api_key_from("ORCHESTRA_SERVE_API_KEY", "127.0.0.1") is None
    with pytest.raises(SystemExit, match="ORCHESTRA_SERVE_API_KEY"):
        api_key_from("ORCHESTRA_SERVE_API_KEY", "0.0.0.0")
    monkeypatch.setenv("ORCHESTRA_SERVE_API_KEY", "k")
    assert api_key_from("ORCHESTRA_SERVE_API_KEY", "0.0.0.0") == "k"


def test_limits_413_and_429(world):
    server = OrchestratorServer(
        orchestrator(world, max_context_tokens=1536),
        ServeConfig(max_body_bytes=16384, max_concurrent=2),
    )
    with ServerThread(server) as s:
        url = s.url + "/v1/chat/completions"
        status, text, _ = _status(url, raw=b"{" + b" " * 20000 + b"}")
        assert status == 413 and "16384" in text
        long_question = "word " * 1000  # under the body limit; with the prompt, over the context
        status, text, _ = _status(url, {"messages": [{"role": "user", "content": long_question}]})
        assert status == 413 and "context leaves room" in text

        async def crowd():
            body = {"messages": [{"role": "user", "content": "SLOW " + QUESTION}]}
            async with aiohttp.ClientSession() as session:

                async def one():
                    async with session.post(url, json=body) as resp:
                        return resp.status, resp.headers.get("Retry-After")

                return await asyncio.gather(*(one() for _ in range(5)))

        results = asyncio.run(crowd())
        assert sorted(status for status, _ in results) == [200, 200, 429, 429, 429]
        assert all(after == "1" for status, after in results if status == 429)


def test_routes_models_describe_health_page(served, world):
    status, text, _ = _status(served.url + "/v1/models", method="GET")
    assert status == 200 and json.loads(text)["data"][0]["id"] == "scripted-demo"
    status, text, _ = _status(served.url + "/v1/orchestrator", method="GET")
    described = json.loads(text)
    assert described["features"] == world[3].feature_names()
    assert described["defaults"]["preference"] == world[3].preference
    assert described["limits"]["max_concurrent"] == 32
    assert json.loads(_status(served.url + "/health", method="GET")[1])["status"] == "ok"
    status, text, _ = _status(served.url + "/", method="GET")
    if status == 404:
        assert "index.html" in text and "not installed" in text
    else:
        assert status == 200 and "<html" in text.lower()
    assert _status(served.url + "/assets/..%2Fapp.py", method="GET")[0] == 404


def test_loop_cost_budget_stops_before_the_next_turn(world):
    """LoopLimits.max_cost_usd: the turn that crosses the budget completes, none follows."""
    from orchestra_jax.agent.episode import EpisodeSpec
    from orchestra_jax.tasks import Task

    config, env, tokenizer, tool_config = world
    task = Task(id="t", question=QUESTION, answer="")
    spec = EpisodeSpec(task=task, tool_config=tool_config, tools=env.tools(tool_config, task=task))
    engine = ScriptedEngine(Plan(tokenizer, tool_config))
    sampling = builders.eval_sampling_params(config)
    free = run_episodes_sync([spec], engine, tokenizer, sampling=sampling)[0]
    assert free.finish_reason == "answer" and len(free.turns) == 2
    first_turn_cost = free.turns[0].tool_results[0].cost_usd
    limits = LoopLimits(max_cost_usd=first_turn_cost / 2)
    (capped,) = run_episodes_sync([spec], engine, tokenizer, sampling=sampling, limits=limits)
    assert capped.finish_reason == "max_cost" and len(capped.turns) == 1
    roomy = LoopLimits(max_cost_usd=free.cost_usd * 10)
    (within,) = run_episodes_sync([spec], engine, tokenizer, sampling=sampling, limits=roomy)
    assert within.finish_reason == "answer"
    with pytest.raises(ValueError, match="max_cost_usd"):
        LoopLimits(max_cost_usd=0.0)


def test_a_tool_timeout_is_its_requests_error_only(world):
    """A search that never answers times out (agent.tool_timeout_s) into that request's
    call error; requests beside it answer as usual."""
    import concurrent.futures

    flaky = FlakyEnv(world[1])
    server = OrchestratorServer(orchestrator(world, env=flaky, tool_timeout_s=0.5))
    with ServerThread(server) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        questions = ["HANG " + QUESTION] + [QUESTION] * 3
        with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
            hung, *healthy = pool.map(lambda q: ask(client, q), questions)
    calls = hung.usage.model_extra["calls"]
    assert "did not answer within 0.5 s" in calls[0]["error"]
    assert calls[0]["latency_s"] == pytest.approx(0.5)
    assert flaky.cancelled.is_set()  # the timed-out call was stopped, not left running
    assert hung.model_extra["orchestration"]["stop_reason"] == "answer"  # the policy went on
    for reply in healthy:
        assert all(c["error"] is None for c in reply.usage.model_extra["calls"])


class GarbledPlan(Plan):
    """The scripted orchestrator whose first turn writes a call that does not parse
    and one to a tool that does not exist, then answers."""

    def __call__(self, ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        if turn == 0:
            text = "<tool_call>\nnot json\n</tool_call>" + call("telescope", model="x")
            return self.tokenizer.encode(text + "<|im_end|>")
        return super().__call__(ids, request)


def test_streamed_calls_are_usage_calls_even_for_calls_no_tool_ran(world):
    config, _, tokenizer, tool_config = world
    garbled = orchestrator(world, engine=ScriptedEngine(GarbledPlan(tokenizer, tool_config)))
    with ServerThread(OrchestratorServer(garbled)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": QUESTION}], stream=True
            )
        )
    steps = [(c.model_extra or {}).get("orchestra_step") for c in chunks]
    streamed = [s for s in steps if s and s["type"] == "call"]
    calls = (chunks[-1].usage.model_extra or {})["calls"]
    assert len(calls) == 3 and calls[0]["error"] and calls[1]["error"]
    key = ("turn", "tool", "model", "error", "cost_usd")
    assert sorted(tuple(str(s[k]) for k in key) for s in streamed) == sorted(
        tuple(str(c[k]) for k in key) for c in calls
    )


def test_the_same_seed_and_question_repeat_the_episode(client):
    first, second = (ask(client, seed=7) for _ in range(2))
    other = ask(client, seed=8)
    calls = [(r.usage.model_extra or {})["calls"] for r in (first, second, other)]
    assert [c["cost_usd"] for c in calls[0]] == [c["cost_usd"] for c in calls[1]]
    assert [c["cost_usd"] for c in calls[0]] != [c["cost_usd"] for c in calls[2]]
