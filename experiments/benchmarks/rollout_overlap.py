"""rollout_overlap: how much simulated tool latency the agent loop hides, and episodes/s.

    python -m experiments.benchmarks.rollout_overlap [--quick]

Set-up: the demo Qwen3 (random weights) in the in-process `JaxEngine`, the demo
tokenizer, N episodes of K turns. Each turn really decodes `gen_tokens` tokens
with the model; `ScriptedCallsOver` then hands the loop a scripted tool call as
the turn's text (a random model writes no valid calls), so every turn runs one
tool. The tool sleeps L * u seconds, u ~ Uniform(0.5, 1.5) seeded per episode
and turn, so all loop variants wait for the same latencies.

Figure: hidden fraction = 1 - (W(L) - W(0)) / sum of tool latencies, where W is
the wall time of the whole batch of episodes with and without tool latency
(sequential tool time would be the sum; the loop only exposes what it cannot
overlap with generation and with other episodes' tools). Episodes/s = N / W(L).

Variants, timed alternately (medians over repeats):
  ours        run_episodes defaults: a request is sent once every free episode
              waits, or after `batch_wait_s`; many engine calls in flight, so the
              continuous-batching engine admits late episodes into free slots.
  ours_one_in_flight  the same with one engine call in flight at a time.
  lockstep    the peer: the same loop forced into synchronous rounds (generate
              for all, then all tools, wait for the slowest; the usual batched
              multi-turn rollout): batch_wait_s=inf, one engine call in flight.
  sequential  one episode after another (what hiding nothing looks like; --sequential).

Second section, `demo_config`: episodes/s of the `demo` config of
experiments/configs/grpo_hle.py (G x tasks_per_step synthetic tasks, the real
offline tools, its turn and token limits) with the random-weight demo model,
ours against lockstep. A random model writes no valid calls, so this measures
the loop's and engine's throughput, not tool overlap.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import statistics
import time

import numpy as np
from flax import nnx

from experiments.benchmarks.common import RESULTS_DIR, write_result
from orchestra_jax.agent.loop import EpisodeSpec, LoopLimits, derive_seed, run_episodes
from orchestra_jax.chat.tokenizer import load_tokenizer
from orchestra_jax.models.qwen3.config import Qwen3Config
from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM
from orchestra_jax.rollout.engine import Completion, SamplingParams
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig
from orchestra_jax.tasks import Task
from orchestra_jax.tools.base import ToolResult, function_schema

VARIANTS = {
    "ours": dict(),
    "ours_one_in_flight": dict(max_in_flight_batches=1),
    "lockstep": dict(batch_wait_s=1e9, max_in_flight_batches=1),
}


class SleepTool:
    """Sleeps latency_s * u, u ~ U(0.5, 1.5) from (episode seed, turn); answers on `final`."""

    def __init__(self, name: str, latency_s: float, final: bool = False):
        self.name, self.latency_s, self.final = name, latency_s, final

    def schema(self):
        return function_schema(self.name, "waits like a remote tool", {}, [])

    async def __call__(self, arguments, ctx):
        turn = sum(m["role"] == "assistant" for m in ctx.messages)
        u = np.random.default_rng(derive_seed(ctx.seed, turn)).uniform(0.5, 1.5)
        delay = self.latency_s * u
        await asyncio.sleep(delay)
        return ToolResult(
            text="waited", latency_s=delay, final_answer="done" if self.final else None
        )


class BenchConfig:
    """The ToolConfig methods the loop reads, for the two sleeping tools."""

    orchestrator_price = 0.2
    preference = {"accuracy": 1.0}

    def __init__(self, tools):
        self._tools = tools

    def tool_schemas(self):
        return [t.schema() for t in self._tools]

    def system_prompt(self):
        return "Call `work` until the last turn, then `answer`."

    def feature_names(self):
        return ["accuracy", "cost", "latency"] + [f"tool:{t.name}" for t in self._tools]


class ScriptedCallsOver:
    """Runs the real engine for `gen_tokens` tokens per request, then returns a scripted call."""

    def __init__(self, engine, tokenizer, gen_tokens: int, turns: int):
        self.engine, self.gen_tokens, self.turns = engine, gen_tokens, turns
        call = '<tool_call>\n{{"name": "{}", "arguments": {{}}}}\n</tool_call><|im_end|>'
        self.work_ids = tokenizer.encode(call.format("work"))
        self.answer_ids = tokenizer.encode(call.format("answer"))

    async def generate(self, requests):
        forced = [
            dataclasses.replace(
                r,
                sampling=dataclasses.replace(
                    r.sampling, max_new_tokens=self.gen_tokens, stop_token_ids=()
                ),
            )
            for r in requests
        ]
        real = await self.engine.generate(forced)
        out = []
        for request, completion in zip(requests, real):
            turn = int(request.request_id.rsplit("/", 1)[1])
            ids = self.answer_ids if turn == self.turns - 1 else self.work_ids
            out.append(
                Completion(
                    list(ids),
                    [0.0] * len(ids),
                    "stop",
                    len(request.input_ids),
                    len(ids),
                    completion.latency_s,
                )
            )
        return out


def make_specs(n: int, latency_s: float) -> list[EpisodeSpec]:
    tools = [SleepTool("work", latency_s), SleepTool("answer", latency_s, final=True)]
    config = BenchConfig(tools)
    return [
        EpisodeSpec(
            task=Task(id=f"t{i // 8}", question=f"Task {i // 8}: finish it.", answer="done"),
            tool_config=config,
            tools=tools,
            group_index=i % 8,
            seed=i,
        )
        for i in range(n)
    ]


async def timed_run(variant: str, specs, engine, tokenizer, turns: int, max_new: int):
    sampling = SamplingParams(temperature=1.0)
    limits = LoopLimits(max_turns=turns, max_new_tokens_per_turn=max_new, max_context_tokens=4096)
    start = time.perf_counter()
    if variant == "sequential":
        trajs = [
            t
            for spec in specs
            for t in await run_episodes([spec], engine, tokenizer, sampling=sampling, limits=limits)
        ]
    else:
        limits = dataclasses.replace(limits, **VARIANTS[variant])
        trajs = await run_episodes(specs, engine, tokenizer, sampling=sampling, limits=limits)
    wall = time.perf_counter() - start
    assert all(t.finish_reason == "answer" and len(t.turns) == turns for t in trajs), [
        (t.finish_reason, len(t.turns)) for t in trajs
    ]
    return wall, sum(turn.tool_latency_s for t in trajs for turn in t.turns)


async def measure(args) -> dict:
    tokenizer = load_tokenizer("demo")
    model = Qwen3ForCausalLM(Qwen3Config.preset("demo"), rngs=nnx.Rngs(0))
    jax_engine = JaxEngine(model, JaxEngineConfig(max_batch_size=args.episodes, max_seq_len=4096))
    engine = ScriptedCallsOver(jax_engine, tokenizer, args.gen_tokens, args.turns)
    max_new = max(len(engine.work_ids), len(engine.answer_ids))
    with_tools = make_specs(args.episodes, args.latency)
    without = make_specs(args.episodes, 0.0)
    variants = list(VARIANTS) + (["sequential"] if args.sequential else [])
    # Staggered arrivals hit prefill row buckets 1, 2, 4, ...: compile them all before timing.
    for passes in range(1, 7):  # noqa: B007 (reported after the loop)
        before = sum(jax_engine.compile_counts.values())
        for v in variants:
            for specs in (with_tools, without):
                await timed_run(v, specs, engine, tokenizer, args.turns, max_new)
        if sum(jax_engine.compile_counts.values()) == before:
            break
    print(f"warm after {passes} passes: {dict(jax_engine.compile_counts)}", flush=True)
    compiles_after_warmup = sum(jax_engine.compile_counts.values())
    runs = {
        v: {"wall_with_tools_s": [], "wall_without_tools_s": [], "tool_latency_sum_s": []}
        for v in variants
    }
    for rep in range(args.repeats):
        for v in variants:  # alternate: ours, peer, ours, peer, ...
            wall, tool_sum = await timed_run(v, with_tools, engine, tokenizer, args.turns, max_new)
            wall0, _ = await timed_run(v, without, engine, tokenizer, args.turns, max_new)
            runs[v]["wall_with_tools_s"].append(wall)
            runs[v]["wall_without_tools_s"].append(wall0)
            runs[v]["tool_latency_sum_s"].append(tool_sum)
            print(
                f"rep {rep} {v:10s} W(L)={wall:6.2f}s W(0)={wall0:6.2f}s "
                f"tools={tool_sum:6.1f}s hidden={1 - (wall - wall0) / tool_sum:.3f}",
                flush=True,
            )
    recompiles = sum(jax_engine.compile_counts.values()) - compiles_after_warmup
    jax_engine.close()
    figures = {}
    for v, r in runs.items():
        w, w0 = (
            statistics.median(r["wall_with_tools_s"]),
            statistics.median(r["wall_without_tools_s"]),
        )
        tool_sum = statistics.median(r["tool_latency_sum_s"])
        figures[v] = {
            **r,
            "median_wall_with_tools_s": w,
            "median_wall_without_tools_s": w0,
            "hidden_fraction": 1 - (w - w0) / tool_sum,
            "episodes_per_s": args.episodes / w,
        }
    return {
        "settings": {
            "episodes": args.episodes,
            "turns": args.turns,
            "tool_latency_s": args.latency,
            "tool_latency_spread": "uniform(0.5, 1.5) x L",
            "gen_tokens_per_turn": args.gen_tokens,
            "model": "Qwen3 demo preset, random weights",
            "engine": "JaxEngine (continuous batching)",
            "repeats": args.repeats,
            "compiles_during_timing": recompiles,
        },
        "figures": figures,
        "ours_over_lockstep_episodes_per_s": (
            figures["ours"]["episodes_per_s"] / figures["lockstep"]["episodes_per_s"]
        ),
        "target_hidden_fraction": 0.9,
    }


async def measure_demo(args) -> dict:
    """Episodes/s of the `demo` config: synthetic tasks, real tools, the random demo model."""
    from experiments.configs.grpo_hle import get_config
    from orchestra_jax.agent.loop import make_group_specs
    from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv

    cfg = get_config("demo")
    env = SyntheticOrchestrationEnv(0, num_entities=cfg.data.synthetic_num_entities)
    tasks = env.tasks("train", cfg.rl.tasks_per_step)
    config = env.default_tool_config()
    specs = make_group_specs(
        tasks, [config] * len(tasks), cfg.rl.group_size, seed=0, backends=env.build_backends(config)
    )
    tokenizer = load_tokenizer(cfg.tokenizer)
    model = Qwen3ForCausalLM(Qwen3Config.preset(cfg.model.preset), rngs=nnx.Rngs(0))
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=cfg.rollout.max_batch_size, max_seq_len=cfg.rollout.max_seq_len
        ),
    )
    sampling = SamplingParams(temperature=cfg.rollout.temperature)
    limits = LoopLimits(
        max_turns=cfg.agent.max_turns,
        max_context_tokens=cfg.agent.max_context_tokens,
        max_new_tokens_per_turn=cfg.agent.max_new_tokens_per_turn,
        tool_timeout_s=cfg.agent.tool_timeout_s,
        enable_thinking=cfg.agent.enable_thinking,
    )
    walls = {v: [] for v in ("ours", "lockstep")}
    compiles = {v: 0 for v in walls}  # new (rows, length) buckets met during timed runs
    for rep in range(-1, args.demo_repeats):  # rep -1 compiles what it meets, untimed
        for v in walls:
            before = sum(engine.compile_counts.values())
            start = time.perf_counter()
            trajs = await run_episodes(
                specs,
                engine,
                tokenizer,
                sampling=sampling,
                limits=dataclasses.replace(limits, **VARIANTS[v]),
            )
            wall = time.perf_counter() - start
            new = sum(engine.compile_counts.values()) - before
            if rep >= 0:
                walls[v].append(wall)
                compiles[v] += new
            print(
                f"demo rep {rep} {v:10s} {len(trajs) / wall:.2f} episodes/s, {new} compiles",
                flush=True,
            )
    engine.close()
    finishes = collections.Counter(t.finish_reason for t in trajs)
    return {
        "settings": {
            "episodes": len(specs),
            "max_turns": cfg.agent.max_turns,
            "max_new_tokens_per_turn": cfg.agent.max_new_tokens_per_turn,
            "max_context_tokens": cfg.agent.max_context_tokens,
            "prompt_tokens": trajs[0].prompt_length,
            "model": "demo preset, random weights (writes no valid calls)",
            "finish_reasons": dict(finishes),
        },
        "figures": {
            v: {
                "wall_s": w,
                "episodes_per_s": len(specs) / statistics.median(w),
                "compiles_during_timing": compiles[v],
            }
            for v, w in walls.items()
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--latency", type=float, default=1.0, help="mean tool latency L (s)")
    parser.add_argument("--gen-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sequential", action="store_true", help="also time one-at-a-time")
    parser.add_argument(
        "--demo-repeats",
        type=int,
        default=2,
        help="timed runs of the demo-config section (0 skips it)",
    )
    parser.add_argument(
        "--demo-only",
        action="store_true",
        help="rerun only the demo section, keeping the stored overlap figures",
    )
    parser.add_argument("--quick", action="store_true", help="tiny settings, no JSON written")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.turns, args.latency, args.repeats, args.demo_repeats = 4, 2, 0.2, 1, 0
    if args.demo_only:  # keep the overlap section of the last full run, redo this one
        payload = json.loads((RESULTS_DIR / "rollout_overlap.json").read_text())
        for key in ("benchmark", "date_utc", "machine"):
            payload.pop(key, None)
    else:
        payload = asyncio.run(measure(args))
        payload["overlap_section_date_utc"] = time.strftime(
            "%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()
        )
    if args.demo_repeats:
        payload["demo_config"] = asyncio.run(measure_demo(args))
    print(
        json.dumps(
            {
                v: {k: f[k] for k in ("hidden_fraction", "episodes_per_s")}
                for v, f in payload["figures"].items()
            },
            indent=1,
        )
    )
    if not args.quick:
        print(write_result("rollout_overlap", payload))


if __name__ == "__main__":
    main()
