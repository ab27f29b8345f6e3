"""Prefix caching in JaxEngine: multi-turn GRPO rollouts with KV reuse on vs off.

    python -m experiments.benchmarks.prefix_cache [--repeats 3] [--tasks 8] [--group 4]

The workload has the shape of the demo's rollouts: `tasks` tasks, each with its
own ~600-token prompt (random ids, nothing shared between tasks, so only what
the demo's episodes surely share is reused), and `group` episodes per task
(the GRPO group, same prompt, own seed). Every episode runs `turns` turns: the
engine samples `new_tokens` tokens (temperature 1, no stop ids, so both sides
generate exactly the same amount), then a ~60-token tool response is appended
and the next turn's prompt is the whole sequence so far. All episodes' turns go
to the engine together, as the agent loop's batcher hands them over.

Ours: JaxEngine(prefix_cache=True). Peer: the same engine with prefix_cache=False
(today's behaviour: every turn re-prefills its whole prompt). Both engines run
the demo config's model (`experiments/configs/grpo_hle.py` "demo": the demo
preset halved, float32, random weights) and its rollout batch (64 slots,
1536-token context). Before every run both engines get `update_weights` (as
after a learner step), which invalidates parked rows, so no run reuses
another's cache. Runs alternate (ours, peer, ...) in one process; medians.
Reported: wall time per workload, prompt tokens computed / reused, speedup,
and whether both produced the same tokens. Writes
experiments/benchmarks/results/prefix_cache.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import jax
import numpy as np
from flax import nnx

from experiments.benchmarks import common
from experiments.configs import grpo_hle
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig

PROMPT_LEN, TOOL_LEN = 600, 60


def episodes(tasks: int, group: int, turns: int, vocab: int, seed: int = 0):
    """Per episode: its prompt, its tool responses (one per turn after the first), seed."""
    rng = np.random.default_rng(seed)
    out = []
    for task in range(tasks):
        prompt = rng.integers(3, vocab, PROMPT_LEN + int(rng.integers(-40, 40))).tolist()
        for member in range(group):
            tools = [
                rng.integers(3, vocab, TOOL_LEN + int(rng.integers(-10, 10))).tolist()
                for _ in range(turns - 1)
            ]
            out.append((prompt, tools, task * group + member))
    return out


def run_workload(engine, workload, turns: int, new_tokens: int):
    """All episodes turn by turn; returns every episode's generated ids per turn."""
    sequences = [list(prompt) for prompt, _, _ in workload]
    outputs = [[] for _ in workload]
    for turn in range(turns):
        requests = [
            GenerateRequest(
                seq,
                SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=1000 * seed + turn),
            )
            for seq, (_, _, seed) in zip(sequences, workload)
        ]
        completions = asyncio.run(engine.generate(requests))
        for i, c in enumerate(completions):
            assert c.completion_tokens == new_tokens
            outputs[i].append(c.output_ids)
            sequences[i] = sequences[i] + c.output_ids
            if turn + 1 < turns:
                sequences[i] += workload[i][1][turn]
    return outputs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=30)
    args = parser.parse_args(argv)
    demo = grpo_hle.get_config("demo")
    config = Qwen3Config.preset(demo.model.preset, **dict(demo.model.overrides))
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    shape = dict(max_batch_size=demo.rollout.max_batch_size, max_seq_len=demo.rollout.max_seq_len)
    engines = {
        "prefix_cache": JaxEngine(model, JaxEngineConfig(prefix_cache=True, **shape)),
        "no_prefix_cache": JaxEngine(model, JaxEngineConfig(prefix_cache=False, **shape)),
    }
    workload = episodes(args.tasks, args.group, args.turns, config.vocab_size)
    results, stats, version = {}, {}, [0]

    def timed(name):
        engine = engines[name]

        def run():
            version[0] += 1  # new weights: parked rows from the last run are dropped
            asyncio.run(engine.update_weights(state, version=version[0]))
            before = dict(engine.prefix_cache_stats)
            results[name] = run_workload(engine, workload, args.turns, args.new_tokens)
            stats[name] = {
                k: v - before.get(k, 0)
                for k, v in engine.prefix_cache_stats.items()
                if k != "parked_invalidated"
            }

        return run

    fns = {name: timed(name) for name in engines}
    for _ in range(2):  # compile every bucket, untimed; the second run starts with a grown
        for fn in fns.values():  # cache, as every later one does
            fn()
    compiles_before = {n: sum(e.compile_counts.values()) for n, e in engines.items()}
    load_before = os.getloadavg()[0]
    timings = common.alternate_timings(fns, repeats=args.repeats, warmup=0)
    load_after = os.getloadavg()[0]
    summary = common.summarize(timings)
    same = sum(a == b for a, b in zip(results["prefix_cache"], results["no_prefix_cache"]))
    result = {
        "model": f"Qwen3 demo config (preset {demo.model.preset!r} with "
        f"{dict(demo.model.overrides)}), float32, random weights",
        "engine": {**shape, "steps_per_call": 16},
        "workload": {
            "tasks": args.tasks,
            "group": args.group,
            "episodes": len(workload),
            "turns": args.turns,
            "prompt_len": f"{PROMPT_LEN} +- 40",
            "tool_response_len": f"{TOOL_LEN} +- 10",
            "new_tokens_per_turn": args.new_tokens,
            "temperature": 1.0,
        },
        "timings": summary,
        "prompt_tokens_per_workload": stats,
        "speedup": summary["no_prefix_cache"]["median_s"] / summary["prefix_cache"]["median_s"],
        "episodes_with_identical_tokens": f"{same}/{len(workload)}",
        "recompiles_during_timing": {
            n: sum(e.compile_counts.values()) - compiles_before[n] for n, e in engines.items()
        },
        "load_average_1m": {"before_timing": load_before, "after_timing": load_after},
        "compile_counts": {n: dict(e.compile_counts) for n, e in engines.items()},
        "jax_backend": jax.default_backend(),
    }
    for engine in engines.values():
        engine.close()
    path = common.write_result("prefix_cache", result)
    for name in engines:
        s = stats[name]
        print(
            f"{name}: median {summary[name]['median_s']:.2f} s, prompt tokens computed "
            f"{s['prompt_tokens_computed']}, reused {s['prompt_tokens_reused']}"
        )
    print(
        f"speedup x{result['speedup']:.2f}; identical tokens in "
        f"{result['episodes_with_identical_tokens']} episodes; wrote {path}"
    )


if __name__ == "__main__":
    main()
