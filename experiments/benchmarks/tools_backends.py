"""Tool back-end costs: sandbox start-up and BM25 search, each against a peer.

sandbox: ours = `run_python` (bubblewrap + limits); peer = the same program
         in a plain unsandboxed `python -I` subprocess. The ratio is what
         isolation costs per code execution.
bm25:    ours = `BM25Retriever.search` (exact scores over all documents,
         supports per-task allowed ids); peer = bm25s's own `retrieve` on
         the same index and tokens. Timed over a batch of queries.

  python -m experiments.benchmarks.tools_backends [--repeats N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from experiments.benchmarks import common
from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.tools import retrieval
from orchestra_jax.tools.python_sandbox import run_python

PROGRAM = "print(sum(i * i for i in range(10000)))"


def sandbox_timings(repeats: int) -> dict:
    def ours():
        assert run_python(PROGRAM, timeout_s=10).ok

    def peer():
        subprocess.run([sys.executable, "-I", "-c", PROGRAM], check=True, capture_output=True)

    return common.alternate_timings({"ours": ours, "peer": peer}, repeats)


def bm25_timings(repeats: int, num_entities: int, num_queries: int) -> dict:
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
    args = parser.parse_args()
    sandbox = common.summarize(sandbox_timings(args.repeats))
    bm25_raw, n_queries = bm25_timings(args.repeats, args.num_entities, args.num_queries)
    bm25 = common.summarize(bm25_raw)
    payload = {
        "sandbox": {
            **sandbox,
            "program": PROGRAM,
            "ratio_ours_over_peer": sandbox["ours"]["median_s"] / sandbox["peer"]["median_s"],
        },
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
    print(
        f"sandbox median ours {sandbox['ours']['median_s']:.3f}s vs plain "
        f"python {sandbox['peer']['median_s']:.3f}s; bm25 "
        f"{payload['bm25']['ours_queries_per_s']:.0f} vs "
        f"{payload['bm25']['peer_queries_per_s']:.0f} queries/s -> {path}"
    )


if __name__ == "__main__":
    main()
