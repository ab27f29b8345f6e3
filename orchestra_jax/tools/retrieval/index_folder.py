"""Index folders of either kind (BM25 or dense): build one over documents, open one by its manifest."""

from __future__ import annotations

import json
import os

from orchestra_jax.tools.retrieval.dense import DenseRetriever, make_embedder
from orchestra_jax.tools.retrieval.retrievers import MANIFEST, BM25Retriever, Retriever


def build(documents, kind: str, embedder_spec: str):
    """A retriever of `kind` over `documents` (not yet saved)."""
    if kind == "bm25":
        return BM25Retriever(documents)
    if kind == "dense":
        return DenseRetriever(documents, make_embedder(embedder_spec))
    raise ValueError(f"--kind must be 'bm25' or 'dense', got {kind!r}")


def load_retriever(folder: str, **kwargs) -> Retriever:
    """Opens an index folder written by `build_index` (kind from the manifest).

    kwargs go to the kind's loader (dense indexes take `embedder=` to override
    the embedding model recorded in the manifest).
    """
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{folder} is not an index folder (no {MANIFEST}); "
            "build one with python -m "
            "orchestra_jax.tools.build_index"
        )
    with open(path) as f:
        kind = json.load(f).get("kind")
    if kind == "bm25":
        return BM25Retriever.load(folder, **kwargs)
    if kind == "dense":
        return DenseRetriever.load(folder, **kwargs)
    raise ValueError(f"{path}: unknown index kind {kind!r}")
