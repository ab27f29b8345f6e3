"""The orchestrator service against experiments.evaluate's loop: requests/s, time to first step.

    python -m experiments.benchmarks.serve [--tasks 32] [--users 1,8,32] [--sft-steps 40]

The workload is the demo's: its policy after a short warm start (`--sft-steps`
behaviour-cloning steps, so that it calls tools), on the demo's JAX engine, its
synthetic world (simulated experts answer at once: `sleep_scale` 0), and
`--tasks` of the held-out tasks `experiments.evaluate` plays, each with the
service's default tool configuration (the evaluation protocol's first) and the
evaluation's sampling and limits.

Ours: `python -m orchestra_jax.serve`'s server (`serve.app`, in a thread of this
process) with `--users` clients each sending its share of the tasks as streamed
chat completions one after another, over loopback HTTP, from a client process of
their own (this module with `--client`), as users' clients are. Peer: the same episodes as
`experiments.evaluate` plays them (`Evaluator.play`: `run_graded_episodes`, the
agent loop with its batcher), at most `users` episodes at a time
(`agent.max_concurrent_episodes`). Both share one engine, alternately (ours, peer)
per concurrency, after a warm-up round that compiles the shapes.

Reported per concurrency: requests (episodes) per second over the round, and the
time to first step: for ours, from sending a request to receiving its first
`orchestra_step` event (the first turn generated); for the peer, from the
episode's first turn reaching the engine to its completion (the loop's own time to
its first step, without HTTP). Writes experiments/benchmarks/results/serve.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

from experiments.benchmarks import common
from experiments.configs import grpo_hle
from orchestra_jax.serve.app import OrchestratorServer, ServeConfig, ServerThread
from orchestra_jax.serve.build import default_tool_config
from orchestra_jax.serve.service import Orchestrator
from orchestra_jax.training import experiment, loop_steps
from orchestra_jax.training.evaluation import Evaluator
from orchestra_jax.training.run_sync import run_sync


class FirstTurns:
    """The engine, recording when each episode's first turn was sent and returned."""

    def __init__(self, engine):
        self.engine = engine
        self.sent: dict[str, float] = {}
        self.first: list[float] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, requests):
        now = time.perf_counter()
        firsts = [r for r in requests if r.request_id and r.request_id.endswith("/0")]
        for r in firsts:
            self.sent[r.request_id] = now
        completions = await self.engine.generate(requests)
        done = time.perf_counter()
        self.first += [done - self.sent[r.request_id] for r in firsts]
        return completions


def peer_round(evaluator: Evaluator, engine, users: int) -> dict:
    """experiments.evaluate's loop on the evaluator's tasks, `users` episodes at a time."""
    limits = dataclasses.replace(evaluator.episodes.limits, max_concurrent_episodes=users)
    evaluator.episodes = dataclasses.replace(evaluator.episodes, limits=limits)
    recorder = FirstTurns(engine)
    start = time.perf_counter()
    played = run_sync(evaluator.play(recorder))
    wall = time.perf_counter() - start
    return {
        "requests": len(played),
        "wall_s": wall,
        "requests_per_s": len(played) / wall,
        "first_step_s": _stats(recorder.first),
        "answered": sum(t.finish_reason == "answer" for t in played),
    }


async def _ours(url: str, questions: list[str], users: int, preference: dict) -> dict:
    queue = list(enumerate(questions))
    first, answered = [], [0]

    async def user(session):
        while queue:
            seed, question = queue.pop(0)
            body = {
                "messages": [{"role": "user", "content": question}],
                "stream": True,
                "seed": seed,
                "preference": preference,
            }
            sent = time.perf_counter()
            got_first = None
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"{resp.status}: {await resp.text()}")
                async for line in resp.content:
                    if got_first is None and b'"orchestra_step"' in line:
                        got_first = time.perf_counter() - sent
                    if line.startswith(b"data: {") and b'"finish_reason":"stop"' in line:
                        event = json.loads(line[6:])
                        if (event.get("orchestration") or {}).get("stop_reason") == "answer":
                            answered[0] += 1
            if got_first is not None:
                first.append(got_first)

    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.gather(*(user(session) for _ in range(users)))
        wall = time.perf_counter() - start
    return {
        "requests": len(questions),
        "wall_s": wall,
        "requests_per_s": len(questions) / wall,
        "first_step_s": _stats(first),
        "answered": answered[0],
    }


def ours_round(url: str, questions: list[str], users: int, preference: dict) -> dict:
    """`_ours` in a client process of its own (this module with --client)."""
    job = json.dumps({"url": url, "questions": questions, "users": users, "preference": preference})
    done = subprocess.run(
        [sys.executable, "-m", "experiments.benchmarks.serve", "--client"],
        input=job,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the client process failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _client() -> None:
    job = json.loads(sys.stdin.read())
    result = asyncio.run(_ours(job["url"], job["questions"], job["users"], job["preference"]))
    print(json.dumps(result))


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
        "n": len(ordered),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--users", default="1,8,32")
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--client", action="store_true", help="(internal) the client process")
    args = parser.parse_args(argv)
    if args.client:
        return _client()
    users = [int(u) for u in args.users.split(",")]
    config = grpo_hle.get_config("demo")
    config.sft.steps = args.sft_steps
    config.eval.num_tasks = args.tasks
    config.workdir = tempfile.mkdtemp(prefix="serve_bench_")
    run = loop_steps.setup_run(config)
    if args.sft_steps:
        experiment.run_warm_start(config, run)
    evaluator = experiment.build_evaluator(config, None, run.tokenizer)
    env = evaluator.episodes.env
    tool_config = default_tool_config(config, env)
    evaluator.tool_configs = {t.id: tool_config for t in evaluator.tasks}
    evaluator.episodes = dataclasses.replace(evaluator.episodes, engine=None)
    orchestrator = Orchestrator(
        engine=run.engine,
        tokenizer=run.tokenizer,
        env=env,
        tool_config=tool_config,
        sampling=evaluator.episodes.sampling,
        limits=evaluator.episodes.limits,
        name="demo",
    )
    questions = [t.question for t in evaluator.tasks]
    results = {}
    server = ServerThread(OrchestratorServer(orchestrator, ServeConfig(max_concurrent=max(users))))
    try:
        url = server.url
        ours_round(url, questions[: max(users)], max(users), tool_config.preference)
        peer_round(evaluator, run.engine, max(users))  # warm-up: compiles
        for n in users:
            ours = ours_round(url, questions, n, tool_config.preference)
            peer = peer_round(evaluator, run.engine, n)
            results[str(n)] = {"ours": ours, "peer": peer}
            print(
                f"users {n:2d}: service {ours['requests_per_s']:.2f} req/s, first step "
                f"{ours['first_step_s'].get('median', float('nan')):.3f} s | evaluate loop "
                f"{peer['requests_per_s']:.2f} ep/s, first step "
                f"{peer['first_step_s'].get('median', float('nan')):.3f} s",
                flush=True,
            )
    finally:
        server.stop()
        run.engine.close()
    path = common.write_result(
        "serve",
        {
            "workload": {
                "config": "demo",
                "sft_steps": args.sft_steps,
                "tasks": len(questions),
                "engine": "jax",
                "max_batch_size": config.rollout.max_batch_size,
                "max_turns": config.agent.max_turns,
                "max_new_tokens_per_turn": config.agent.max_new_tokens_per_turn,
                "temperature": config.eval.temperature,
                "tool_config": tool_config.name,
                "load_average": os.getloadavg(),
            },
            "ours": "orchestra_jax.serve over loopback HTTP, streamed, `users` clients in a "
            "process of their own",
            "peer": "experiments.evaluate's loop (Evaluator.play), max_concurrent_episodes=users",
            "results": results,
        },
    )
    print(path)


if __name__ == "__main__":
    main()
