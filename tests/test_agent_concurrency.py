"""Episodes overlap: tools of different episodes (and of one turn) run at the same time,
and generation requests from different episodes share engine batches."""

import asyncio
import json
import time

import pytest

from orchestra_jax.agent.batcher import GenerationBatcher
from orchestra_jax.agent.loop import EpisodeSpec, LoopLimits, run_episodes_sync
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.rollout.engine import Completion, GenerateRequest, SamplingParams
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import ToolResult, function_schema

TOK = load_tokenizer("demo")


class SleepyTool:
    def __init__(self, name, sleep_s, final=False):
        self.name, self.sleep_s, self.final = name, sleep_s, final

    def schema(self):
        return function_schema(self.name, "sleeps", {}, [])

    async def __call__(self, arguments, ctx):
        await asyncio.sleep(self.sleep_s)
        return ToolResult(
            text="slept", latency_s=self.sleep_s, final_answer="done" if self.final else None
        )


class Config:
    orchestrator_price = 0.0
    preference = {}

    def __init__(self, tools):
        self._tools = tools

    def tool_schemas(self):
        return [t.schema() for t in self._tools]

    def system_prompt(self):
        return "sys"

    def feature_names(self):
        return [f"tool:{t.name}" for t in self._tools]


class BatchRecordingEngine(ScriptedEngine):
    def __init__(self, policy):
        super().__init__(policy)
        self.batch_sizes = []

    async def generate(self, requests):
        self.batch_sizes.append(len(requests))
        return await super().generate(requests)


def call(name):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': {}})}\n</tool_call><|im_end|>"


def test_n_episodes_of_k_tool_turns_take_about_k_tool_latencies():
    n, k, latency = 8, 3, 0.2
    tools = [SleepyTool("wait", latency), SleepyTool("answer", latency, final=True)]

    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        return TOK.encode(call("answer" if turn == k - 1 else "wait"))

    engine = BatchRecordingEngine(policy)
    specs = [
        EpisodeSpec(
            task=Task(id=f"t{i}", question="?", answer="done"),
            tool_config=Config(tools),
            tools=tools,
            seed=i,
        )
        for i in range(n)
    ]
    start = time.perf_counter()
    trajs = run_episodes_sync(specs, engine, TOK, sampling=SamplingParams())
    wall = time.perf_counter() - start
    assert all(t.finish_reason == "answer" and len(t.turns) == k for t in trajs)
    assert wall < 0.5 * n * k * latency, f"{wall:.2f} s: tools did not overlap"
    assert engine.batch_sizes[0] == n  # every episode's first turn in one batch
    assert sum(engine.batch_sizes) == n * k


def test_calls_of_one_turn_run_concurrently():
    latency = 0.3
    tools = [SleepyTool(f"t{j}", latency) for j in range(4)] + [SleepyTool("answer", 0, True)]
    many = "".join(call(f"t{j}").replace("<|im_end|>", "\n") for j in range(4)) + "<|im_end|>"
    engine = ScriptedEngine([TOK.encode(many), TOK.encode(call("answer"))])
    spec = EpisodeSpec(
        task=Task(id="t", question="?", answer="done"), tool_config=Config(tools), tools=tools
    )
    start = time.perf_counter()
    (traj,) = run_episodes_sync([spec], engine, TOK, sampling=SamplingParams())
    assert time.perf_counter() - start < 0.5 * 4 * latency
    assert len(traj.turns[0].tool_results) == 4 and traj.finish_reason == "answer"


def _request(i):
    return GenerateRequest(input_ids=[1, 2, 3], request_id=str(i))


class SlowEngine:
    """Counts concurrent generate calls; each takes `delay` seconds."""

    def __init__(self, delay=0.05, fail=False, short=False):
        self.delay, self.fail, self.short = delay, fail, short
        self.active = self.max_active = 0
        self.batches = []

    async def generate(self, requests):
        self.batches.append([r.request_id for r in requests])
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        await asyncio.sleep(self.delay)
        self.active -= 1
        if self.fail:
            raise ConnectionError("engine down")
        outs = [Completion([5], [-1.0], "stop", 3, 1, self.delay) for _ in requests]
        return outs[:-1] if self.short else outs


def _drive(batcher, n, stagger_s=0.0):
    async def episode(i):
        await asyncio.sleep(stagger_s * i)
        try:
            return await batcher.generate(_request(i))
        finally:
            batcher.episode_finished()

    async def main():
        for _ in range(n):
            batcher.episode_started()
        return await asyncio.gather(*(episode(i) for i in range(n)), return_exceptions=True)

    return asyncio.run(main())


def test_batcher_sends_one_batch_when_all_episodes_wait():
    engine = SlowEngine()
    outs = _drive(GenerationBatcher(engine, max_wait_s=10.0), 5)
    assert engine.batches == [["0", "1", "2", "3", "4"]]
    assert all(o.output_ids == [5] for o in outs)


def test_batcher_respects_batch_size_and_in_flight_limits():
    engine = SlowEngine()
    _drive(GenerationBatcher(engine, max_batch_size=2, max_in_flight=1), 5)
    assert [len(b) for b in engine.batches] == [2, 2, 1] and engine.max_active == 1
    engine = SlowEngine()
    _drive(GenerationBatcher(engine, max_batch_size=2, max_in_flight=3), 6)
    assert engine.max_active == 3


def test_batcher_does_not_wait_forever_for_busy_episodes():
    engine = SlowEngine(delay=0.0)
    _drive(GenerationBatcher(engine, max_wait_s=0.01), 3, stagger_s=0.2)
    assert [len(b) for b in engine.batches] == [1, 1, 1]


@pytest.mark.parametrize(
    "engine, error",
    [(SlowEngine(fail=True), ConnectionError), (SlowEngine(short=True), RuntimeError)],
)
def test_batcher_reports_engine_failures_to_every_request(engine, error):
    outs = _drive(GenerationBatcher(engine), 3)
    assert all(isinstance(o, error) for o in outs)


def test_batcher_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_batch_size"):
        GenerationBatcher(None, max_batch_size=0)
    with pytest.raises(ValueError, match="max_in_flight"):
        GenerationBatcher(None, max_in_flight=0)


class CountingTool(SleepyTool):
    """Counts the episodes inside a call at once (tools are where a flood queues)."""

    def __init__(self, name, sleep_s, final=False):
        super().__init__(name, sleep_s, final)
        self.active = self.max_active = 0

    async def __call__(self, arguments, ctx):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            return await super().__call__(arguments, ctx)
        finally:
            self.active -= 1


def _window_run(n, window):
    wait, answer = CountingTool("wait", 0.01), CountingTool("answer", 0.0, final=True)
    tools = [wait, answer]

    def policy(ids, request):
        turn = int(request.request_id.rsplit("/", 1)[1])
        return TOK.encode(call("answer" if turn == 1 else "wait"))

    engine = BatchRecordingEngine(policy)
    specs = [
        EpisodeSpec(
            task=Task(id=f"t{i}", question=f"q{i}?", answer="done"),
            tool_config=Config(tools),
            tools=tools,
            seed=i,
        )
        for i in range(n)
    ]
    trajs = run_episodes_sync(
        specs,
        engine,
        TOK,
        sampling=SamplingParams(),
        limits=LoopLimits(max_concurrent_episodes=window),
    )
    return trajs, wait.max_active, engine.batch_sizes


def test_episode_window_bounds_concurrent_episodes_and_keeps_results():
    unbounded, most_at_once, batches = _window_run(10, None)
    assert most_at_once == 10 and batches[0] == 10
    windowed, most_at_once, batches = _window_run(10, 3)
    assert most_at_once == 3
    assert batches[0] == 3  # the first batch waits for the window's episodes, not all ten
    assert sum(batches) == 20  # two turns per episode, none lost or repeated
    assert [t.task_id for t in windowed] == [f"t{i}" for i in range(10)]  # specs order
    assert [t.token_ids for t in windowed] == [t.token_ids for t in unbounded]
    assert all(t.finish_reason == "answer" for t in windowed)


def test_episode_window_larger_than_the_episodes_and_bad_values():
    trajs, most_at_once, _ = _window_run(4, 100)
    assert most_at_once == 4 and len(trajs) == 4
    assert (
        run_episodes_sync(
            [],
            ScriptedEngine([]),
            TOK,
            sampling=SamplingParams(),
            limits=LoopLimits(max_concurrent_episodes=2),
        )
        == []
    )
    with pytest.raises(ValueError, match="max_concurrent_episodes"):
        _window_run(2, -1)
