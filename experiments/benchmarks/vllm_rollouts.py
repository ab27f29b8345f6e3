"""GRPO steps with vLLM rollouts against the in-process JAX engine, and the cost of
a verified weight sync to vLLM by model size.

    python -m experiments.benchmarks.vllm_rollouts [--steps 5] [--tasks 4] [--group 4]
        [--sizes demo,tiny_qwen3_vocab,qwen3_0p6b_4l] [--sync_repeats 4]

Method.

GRPO steps: one random Qwen3 of the tests' tiny shape with Qwen3's vocabulary
(`tests/vllm_helpers.py`'s TINY_SHAPE: hidden 64, 2 layers, vocabulary 151,936,
an LM head of its own), float32, saved once as an HF folder with Qwen3's
tokenizer. The `micro` config (`experiments/configs/grpo_hle.py`) starts from
that folder (`model.hf_path`) twice: with `rollout.engine=jax` (the engine in
process) and with `rollout.engine=vllm` (one vLLM-CPU server, launch/vllm_server.sh,
compiled, float32, on the same cores). Both runs use the same seed, tasks,
`rl.tasks_per_step` × `rl.group_size` episodes a step, turns and token limits,
and a seeded random reward (a random policy answers nothing, so the paper's
reward is 0 everywhere and GRPO would skip every update): every step trains and
every sync carries new weights. The sampled tokens differ between the engines
(their samplers differ), so the generated tokens per episode are reported with
the times. Steps per hour count the steps after the first (which compiles); the
phase seconds (`time/rollout_s`, `time/weight_sync_s`: on vLLM the safetensors
write, the in-place reload, the version and the sync probe; `time/learner_s`)
are means over those steps. The vLLM server is up during both runs; the CPU
seconds its processes use per step are recorded for each (what it takes from
the learner on the same 2 cores).

Weight sync by size: for each model shape, a random float32 Qwen3 (LM head of
its own: vllm-cpu 0.32.0 does not reload a tied one in place) served by its own
vLLM-CPU server (eager: the reload path does not depend on compilation; the
`tiny_qwen3_vocab` shape reuses the GRPO server), then `--sync_repeats` syncs,
each split into its parts as `HttpEngineClient.update_weights` runs them:
`write` (save_hf_checkpoint in the serving dtype), `learner_probe` (the
learner's log-probs of the probe sequence), `reload` (`/pause`, `/collective_rpc
reload_weights`, `/update_weight_version`, `/resume`) and `verify` (`/weight_info`
and the served probe log-probs); then one whole `update_weights` for the total.
The first sync (which compiles the learner's probe and is the server's first
prompt scoring) is reported apart, the others as medians, with the bytes written.

Adapter sync (issue 42's comparison with the full sync): at `qwen3_0p6b_4l`, a
server started with LoRA serving (`LORA_RANK`), a LoRA policy of each rank in
`--adapter_ranks` on every projection (alpha 2r) over the served base, and whole
`update_weights` calls (the PEFT folder written, `/pause`,
`/v1/load_lora_adapter`, `/update_weight_version`, `/resume`, the probe): the
first (fresh adapters) apart, then medians over `--sync_repeats` syncs of random
adapters, with the adapter folder's bytes. `--adapters_only` runs only this part
(results/vllm_rollouts_adapters.json).

Shapes: "demo" (vocabulary 4,096, hidden 256, 4 layers, the CPU demo's),
"tiny_qwen3_vocab" (the GRPO policy above) and "qwen3_0p6b_4l" (Qwen3-0.6B's
layer and vocabulary dimensions with 4 layers). Writes
experiments/benchmarks/results/vllm_rollouts.json (CPU model and flags recorded by
`common.write_result`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.benchmarks import common
from experiments.configs import grpo_hle
from launch import vllm_process
from launch.vllm_process import stop
from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint, save_hf_checkpoint
from orchestra_jax.models.lora import LoRAParam, LoRASpec
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.http.vllm_client import VLLMClient
from orchestra_jax.training import grpo_loop, loop_steps
from orchestra_jax.training.experiment_config import validate
from orchestra_jax.training.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QWEN3_TOKENIZER_DIR = os.path.join(os.path.dirname(ROOT), "shared", "qwen3")
# The shapes the sync is measured at: (preset, overrides), each with an LM head of its own.
SHAPES = {
    "demo": ("demo", {"tie_word_embeddings": False}),
    "tiny_qwen3_vocab": (
        "qwen3_0p6b",
        {
            "tie_word_embeddings": False,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,  # the smallest vLLM-CPU's attention takes
            "max_position_embeddings": 4096,
        },
    ),
    "qwen3_0p6b_4l": (
        "qwen3_0p6b",
        {"tie_word_embeddings": False, "num_hidden_layers": 4, "max_position_embeddings": 4096},
    ),
}
GRPO_SHAPE = "tiny_qwen3_vocab"
ADAPTER_SHAPE = "qwen3_0p6b_4l"  # adapters on every projection, beside its full sync
PHASES = ("time/rollout_s", "time/weight_sync_s", "time/learner_s")


class SeededNoiseReward:
    """A seeded random reward: every group has a ranking, so every step updates."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def __call__(self, features, correct, preference):
        del correct, preference
        return self.rng.normal(size=len(features)).astype(np.float32)


# -- the vLLM server -----------------------------------------------------------------------


def serve(
    folder: str, log_path: str, *, eager: bool, lora_rank: int = 0
) -> tuple[subprocess.Popen, str]:
    """launch/vllm_server.sh on `folder` (float32, no tokenizer; adapters up to
    `lora_rank` when > 0); (process, URL) once it answers."""
    settings = {"DTYPE": "float32", "TOKENIZER": "0", "EAGER": "1" if eager else "0"}
    return vllm_process.serve(folder, log_path, {**settings, "LORA_RANK": str(lora_rank)})


def group_cpu_seconds(pgid: int) -> float:
    """User plus system CPU seconds of the live processes in process group `pgid` (a
    server started in a session of its own: the API server and its engine)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields from the state on: state ppid pgrp ...
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def make_model(shape: str, folder: str):
    """A random float32 Qwen3 of `shape` saved as an HF folder; (model, config)."""
    preset, overrides = SHAPES[shape]
    config = Qwen3Config.preset(preset, **overrides).replace(
        param_dtype=jnp.float32, dtype=jnp.float32
    )
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    save_hf_checkpoint(model, config, folder, dtype=config.dtype)
    return model, config


# -- GRPO steps ----------------------------------------------------------------------------


def grpo_config(engine: str, folder: str, url: str, workdir: str, args):
    config = grpo_hle.get_config("micro")
    config.workdir = workdir
    config.num_steps = args.steps
    config.tokenizer = folder  # Qwen3's tokenizer
    config.model.preset = ""
    config.model.overrides = {}
    config.model.hf_path = folder
    config.rl.warmup_steps = 0  # every step's update moves the weights the sync sends
    config.rl.tasks_per_step = args.tasks
    config.rl.group_size = args.group
    config.rollout.max_batch_size = args.tasks * args.group
    config.rollout.engine = engine
    if engine == "vllm":
        config.rollout.urls = url
        config.rollout.weights_dir = os.path.join(workdir, "weights")
    config.checkpoint.every_steps = 0  # the final step's only
    config.eval.every_steps = 0
    config.log.tensorboard = False
    config.log.trajectories_every = 0
    validate(config)
    return config


def grpo_steps(engine: str, folder: str, url: str, server_pgid: int, args) -> dict:
    """`args.steps` GRPO steps of the `micro` config on `engine`; steps per hour and phase
    seconds after the first step, and the CPU seconds the vLLM server (process group
    `server_pgid`, up during both runs) spent meanwhile."""
    workdir = tempfile.mkdtemp(prefix=f"vllm_rollouts_{engine}_")
    config = grpo_config(engine, folder, url, workdir, args)
    run = loop_steps.setup_run(config)
    run.reward_fn = SeededNoiseReward()
    ends: list[float] = []
    server_cpu: list[float] = []

    def progress(step, metrics):
        ends.append(time.perf_counter())
        server_cpu.append(group_cpu_seconds(server_pgid))

    try:
        grpo_loop.grpo_train(run, progress=progress)
    finally:
        run.engine.close()
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))[1:]  # after the first
    out = {
        "engine": engine,
        "steps": args.steps,
        "episodes_per_step": args.tasks * args.group,
        "steps_per_hour": 3600.0 * (len(ends) - 1) / (ends[-1] - ends[0]),
        "vllm_server_cpu_s_per_step": (server_cpu[-1] - server_cpu[0]) / (len(ends) - 1),
    }
    for key in (*PHASES, "generated_tokens", "turns", "rollout/sync_logprob_max_abs_diff"):
        values = [r[key] for r in records if r.get(key) is not None]
        if values:
            out[f"mean {key}"] = sum(values) / len(values)
    shutil.rmtree(workdir, ignore_errors=True)
    return out


# -- weight sync by size -------------------------------------------------------------------


def folder_bytes(folder: str) -> int:
    return sum(
        os.path.getsize(os.path.join(folder, f))
        for f in os.listdir(folder)
        if f.endswith(".safetensors")
    )


async def sync_parts(model, config, url: str, weights_dir: str, repeats: int) -> dict:
    """`repeats` syncs to `url` timed part by part (the first, which compiles the learner's
    probe and is the server's first prompt scoring, apart; medians over the others), then
    one whole `update_weights`."""
    client = VLLMClient(url, weights_dir=weights_dir, model_config=config)
    parts: dict[str, list[float]] = {k: [] for k in ("write", "learner_probe", "reload", "verify")}
    try:
        await client.check_servers()
        for version in range(1, repeats + 1):
            path = os.path.join(weights_dir, f"v{version}")
            start = time.perf_counter()
            await asyncio.to_thread(save_hf_checkpoint, model, config, path, dtype=config.dtype)
            parts["write"].append(time.perf_counter() - start)
            start = time.perf_counter()
            client._probe = await asyncio.to_thread(client._make_probe, model, config, version)
            parts["learner_probe"].append(time.perf_counter() - start)
            start = time.perf_counter()
            await client._load_on(url, path, version, mode="wait")
            parts["reload"].append(time.perf_counter() - start)
            start = time.perf_counter()
            await client.verify_weights(url, version)
            parts["verify"].append(time.perf_counter() - start)
        written = folder_bytes(os.path.join(weights_dir, f"v{repeats}"))
        start = time.perf_counter()
        await client.update_weights(model, version=repeats + 1)
        whole = time.perf_counter() - start
        diff = client.sync_metrics()["rollout/sync_logprob_max_abs_diff"]
    finally:
        await client.aclose()
    first = {f"first {k}_s": v[0] for k, v in parts.items()}
    steady = {f"{k}_s": statistics.median(v[1:] or v) for k, v in parts.items()}
    return {
        "bytes": written,
        **steady,
        "parts_sum_s": sum(steady.values()),
        **first,
        "update_weights_s": whole,
        "probe_max_abs_diff": diff,
        "repeats": repeats,
    }


def sync_by_size(shape: str, tmp: str, repeats: int, served=None) -> dict:
    """The sync's parts for `shape`, on `served` (model, config, URL) or a server of its own."""
    process = None
    if served is None:
        folder = os.path.join(tmp, shape)
        model, config = make_model(shape, folder)
        process, url = serve(folder, folder + ".log", eager=True)
    else:
        model, config, url = served
    try:
        weights_dir = os.path.join(tmp, f"{shape}_weights")
        row = asyncio.run(sync_parts(model, config, url, weights_dir, repeats))
    finally:
        if process is not None:
            stop(process)
    params = sum(int(np.prod(x.shape)) for x in jax_leaves(model))
    row = {"shape": shape, "parameters": params, **row}
    print(
        f"sync {shape}: {params / 1e6:.1f}M parameters, {row['bytes'] / 1e6:.0f} MB, "
        f"write {row['write_s']:.2f} s, reload {row['reload_s']:.2f} s, "
        f"probe {row['learner_probe_s'] + row['verify_s']:.2f} s, "
        f"whole {row['update_weights_s']:.2f} s",
        flush=True,
    )
    return row


def adapter_sync(shape: str, tmp: str, repeats: int, ranks: list[int]) -> list[dict]:
    """Whole adapter syncs (`update_weights` of a LoRA policy: the PEFT folder written,
    `/v1/load_lora_adapter`, the version, the probe) for each rank in `ranks`, on one
    server of `shape`'s base serving adapters up to the largest rank; the first sync of
    each rank (fresh adapters, B = 0) apart, then medians over `repeats` syncs of random
    adapters."""
    folder = os.path.join(tmp, f"{shape}_lora_base")
    make_model(shape, folder)
    process, url = serve(folder, folder + ".log", eager=True, lora_rank=max(ranks))
    rows = []
    try:
        for rank in ranks:
            model, config = load_hf_checkpoint(folder, lora=LoRASpec(rank=rank, alpha=2.0 * rank))
            rows.append(asyncio.run(_adapter_syncs(model, config, url, tmp, rank, repeats)))
            row = rows[-1]
            print(
                f"adapter sync {shape} r={rank}: {row['bytes'] / 1e6:.1f} MB, first "
                f"{row['first_update_weights_s']:.2f} s, then {row['update_weights_s']:.2f} s",
                flush=True,
            )
    finally:
        stop(process)
    return [{"shape": shape, **row} for row in rows]


async def _adapter_syncs(model, config, url: str, tmp: str, rank: int, repeats: int) -> dict:
    weights_dir = os.path.join(tmp, f"adapters_r{rank}")
    client = VLLMClient(url, weights_dir=weights_dir, model_config=config)
    seconds = []
    try:
        first = 1000 * rank + 1  # versions of their own for each rank on the one server
        for version in range(first, first + repeats + 1):
            if version > first:  # the first sync carries the fresh adapters (B = 0)
                rng = np.random.default_rng(version)
                flat = nnx.to_flat_state(nnx.state(model, LoRAParam))
                nnx.update(
                    model,
                    nnx.from_flat_state(
                        [
                            (k, v.replace(jnp.asarray(0.02 * rng.standard_normal(v.shape))))
                            for k, v in flat
                        ]
                    ),
                )
            start = time.perf_counter()
            await client.update_weights(model, version=version)
            seconds.append(time.perf_counter() - start)
        diff = client.sync_metrics()["rollout/sync_logprob_max_abs_diff"]
    finally:
        await client.aclose()
    adapter = os.path.join(weights_dir, f"v{first + repeats}")
    size = sum(os.path.getsize(os.path.join(adapter, f)) for f in os.listdir(adapter))
    return {
        "rank": rank,
        "bytes": size,
        "first_update_weights_s": seconds[0],
        "update_weights_s": statistics.median(seconds[1:]),
        "probe_max_abs_diff": diff,
        "repeats": repeats,
    }


def jax_leaves(model):
    import jax

    return jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))


# -- main ----------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=4, help="rl.tasks_per_step")
    parser.add_argument("--group", type=int, default=4, help="rl.group_size")
    parser.add_argument("--sizes", default=",".join(SHAPES))
    parser.add_argument("--sync_repeats", type=int, default=4)
    parser.add_argument("--tokenizer_dir", default=QWEN3_TOKENIZER_DIR, help="Qwen3's tokenizer")
    parser.add_argument("--skip_grpo", action="store_true")
    parser.add_argument(
        "--adapter_ranks",
        default="8,64",
        help="LoRA ranks whose adapter syncs are timed at qwen3_0p6b_4l ('' for none)",
    )
    parser.add_argument("--adapters_only", action="store_true", help="only the adapter syncs")
    parser.add_argument(
        "--eager", action="store_true", help="serve the GRPO policy uncompiled (a quick check)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if not os.path.exists(os.path.join(args.tokenizer_dir, "tokenizer.json")):
        raise SystemExit(f"no Qwen3 tokenizer at {args.tokenizer_dir}")
    grpo: list[dict] = []
    syncs: list[dict] = []

    def write() -> None:  # after each part, so that a part that fails keeps the others
        if len(grpo) == 2:
            jax_row, vllm_row = grpo
            vllm_row["steps_per_hour_vs_jax"] = (
                vllm_row["steps_per_hour"] / jax_row["steps_per_hour"]
            )
        path = common.write_result(
            result_name,
            {
                "command": "python -m experiments.benchmarks.vllm_rollouts "
                f"--steps {args.steps} --tasks {args.tasks} --group {args.group} "
                f"--sizes {args.sizes} --sync_repeats {args.sync_repeats}",
                "vllm": "vllm-cpu 0.32.0 (scripts/make_vllm_venv.sh), float32, one server",
                "load_average": os.getloadavg(),
                "grpo": grpo,
                "sync": sorted(syncs, key=lambda r: r["parameters"]),
                "adapter_sync": adapters,
            },
        )
        print(f"wrote {path}", flush=True)

    adapters: list[dict] = []
    ranks = [int(r) for r in args.adapter_ranks.split(",") if r]
    result_name = "vllm_rollouts_adapters" if args.adapters_only else "vllm_rollouts"
    if args.adapters_only:
        with tempfile.TemporaryDirectory() as tmp:
            adapters.extend(adapter_sync(ADAPTER_SHAPE, tmp, args.sync_repeats, ranks))
            write()
        return

    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "policy")
        model, config = make_model(GRPO_SHAPE, folder)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer_dir, name), folder)
        process, url = serve(folder, folder + ".log", eager=args.eager)
        try:
            if not args.skip_grpo:
                for engine in ("jax", "vllm"):
                    grpo.append(grpo_steps(engine, folder, url, process.pid, args))
                    print(json.dumps(grpo[-1]), flush=True)
                    write()
            if GRPO_SHAPE in args.sizes.split(","):
                syncs.append(sync_by_size(GRPO_SHAPE, tmp, args.sync_repeats, (model, config, url)))
                write()
        finally:
            stop(process)
        for shape in args.sizes.split(","):
            if shape != GRPO_SHAPE:
                syncs.append(sync_by_size(shape, tmp, args.sync_repeats))
                write()
        if ranks:
            adapters.extend(adapter_sync(ADAPTER_SHAPE, tmp, args.sync_repeats, ranks))
            write()


if __name__ == "__main__":
    main()
