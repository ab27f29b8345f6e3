"""The reference's context and sample unit against the project's, on the live path.

    python -m experiments.benchmarks.reference_recipe --steps 4

The `live_tiny` run (the project's server hosting a tiny random model on loopback as
every expert and the judge, a BM25 index of the shipped corpus, FRAMES rows) under
three settings, each its own run from the same initial weights:

    history/episode   agent.context="history", rl.sample_unit="episode" (the default)
    rebuild/turn      agent.context="rebuild", rl.sample_unit="turn",
                      rl.minibatch_size=16 (the reference's), rl.pack
    rebuild/turn, shared prefixes
                      the same with rl.share_prefixes (qwen3_8b's: turns that begin
                      alike keep one copy of their common start, rl/prefix_packing.py)

Both train whole batches of rows (rl.share_prompts off), on a seeded random reward
so that every group trains (a random policy answers nothing right). Steps are timed
alternately (history step 1, rebuild step 1, history step 2, ...); the first step of
each, which compiles, is left out of the medians. Per setting: tokens per episode
(its token ids: the growing sequence, or its turns' prompts and replies end to end)
and generated tokens per episode, the learner's samples, tokens (the samples' own)
the positions the learner runs (written, and rows x length) per step, updates per step, the learner's compiled steps so far,
and the step's, the rollouts' and the learner's seconds (a step whose batch
has a shape not seen before compiles the learner again: the learner's median is
also given over the timed steps without a compile). Writes
`experiments/benchmarks/results/reference_recipe.json`.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import yaml

from experiments.benchmarks import common
from experiments.configs import grpo_hle
from orchestra_jax.rl.samples import samples_of
from orchestra_jax.tools import build_index
from orchestra_jax.training import loop_steps
from orchestra_jax.training.experiment_config import validate
from orchestra_jax.training.run_sync import run_sync

SETTINGS = {
    "history/episode": {},
    "rebuild/turn": {
        "agent.context": "rebuild",
        "rl.sample_unit": "turn",
        "rl.minibatch_size": 16,
        "rl.pack": True,
        "rl.share_prefixes": False,
    },
    "rebuild/turn, shared prefixes": {
        "agent.context": "rebuild",
        "rl.sample_unit": "turn",
        "rl.minibatch_size": 16,
        "rl.pack": True,
        "rl.share_prefixes": True,
    },
}


class SeededReward:
    """Normal noise per episode from a seeded generator: every group has a ranking."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def __call__(self, features, correct, preference):
        del correct, preference
        return self.rng.normal(size=len(features)).astype(np.float32)


def start_stack(tmp: str, port: int):
    """The project's server (a random `demo` model) and a BM25 index; the catalogue
    pointing every model at the server."""
    corpus = os.path.join(grpo_hle.REPO_DIR, "experiments", "data", "live_tiny_corpus.jsonl")
    build_index.main(["--corpus", corpus, "--out", os.path.join(tmp, "index")])
    log = open(os.path.join(tmp, "server.log"), "w")  # noqa: SIM115 - the process owns it
    server = subprocess.Popen(
        [sys.executable, "-m", "orchestra_jax.rollout.server", "--model", "demo"]
        + ["--tokenizer", "demo", "--host", "127.0.0.1", "--port", str(port)],
        cwd=grpo_hle.REPO_DIR,
        env={**os.environ, "XLA_FLAGS": "", "PYTHONPATH": grpo_hle.REPO_DIR},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server at {url} did not start (see {log.name})")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                break
        except OSError:
            time.sleep(0.5)
    catalogue = yaml.safe_load(open(grpo_hle.LOCAL_CATALOGUE))
    for model in catalogue["models"]:
        model["base_url"] = url + "/v1"
    path = os.path.join(tmp, "models.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(catalogue, f)
    return server, path, url


def live_config(tmp: str, name: str, catalogue: str, url: str, steps: int):
    config = grpo_hle.get_config("live_tiny")
    config.workdir = os.path.join(tmp, name.replace("/", "_"))
    config.tools.catalogue = catalogue
    config.tools.search_index = os.path.join(tmp, "index")
    config.reward.judge.base_url = url + "/v1"
    config.num_steps = steps
    config.rl.share_prompts = False
    config.rl.warmup_steps = 0  # rl.minibatch_size makes the updates a step vary
    for key, value in SETTINGS[name].items():
        section, field = key.split(".")
        config[section][field] = value
    validate(config)
    return config


def one_step(run, iterator, step: int) -> dict:
    """One GRPO step as `grpo_loop.grpo_train` makes it, with its figures."""
    compiles = sum(f._cache_size() for f in run.learner._compiled.values())
    start = time.perf_counter()
    tasks = next(iterator)
    experience = run_sync(loop_steps.collect_experience(run, tasks, step))
    rolled = time.perf_counter()
    learner = loop_steps.train_step(run, experience)
    trained = time.perf_counter()
    run_sync(loop_steps.sync_weights(run, step + 1))
    end = time.perf_counter()
    trajs = experience.trajectories
    samples = samples_of(run.sections.rl.sample_unit, experience.kept)
    rows, length = learner.get("learner/batch_rows", 0), learner.get("learner/batch_len", 0)
    return {
        "step_s": end - start,
        "rollout_s": rolled - start,
        "learner_s": trained - rolled,
        "episodes": len(trajs),
        "turns_per_episode": statistics.mean(len(t.turns) for t in trajs),
        "tokens_per_episode": statistics.mean(len(t.token_ids) for t in trajs),
        "generated_tokens_per_episode": statistics.mean(
            sum(turn.num_generated_tokens for turn in t.turns) for t in trajs
        ),
        "learner_samples": len(samples),
        "learner_tokens": sum(len(s.token_ids) for s in samples),
        "learner_written_positions": learner.get("learner/written_positions", 0.0),
        "learner_padded_tokens": int(rows * length),
        "updates": learner.get("learner/updates", 0.0),
        "learner_compiles": sum(f._cache_size() for f in run.learner._compiled.values()),
        "learner_compiled": float(
            sum(f._cache_size() for f in run.learner._compiled.values()) > compiles
        ),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="per setting, the first untimed")
    parser.add_argument("--port", type=int, default=30117)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    load_before = os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="reference_recipe_")
    server, catalogue, url = start_stack(tmp, args.port)
    try:
        runs, iterators = {}, {}
        for name in SETTINGS:
            config = live_config(tmp, name, catalogue, url, args.steps)
            runs[name] = loop_steps.setup_run(config)
            runs[name].reward_fn = SeededReward()
            iterators[name] = loop_steps.train_task_iterator(runs[name].sections)
        steps: dict[str, list[dict]] = {name: [] for name in SETTINGS}
        for step in range(args.steps):
            for name, run in runs.items():
                steps[name].append(one_step(run, iterators[name], step))
                print(name, step + 1, {k: round(v, 2) for k, v in steps[name][-1].items()})
        for run in runs.values():
            run.engine.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
    load_after = os.getloadavg()
    results = {}
    for name, rows in steps.items():
        timed = rows[1:] or rows
        warm = [r for r in timed if not r["learner_compiled"]]
        results[name] = {
            "first_step_s": rows[0]["step_s"],
            **{f"median {k}": statistics.median(r[k] for r in timed) for k in timed[0]},
            # A new batch shape compiles the learner's steps again: those steps left out.
            "timed steps without a learner compile": len(warm),
            "median learner_s without a compile": statistics.median(r["learner_s"] for r in warm)
            if warm
            else float("nan"),
            "steps": rows,
        }
    base = results["history/episode"]
    keys = (
        "tokens_per_episode",
        "learner_tokens",
        "learner_written_positions",
        "learner_padded_tokens",
        "step_s",
        "learner_s",
    )
    ratios = {
        name: {k: r[f"median {k}"] / base[f"median {k}"] for k in keys if base[f"median {k}"]}
        for name, r in results.items()
        if name != "history/episode"
    }
    for name, ratio in ratios.items():
        key = "median learner_s without a compile"
        ratio["learner_s without a compile"] = results[name][key] / base[key]
    for name, ratio in ratios.items():
        print({f"{name} over history/episode": {k: round(v, 2) for k, v in ratio.items()}})
    path = common.write_result(
        "reference_recipe",
        {
            "command": f"python -m experiments.benchmarks.reference_recipe --steps {args.steps}",
            "load_average_before": load_before,
            "load_average_after": load_after,
            "settings": SETTINGS,
            "results": results,
            "over_history_episode": ratios,
        },
    )
    print(path)


if __name__ == "__main__":
    main()
