"""Decode throughput: JaxEngine against vLLM-CPU, the same weights, in the same run.

    python -m experiments.benchmarks.decode_vs_vllm [--repeats 3] [--shapes demo,qwen3_0p6b_4l]
        [--dtypes float32,bfloat16] [--batches 16,64] [--full-rows-too]

For each model shape and dtype, one random Qwen3 is saved as an HF folder
(`save_hf_checkpoint`) and served by vLLM (launch/vllm_server.sh, compiled, no
tokenizer: token-id prompts; the venv from scripts/make_vllm_venv.sh, found
through $ORCHESTRA_VLLM_VENV), while JaxEngine runs the same weights in process.
For each batch size, `batch` random prompts of PROMPT_LEN tokens each ask for
NEW_TOKENS tokens at temperature 1 with no stop token, so both sides generate
exactly batch × NEW_TOKENS tokens; the two are timed alternately
(`common.alternate_timings`, after one untimed round that compiles), and new
tokens/s are reported as medians, with vLLM's over HTTP (VLLMClient, one request
per prompt, as rollouts send them).

Continuous batching (`--mixed`, on by default): one stream of MIXED_REQUESTS
requests with prompt lengths and new-token counts drawn uniformly from
[MIXED_MIN, MIXED_MAX], each sent as its own call at once (as rollouts send
turns), at most MIXED_SLOTS decoding together on both sides (the JAX engine's
`max_batch_size`, vLLM's client `max_in_flight`), so each scheduler must refill
slots as short requests end: new tokens/s over the whole stream and the mean
request latency, timed alternately like the batch cells. With `--full-rows-too`
the stream also runs on a second JaxEngine with `decode_row_buckets=()` (every
decode call at the full slot count, as before row buckets), in the same
alternation ("jax_full_rows"), so the row buckets' effect is measured side by
side. Each cell records the decode programs the JAX engine compiled.

Shapes: "demo" (vocab 4096, hidden 256, 4 layers, the CPU demo's) and
"qwen3_0p6b_4l" (Qwen3-0.6B's layer and vocabulary dimensions with 4 layers).
Writes experiments/benchmarks/results/decode_vs_vllm.json (`--result-name`) (CPU model and flags
recorded by `common.write_result`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import subprocess
import tempfile
import time

import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.benchmarks import common
from launch import vllm_process
from launch.vllm_process import stop
from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.vllm_client import VLLMClient
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig

NEW_TOKENS, PROMPT_LEN = 128, 32
SHAPES = {
    "demo": ("demo", {}),
    "qwen3_0p6b_4l": ("qwen3_0p6b", {"num_hidden_layers": 4, "max_position_embeddings": 4096}),
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
MIXED_REQUESTS, MIXED_SLOTS, MIXED_MIN, MIXED_MAX = 32, 16, 8, 192


def serve(folder: str, dtype: str, log_path: str) -> tuple[subprocess.Popen, str]:
    """launch/vllm_server.sh on `folder` (compiled, no tokenizer); (process, URL)."""
    return vllm_process.serve(folder, log_path, {"DTYPE": dtype, "TOKENIZER": "0"})


def requests_of(rng, rows: int, vocab: int) -> list[GenerateRequest]:
    """`rows` random prompts of PROMPT_LEN tokens, each asking for NEW_TOKENS at T = 1."""
    return [
        GenerateRequest(
            rng.integers(3, min(vocab, 100_000), PROMPT_LEN).tolist(),
            SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=i),
        )
        for i in range(rows)
    ]


def generated(engine, requests) -> int:
    """New tokens of `requests` on `engine` (a fresh event loop; an HTTP client's session
    is closed with it)."""

    async def run():
        try:
            return await engine.generate(requests)
        finally:
            if isinstance(engine, VLLMClient):
                await engine.aclose()

    return sum(c.completion_tokens for c in asyncio.run(run()))


def mixed_requests(rng, vocab: int) -> list[GenerateRequest]:
    """The continuous-batching stream: mixed prompt lengths and new-token counts."""
    lengths = rng.integers(MIXED_MIN, MIXED_MAX + 1, (MIXED_REQUESTS, 2))
    return [
        GenerateRequest(
            rng.integers(3, min(vocab, 100_000), int(prompt)).tolist(),
            SamplingParams(temperature=1.0, max_new_tokens=int(new), seed=i),
        )
        for i, (prompt, new) in enumerate(lengths)
    ]


def streamed(engine, requests, latencies: list[float]) -> int:
    """New tokens of `requests` sent as separate concurrent calls; each call's seconds
    are appended to `latencies`."""

    async def one(request):
        start = time.perf_counter()
        [completion] = await engine.generate([request])
        latencies.append(time.perf_counter() - start)
        return completion.completion_tokens

    async def run():
        try:
            return await asyncio.gather(*(one(r) for r in requests))
        finally:
            if isinstance(engine, VLLMClient):
                await engine.aclose()

    return sum(asyncio.run(run()))


def decode_programs(engine: JaxEngine) -> list[str]:
    """The decode programs `engine` compiled (cache length, row bucket, options)."""
    return sorted(k for k in engine.compile_counts if k.startswith("decode("))


def mixed_cell(model, config, url: str, repeats: int, rng, full_rows_too: bool = False) -> dict:
    """The continuous-batching stream on both engines (module docstring)."""
    requests = mixed_requests(rng, config.vocab_size)
    expected = sum(r.sampling.max_new_tokens for r in requests)
    engines = {
        "jax": JaxEngine(
            model, JaxEngineConfig(max_batch_size=MIXED_SLOTS, max_seq_len=2 * MIXED_MAX)
        )
    }
    if full_rows_too:
        engines["jax_full_rows"] = JaxEngine(
            model,
            JaxEngineConfig(
                max_batch_size=MIXED_SLOTS, max_seq_len=2 * MIXED_MAX, decode_row_buckets=()
            ),
        )
    client = VLLMClient(
        url, model_config=config, settings=ServerPoolSettings(max_in_flight=MIXED_SLOTS)
    )
    peers = {**engines, "vllm": client}
    latencies: dict[str, list[float]] = {name: [] for name in peers}
    counts = {}

    def run(name):
        latencies[name].clear()
        counts[name] = streamed(peers[name], requests, latencies[name])

    try:
        timings = common.alternate_timings(
            {name: functools.partial(run, name) for name in peers}, repeats, warmup=1
        )
    finally:
        for engine in engines.values():
            engine.close()
        client.close()
    assert counts == dict.fromkeys(peers, expected), (counts, expected)
    summary = common.summarize(timings)
    rates = {n: expected / s["median_s"] for n, s in summary.items()}
    return {
        "requests": MIXED_REQUESTS,
        "slots": MIXED_SLOTS,
        "new_tokens": expected,
        "seconds": summary,
        "new_tokens_per_s": rates,
        "jax_over_vllm": rates["jax"] / rates["vllm"],
        "mean_latency_s_last_round": {n: float(np.mean(v)) for n, v in latencies.items()},
        "decode_programs": {n: decode_programs(e) for n, e in engines.items()},
    }


def time_both(engine, client, requests, repeats: int):
    """Alternate timings of `requests` on the JAX engine and on vLLM, and the tokens each made."""
    counts = {}

    def jax_run():
        counts["jax"] = generated(engine, requests)

    def vllm_run():
        counts["vllm"] = generated(client, requests)

    timings = common.alternate_timings({"jax": jax_run, "vllm": vllm_run}, repeats, warmup=1)
    return timings, counts


def one_setting(
    shape: str,
    dtype: str,
    batches,
    repeats: int,
    tmp: str,
    mixed: bool = True,
    full_rows_too: bool = False,
) -> dict:
    preset, overrides = SHAPES[shape]
    config = Qwen3Config.preset(preset, **overrides).replace(
        param_dtype=DTYPES[dtype], dtype=DTYPES[dtype]
    )
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    folder = os.path.join(tmp, f"{shape}_{dtype}")
    save_hf_checkpoint(model, config, folder, dtype=config.dtype)
    process, url = serve(folder, dtype, folder + ".log")
    client = VLLMClient(url, model_config=config)
    rng = np.random.default_rng(0)
    out = {}
    try:
        for rows in batches:
            requests = requests_of(rng, rows, config.vocab_size)
            engine = JaxEngine(
                model, JaxEngineConfig(max_batch_size=rows, max_seq_len=PROMPT_LEN + NEW_TOKENS)
            )
            try:
                timings, counts = time_both(engine, client, requests, repeats)
            finally:
                engine.close()
            programs = decode_programs(engine)
            summary = common.summarize(timings)
            assert counts == {"jax": rows * NEW_TOKENS, "vllm": rows * NEW_TOKENS}, counts
            rates = {n: rows * NEW_TOKENS / s["median_s"] for n, s in summary.items()}
            out[f"batch_{rows}"] = {
                "seconds": summary,
                "new_tokens_per_s": rates,
                "jax_over_vllm": rates["jax"] / rates["vllm"],
                "decode_programs": {"jax": programs},
            }
            print(
                f"{shape} {dtype} batch {rows}: "
                + ", ".join(f"{n} {r:.0f} tok/s" for n, r in rates.items())
            )
        if mixed:
            out["mixed"] = cell = mixed_cell(model, config, url, repeats, rng, full_rows_too)
            print(
                f"{shape} {dtype} mixed stream: "
                + ", ".join(f"{n} {r:.0f} tok/s" for n, r in cell["new_tokens_per_s"].items())
            )
    finally:
        client.close()
        stop(process)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--batches", default="16,64", help="'' for none")
    parser.add_argument("--mixed", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--full-rows-too",
        action="store_true",
        help="also time the stream with decode_row_buckets=() (every call at full size)",
    )
    parser.add_argument(
        "--result-name", default="decode_vs_vllm", help="results/<name>.json (a partial run's own)"
    )
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            for dtype in args.dtypes.split(","):
                results[f"{shape}/{dtype}"] = one_setting(
                    shape, dtype, batches, args.repeats, tmp, args.mixed, args.full_rows_too
                )
    path = common.write_result(
        args.result_name,
        {
            "new_tokens": NEW_TOKENS,
            "prompt_len": PROMPT_LEN,
            "repeats": args.repeats,
            "vllm": "vllm-cpu 0.32.0 (scripts/make_vllm_venv.sh), compiled, over HTTP",
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
