"""Build a persisted retrieval index folder.

    python -m orchestra_jax.tools.build_index --corpus docs.jsonl --out IDX \\
        [--kind bm25|dense] [--embedder hashing:512|hf:PATH|hf-last:PATH]
    python -m orchestra_jax.tools.build_index --synthetic-seed 0 --out IDX

The corpus is JSONL with `id`, `text` and optional `title`, `metadata`;
`--synthetic-seed` indexes the synthetic environment's generated corpus
instead. Open the folder with `index_folder.load_retriever(IDX)`.
"""

from __future__ import annotations

import argparse
import sys
import time

from orchestra_jax.data.synthetic_tasks import SyntheticTasks
from orchestra_jax.tools.retrieval import retrievers as retrieval
from orchestra_jax.tools.retrieval.index_folder import build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help="JSONL corpus (id, text[, title])")
    source.add_argument(
        "--synthetic-seed",
        type=int,
        help="index the synthetic world's corpus (data/synthetic_tasks.py)",
    )
    parser.add_argument(
        "--num-entities",
        type=int,
        default=400,
        help="with --synthetic-seed: organisations generated",
    )
    parser.add_argument("--out", required=True, help="index folder to write")
    parser.add_argument("--kind", default="bm25", choices=("bm25", "dense"))
    parser.add_argument(
        "--embedder",
        default="hashing:512",
        help="dense only: hashing[:DIM] | hf:PATH | hf-last:PATH",
    )
    args = parser.parse_args(argv)
    if args.corpus:
        documents = retrieval.read_documents(args.corpus)
    else:
        rows = SyntheticTasks(args.synthetic_seed, num_entities=args.num_entities).corpus_rows()
        documents = [retrieval.Document(**row) for row in rows]
    start = time.monotonic()
    index = build(documents, args.kind, args.embedder)
    index.save(args.out)
    print(
        f"indexed {len(documents)} documents ({args.kind}) into {args.out} "
        f"in {time.monotonic() - start:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
