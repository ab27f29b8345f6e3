"""Where JaxEngine's decode time goes at Qwen3-0.6B's dimensions (4 layers).

    python -m experiments.benchmarks.decode_profile [--dtypes float32,bfloat16] [--calls 3]
        [--no-timeline] [--no-step] [--layout-ab] [--variants 1000000000/0,auto/0,auto/1]

Two views (three with --layout-ab), all on a random model of `decode_vs_vllm`'s "qwen3_0p6b_4l" shape:

* step: one jitted decode call (`DecodeSteps.decode`, STEPS_PER_CALL steps, BATCH
  rows at temperature 1, cache of CACHE_LEN slots) traced with `jax.profiler`;
  every thunk's time, per decode step, put in a category by the Python functions
  that emitted it (`xla_trace.hlo_ops`): layer matmuls, LM head, attention over
  the cache, cache update, sampling, norms/RoPE/SiLU/residual, other (the loop's
  own bookkeeping). Also the call's wall time per step.
* timeline: `decode_vs_vllm`'s continuous-batching stream (MIXED_REQUESTS
  single-request calls, 16 slots) on a JaxEngine whose scheduler calls are
  wrapped to record each admission (rows, padded prefill shape, seconds) and
  each decode chunk (rows live, steps run, cache length, seconds), after one
  untimed round that compiles. Summed: seconds in prefill, in decode, between
  calls, and the mean rows live per decode step.
* layout_ab (`--layout-ab`): the decode call's wall time per step with the
  embedding table read as stored (`qwen3_layers.lookup_rows` and the tied head
  as table · xᵀ, the default) against the uint16 gather and x · tableᵀ head for
  every size (`table_paths("gather")`), the two compiled calls alternated, with
  the table-sized arrays each one's HLO writes (`xla_trace.materialized`).

Writes experiments/benchmarks/results/decode_profile.json (`--result-name`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import time

import jax
import numpy as np
from flax import nnx

from experiments.benchmarks import common
from experiments.benchmarks.decode_vs_vllm import (
    DTYPES,
    MIXED_MAX,
    MIXED_SLOTS,
    NEW_TOKENS,
    PROMPT_LEN,
    mixed_requests,
    requests_of,
)
from experiments.benchmarks.xla_trace import HloOp, hlo_ops, materialized, trace_thunk_seconds
from orchestra_jax.models.qwen3 import layers as qwen3_layers
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rollout.jax import sampling
from orchestra_jax.rollout.jax.decode_steps import DecodeSteps
from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig, default_cache_dtype

BATCH, CACHE_LEN, STEPS_PER_CALL = 16, 192, 16
CATEGORIES = (
    "layer matmuls (q/k/v/o, MLP)",
    "LM head",
    "attention over the cache",
    "cache update",
    "sampling",
    "norms, RoPE, SiLU, residual",
    "other",
)
_SAMPLING = {
    "sample_tokens",
    "row_keys",
    "row_uniforms",
    "inverse_cdf_sample",
    "truncation_mask",
    "min_p_mask",
    "_threefry2x32",
}


def model_of(dtype: str) -> Qwen3ForCausalLM:
    config = Qwen3Config.preset(
        "qwen3_0p6b", num_hidden_layers=4, max_position_embeddings=4096
    ).replace(param_dtype=DTYPES[dtype], dtype=DTYPES[dtype])
    return Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))


def category(op: HloOp) -> str:
    """`CATEGORIES` entry of one HLO op of the decode call."""
    f = set(op.functions)
    linear = any(name.endswith("Linear.__call__") for name in f)
    # The head's dot is fused with sampling's first scaling, under sampling's frame.
    if any(name.endswith("attend") for name in f) or (
        op.is_dot and not linear and not (f & {"grouped_attention"})
    ):
        return "LM head"
    if f & _SAMPLING:
        return "sampling"
    if "write_layer" in f:
        return "cache update"
    if op.is_dot and linear:
        return "layer matmuls (q/k/v/o, MLP)"
    if f & {"grouped_attention", "read_layer"} or any("AttentionMask" in n for n in f):
        return "attention over the cache"
    if any(
        n.endswith(("RMSNorm.__call__", "MLP.__call__", "DecoderLayer.__call__")) for n in f
    ) or (f & {"apply_rope", "rope_tables", "rope_table"}):
        return "norms, RoPE, SiLU, residual"
    if any(n.endswith("Attention.__call__") for n in f):
        return "attention over the cache"  # q/k/v head reshapes around the attention
    return "other"


def decode_args(b: int) -> tuple:
    """`DecodeSteps.decode`'s per-row arrays for `b` rows at temperature 1, top-p 1."""
    rng = np.random.default_rng(0)
    seeds = [sampling.split_seed(i) for i in range(b)]
    return (
        rng.integers(3, 100_000, b).astype(np.int32),  # tokens
        np.full(b, 32, np.int32),  # positions
        np.zeros(b, np.int32),  # counts
        np.zeros(b, bool),  # done
        np.full(b, 10_000, np.int32),  # max_new
        np.full((b, 8), -1, np.int32),  # stop ids
        np.ones(b, np.float32),  # temperature
        np.ones(b, np.float32),  # top_p
        np.full(b, -1, np.int32),  # top_k
        np.zeros(b, np.float32),  # min_p
        np.array([s[0] for s in seeds], np.uint32),
        np.array([s[1] for s in seeds], np.uint32),
    )


@contextlib.contextmanager
def table_paths(layout: str):
    """Trace with the embedding lookup and tied head of `layout`: "stored" (the
    default: sliced lookup, head on the stored [V, E] table) or "gather" (the
    uint16 gather and the x · tableᵀ head for every id / row count)."""
    saved = qwen3_layers.MAX_SLICED_LOOKUP, qwen3_layers.MAX_STORED_LAYOUT_HEAD_ROWS
    if layout == "gather":
        qwen3_layers.MAX_SLICED_LOOKUP = qwen3_layers.MAX_STORED_LAYOUT_HEAD_ROWS = 0
    try:
        yield
    finally:
        qwen3_layers.MAX_SLICED_LOOKUP, qwen3_layers.MAX_STORED_LAYOUT_HEAD_ROWS = saved


def layout_ab(dtype: str, calls: int) -> dict:
    """Decode-call wall time per step, "stored" against "gather" `table_paths`,
    alternated call by call in one process (same model, args and cache length)."""
    model = model_of(dtype)
    graphdef, state = nnx.split(model)
    cache_dtype = default_cache_dtype(model.config.dtype)
    args = decode_args(BATCH)
    compiled, caches, copies = {}, {}, {}
    for layout in ("gather", "stored"):
        steps = DecodeSteps(graphdef, max_seq_len=2 * MIXED_MAX, cache_dtype=cache_dtype)
        caches[layout] = model.init_cache(BATCH, CACHE_LEN, cache_dtype)
        with table_paths(layout):
            lowered = steps.decode.lower(
                state, caches[layout], *args, None, num_steps=STEPS_PER_CALL
            )
        compiled[layout] = lowered.compile()
        v, e = model.config.vocab_size, model.config.hidden_size
        copies[layout] = materialized(compiled[layout].as_text(), {f"{v},{e}", f"{e},{v}"})

    def run(layout):
        caches[layout], out, *_ = compiled[layout](state, caches[layout], *args, None)
        jax.block_until_ready(out)

    timings = common.alternate_timings(
        {k: functools.partial(run, k) for k in compiled}, calls, warmup=2
    )
    return {
        "batch": BATCH,
        "cache_len": CACHE_LEN,
        "steps_per_call": STEPS_PER_CALL,
        "wall_ms_per_step": {
            k: float(np.median(v)) * 1e3 / STEPS_PER_CALL for k, v in timings.items()
        },
        "wall_ms_per_step_all": {
            k: [round(t * 1e3 / STEPS_PER_CALL, 2) for t in v] for k, v in timings.items()
        },
        "table_sized_ops": copies,
    }


def step_profile(dtype: str, calls: int) -> dict:
    """Per-step thunk milliseconds by category of one decode call (module docstring)."""
    model = model_of(dtype)
    graphdef, state = nnx.split(model)
    cache_dtype = default_cache_dtype(model.config.dtype)
    steps = DecodeSteps(graphdef, max_seq_len=2 * MIXED_MAX, cache_dtype=cache_dtype)
    b = BATCH
    args = decode_args(b)
    holder = {"cache": model.init_cache(b, CACHE_LEN, cache_dtype)}
    text = (
        steps.decode.lower(state, holder["cache"], *args, None, num_steps=STEPS_PER_CALL)
        .compile()
        .as_text()
    )
    ops = hlo_ops(text)

    def run():
        holder["cache"], out, *_ = steps.decode(
            state, holder["cache"], *args, None, num_steps=STEPS_PER_CALL
        )
        jax.block_until_ready(out)

    for _ in range(2):
        run()
    walls = [common.time_call(run) for _ in range(calls)]
    thunks = trace_thunk_seconds(run, calls)
    per_step = {c: 0.0 for c in CATEGORIES}
    dots = unmatched = 0.0
    for name, s in thunks.items():
        op = ops.get(name)
        if op is None:
            unmatched += s
            continue
        per_step[category(op)] += s / STEPS_PER_CALL
        dots += s / STEPS_PER_CALL if op.is_dot else 0.0
    top = sorted(((s, n) for n, s in thunks.items() if n in ops), reverse=True)[:20]
    return {
        "batch": b,
        "cache_len": CACHE_LEN,
        "steps_per_call": STEPS_PER_CALL,
        "wall_ms_per_step": float(np.median(walls)) * 1e3 / STEPS_PER_CALL,
        "thunk_ms_per_step": {k: v * 1e3 for k, v in per_step.items()},
        "thunk_ms_per_step_total": sum(per_step.values()) * 1e3,
        "dot_ms_per_step": dots * 1e3,
        "unmatched_events_ms_per_step": unmatched * 1e3 / STEPS_PER_CALL,
        "top_ops_ms_per_step": [
            {
                "op": n,
                "ms": s * 1e3 / STEPS_PER_CALL,
                "category": category(ops[n]),
                "functions": list(ops[n].functions[-4:]),
            }
            for s, n in top
        ],
    }


class Timeline:
    """Wraps a JaxEngine's admission and decode rounds, recording one event per call."""

    def __init__(self, engine: JaxEngine):
        self.engine = engine
        self.events: list[dict] = []
        admit, decode, steps_decode = engine._admit, engine._decode_round, engine._steps.decode
        prefill, prefill_cached = engine._prefill, engine._prefill_cached
        self.chunk: dict = {}

        def timed_admit(state, version, jobs):
            self._record("admit", lambda: admit(state, version, jobs), requests=len(jobs))

        def timed_prefill(state, plans, job_of, fn=prefill, kind="prefill"):
            if plans:
                lengths = [len(p.ids) - p.reused for p in plans]
                self._record(
                    kind,
                    lambda: fn(state, plans, job_of),
                    rows=len(plans),
                    tokens=int(sum(lengths)),
                    longest=max(lengths),
                )

        def timed_decode(state):
            live = sum(s is not None for s in engine._slots)
            self._record("decode", lambda: decode(state), live=live)

        def counted_decode(*args, **kwargs):
            result = steps_decode(*args, **kwargs)
            out_tokens = np.asarray(result[1])
            self.chunk.update(
                steps=int((out_tokens >= 0).any(axis=0).sum()),
                row_steps=int((out_tokens >= 0).sum()),
                cache_len=int(args[1].max_len),
            )
            return result

        rows_of = engine._prefill_rows

        def counted_rows(n, length, max_rows=None):
            rows = rows_of(n, length, max_rows)
            self.chunk.update(padded_rows=rows, padded_len=length)
            return rows

        engine._prefill_rows = counted_rows
        engine._admit, engine._decode_round = timed_admit, timed_decode
        engine._prefill = timed_prefill
        engine._prefill_cached = lambda s, p, j: timed_prefill(
            s, p, j, prefill_cached, "prefill_cached"
        )
        engine._steps.decode = counted_decode

    def _record(self, kind: str, fn, **info) -> None:
        self.chunk = {}
        compile_before = self.engine.compile_s
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        self.events.append(
            dict(
                kind=kind,
                start=start,
                end=end,
                compile_s=self.engine.compile_s - compile_before,
                **info,
                **self.chunk,
            )
        )


def stream(engine: JaxEngine, requests) -> float:
    async def one(request):
        await engine.generate([request])

    async def run():
        await asyncio.gather(*(one(r) for r in requests))

    start = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - start


def timeline(
    dtype: str,
    cell: str,
    steps_per_call: int,
    min_prefill_rows: int,
    pad_tokens: int | None = None,
    admit_mid_chunk: bool = True,
) -> dict:
    """The engine timeline of `cell` ("mixed" or "batch_16"; module docstring), summed.

    `pad_tokens`: the engine's `prefill_pad_tokens` (None: the model's default; a
    huge value: the row floor always, the policy before the token budget);
    `admit_mid_chunk`: the engine's setting of that name."""
    model = model_of(dtype)
    rng = np.random.default_rng(0)
    if cell == "mixed":
        requests = mixed_requests(rng, model.config.vocab_size)
        slots, max_seq_len = MIXED_SLOTS, 2 * MIXED_MAX
    else:
        slots = int(cell.removeprefix("batch_"))
        requests = requests_of(rng, slots, model.config.vocab_size)
        max_seq_len = PROMPT_LEN + NEW_TOKENS
    engine = JaxEngine(
        model,
        JaxEngineConfig(
            max_batch_size=slots,
            max_seq_len=max_seq_len,
            steps_per_call=steps_per_call,
            min_prefill_rows=min_prefill_rows,
            prefill_pad_tokens=pad_tokens,
            admit_mid_chunk=admit_mid_chunk,
        ),
    )
    try:
        stream(engine, requests)  # compiles
        recorder = Timeline(engine)
        wall = stream(engine, requests)
    finally:
        engine.close()
    events = recorder.events
    decodes = [e for e in events if e["kind"] == "decode"]
    prefills = [e for e in events if e["kind"].startswith("prefill")]
    admits = [e for e in events if e["kind"] == "admit"]
    top = [e for e in events if e["kind"] in ("admit", "decode")]
    busy = sum(e["end"] - e["start"] for e in top)
    steps = sum(e.get("steps", 0) for e in decodes)
    row_steps = sum(e.get("row_steps", 0) for e in decodes)
    new_tokens = sum(r.sampling.max_new_tokens for r in requests)
    return {
        "cell": cell,
        "steps_per_call": steps_per_call,
        "min_prefill_rows": min_prefill_rows,
        "prefill_pad_tokens": engine._prefill_pad_tokens,
        "admit_mid_chunk": admit_mid_chunk,
        "wall_s": wall,
        "new_tokens_per_s": new_tokens / wall,
        "admissions": len(admits),
        "admission_s": sum(e["end"] - e["start"] for e in admits),
        "prefill_calls": len(prefills),
        "prefill_s": sum(e["end"] - e["start"] for e in prefills),
        "prefill_rows": [e["rows"] for e in prefills],
        "prefill_prompt_tokens": sum(e["tokens"] for e in prefills),
        "prefill_padded_shapes": [(e["padded_rows"], e["padded_len"]) for e in prefills],
        "prefill_padded_tokens": sum(e["padded_rows"] * e["padded_len"] for e in prefills),
        "decode_calls": len(decodes),
        "decode_s": sum(e["end"] - e["start"] for e in decodes),
        "decode_steps": steps,
        "decode_ms_per_step": 1e3 * sum(e["end"] - e["start"] for e in decodes) / max(steps, 1),
        "mean_rows_live_per_step": row_steps / max(steps, 1),
        "idle_between_calls_s": wall - busy,
        "compile_s": sum(e["compile_s"] for e in top),
        "events": [
            {
                k: round(v - events[0]["start"], 4) if k in ("start", "end") else v
                for k, v in e.items()
            }
            for e in events
        ],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--step", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--timeline", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--layout-ab",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also time decode calls with the stored-layout table paths against the gather ones",
    )
    parser.add_argument("--cells", default="mixed,batch_16", help="timeline cells")
    parser.add_argument("--steps-per-call", default="16", help="timeline settings, comma list")
    parser.add_argument("--min-prefill-rows", default="8", help="timeline settings, comma list")
    parser.add_argument(
        "--variants",
        default="auto/1",
        help="timeline settings, comma list of PREFILL_PAD_TOKENS/ADMIT_MID_CHUNK run in "
        "order (auto: the model's default; 1000000000/0: the scheduler before either)",
    )
    parser.add_argument("--result-name", default="decode_profile")
    args = parser.parse_args(argv)
    results: dict = {}
    for dtype in args.dtypes.split(","):
        out = results[dtype] = {}
        if args.step:
            out["step"] = p = step_profile(dtype, args.calls)
            print(
                dtype,
                "step",
                {k: round(v, 1) for k, v in p["thunk_ms_per_step"].items()},
                "wall/step",
                round(p["wall_ms_per_step"], 1),
            )
        if args.layout_ab:
            out["layout_ab"] = ab = layout_ab(dtype, args.calls)
            print(dtype, "layout_ab", ab["wall_ms_per_step"], ab["table_sized_ops"])
        if args.timeline:
            out["timeline"] = []
            settings = [
                (cell, spc, rows, None if pad == "auto" else int(pad), mid == "1")
                for cell in args.cells.split(",")
                for spc in map(int, args.steps_per_call.split(","))
                for rows in map(int, args.min_prefill_rows.split(","))
                for pad, mid in (v.split("/") for v in args.variants.split(","))
            ]
            for cell, spc, rows, pad, mid in settings:
                t = timeline(dtype, cell, spc, rows, pad, mid)
                out["timeline"].append(t)
                print(
                    dtype,
                    "timeline",
                    {
                        k: v
                        for k, v in t.items()
                        if k not in ("events", "prefill_rows", "prefill_padded_shapes")
                    },
                )
    path = common.write_result(args.result_name, {"results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
