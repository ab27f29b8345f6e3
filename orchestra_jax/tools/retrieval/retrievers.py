"""Document retrieval: the `Retriever` protocol, BM25, and persisted indexes.

An index folder holds `manifest.json` ({"kind": "bm25" | "dense", …}),
`documents.jsonl` (one `Document` per line) and the kind's own files;
`tools/retrieval/index_folder.py` builds and opens folders of either kind
(`python -m orchestra_jax.tools.build_index` writes one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

MANIFEST = "manifest.json"
DOCUMENTS = "documents.jsonl"
TOKEN_RE = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the "
    "this to was were what when where which who whom whose why how with does "
    "did do".split()
)


DOCUMENT_TEXTS = ("title_text", "content")


@dataclasses.dataclass(frozen=True)
class Document:
    """A retrievable text. `score` is filled in by a search (higher = better)."""

    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    score: float = 0.0

    def render(self, form: str = "title_text") -> str:
        """How the orchestrator and experts see it (`DOCUMENT_TEXTS`): "title_text",
        `title: text`; "content", the text as the retriever holds it (the release's
        `content`/`contents` field)."""
        if form not in DOCUMENT_TEXTS:
            raise ValueError(f"document text must be one of {DOCUMENT_TEXTS}, got {form!r}")
        return f"{self.title}: {self.text}" if self.title and form == "title_text" else self.text


@runtime_checkable
class Retriever(Protocol):
    """`search(query, k, allowed_ids=None) -> list[Document]`, best first.

    `allowed_ids` restricts results to those document ids (per-task corpora).
    """

    def search(
        self, query: str, k: int, allowed_ids: Collection[str] | None = None
    ) -> list[Document]: ...


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric words without English stopwords."""
    return [t for t in TOKEN_RE.findall(text.lower()) if t not in STOPWORDS]


def top_k_indices(scores: np.ndarray, k: int, allowed: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k highest scores (ties: lower index first), optionally
    only among `allowed` (bool mask); scores <= 0 never match."""
    scores = np.asarray(scores, dtype=np.float64)
    valid = scores > 0
    if allowed is not None:
        valid &= allowed
    candidates = np.flatnonzero(valid)
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order[:k]]


def allowed_mask(ids: Sequence[str], allowed_ids: Collection[str] | None) -> np.ndarray | None:
    if allowed_ids is None:
        return None
    allowed = set(allowed_ids)
    return np.fromiter((i in allowed for i in ids), dtype=bool, count=len(ids))


def write_documents(folder: str, documents: Iterable[Document]) -> None:
    with open(os.path.join(folder, DOCUMENTS), "w", encoding="utf-8") as f:
        for d in documents:
            row = dataclasses.asdict(d)
            row.pop("score")
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_documents(path: str) -> list[Document]:
    """Reads a JSONL corpus: `id`, `text`, optional `title`, `metadata`."""
    docs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "id" not in row or "text" not in row:
                raise ValueError(f"{path}:{n}: each document needs 'id' and 'text'")
            docs.append(
                Document(
                    id=str(row["id"]),
                    text=row["text"],
                    title=row.get("title", ""),
                    metadata=row.get("metadata", {}),
                )
            )
    return docs


def check_unique_ids(documents: Sequence[Document]) -> None:
    seen = set()
    for d in documents:
        if d.id in seen:
            raise ValueError(f"duplicate document id {d.id!r}")
        seen.add(d.id)


class BM25Retriever:
    """Okapi BM25 (bm25s) over `title + text`, scored exactly over all documents.

    score(q, d) = sum_{t in q} idf(t) * tf(t, d) * (k1 + 1)
                  / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl)),
    with bm25s's defaults (k1 = 1.5, b = 0.75, Lucene idf).
    """

    kind = "bm25"

    def __init__(self, documents: Sequence[Document], _index=None):
        import bm25s  # heavy import, only when BM25 is used

        self.documents = list(documents)
        check_unique_ids(self.documents)
        self.ids = [d.id for d in self.documents]
        if _index is None:
            _index = bm25s.BM25()
            _index.index([tokenize(d.render()) for d in self.documents], show_progress=False)
        self._index = _index

    def search(
        self, query: str, k: int, allowed_ids: Collection[str] | None = None
    ) -> list[Document]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        terms = tokenize(query)
        if not terms or not self.documents:
            return []
        scores = self._index.get_scores(terms)
        hits = top_k_indices(scores, k, allowed_mask(self.ids, allowed_ids))
        return [dataclasses.replace(self.documents[i], score=float(scores[i])) for i in hits]

    def save(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self._index.save(os.path.join(folder, "bm25"), show_progress=False)
        write_documents(folder, self.documents)
        with open(os.path.join(folder, MANIFEST), "w") as f:
            json.dump({"kind": self.kind, "num_documents": len(self.documents)}, f)

    @classmethod
    def load(cls, folder: str) -> BM25Retriever:
        import bm25s

        index = bm25s.BM25.load(os.path.join(folder, "bm25"), show_progress=False)
        return cls(read_documents(os.path.join(folder, DOCUMENTS)), _index=index)


class FallbackRetriever:
    """`primary`'s hits, topped up from `fallback` when fewer than `min_docs` survive.

    The reference's HLE search: a local index whose hits are filtered to the
    question's document whitelist, and web search when fewer than 3 remain.
    The fallback is asked without the whitelist (it cannot know those ids) for
    the missing k - len(hits) documents. A failing fallback leaves the hits it
    had (or raises, when there are none: the search tool reports the error).
    """

    def __init__(self, primary: Retriever, fallback: Retriever, *, min_docs: int = 3):
        if min_docs < 1:
            raise ValueError(f"min_docs must be >= 1, got {min_docs}")
        self.primary, self.fallback, self.min_docs = primary, fallback, min_docs

    def search(
        self, query: str, k: int, allowed_ids: Collection[str] | None = None
    ) -> list[Document]:
        hits = self.primary.search(query, k, allowed_ids)
        if len(hits) >= min(self.min_docs, k):
            return hits
        try:
            extra = self.fallback.search(query, k - len(hits), None)
        except RuntimeError:
            if not hits:
                raise
            return hits
        seen = {d.id for d in hits}
        return hits + [d for d in extra if d.id not in seen][: k - len(hits)]
