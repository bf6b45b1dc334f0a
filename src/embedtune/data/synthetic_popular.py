"""A synthetic retrieval set where memorising popular documents pays on seen queries only.

:func:`make_popular_documents_dataset` builds the situation found on SciFact: most
training queries share a few **popular** relevant documents, so a map fitted on them can score
well by pulling every query toward those documents, which ranks every other document lower.

- ``n_popular`` documents are each relevant to many training queries and to the ``seen`` test
  queries; every other query (the ``unseen`` test queries and a few training ones) has its own
  relevant document that no other query shares;
- the first ``n_style`` coordinates are **style**: they vary most across documents (so PCA
  keeps them first), but a query's style is drawn afresh, so they say nothing about relevance.
  A supervised map that learns to drop them gains on every query, seen or unseen: the real
  learning a generalising compressor should keep;
- on the other coordinates a query is its relevant document plus noise of expected norm
  ``query_noise`` (relative to the document's); the corpus has ``n_topics`` shared directions there.
  Queries for popular documents are vaguer (``popular_query_noise``), so a map that widens the
  popular documents' reach wins on them and takes the top ranks from every other query.

The test split is fixed by construction (``test_ids``), and ``popular`` names the popular
documents, so a test can check the unseen queries directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PopularDocumentsDataset", "make_popular_documents_dataset"]


@dataclass
class PopularDocumentsDataset:
    """Row-aligned ids and unit float32 vectors, judgments, and the intended train/test split."""

    query_ids: list[str]
    query_emb: np.ndarray
    doc_ids: list[str]
    doc_emb: np.ndarray
    qrels: dict[str, dict[str, int]]
    train_ids: list[str]
    test_ids: list[str]
    popular: set[str]


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def make_popular_documents_dataset(
    dim: int = 48,
    n_docs: int = 1500,
    n_topics: int = 12,
    n_popular: int = 15,
    train_per_popular: int = 30,
    n_train_unique: int = 40,
    n_test_seen: int = 60,
    n_test_unseen: int = 120,
    query_noise: float = 1.0,
    popular_query_noise: float = 2.0,
    n_style: int = 12,
    style_scale: float = 0.35,
    seed: int = 0,
) -> PopularDocumentsDataset:
    """Build the set; see the module docstring. Deterministic for a given ``seed``."""
    rng = np.random.default_rng(seed)
    topical_dim = dim - n_style
    topics = _unit(rng.normal(size=(n_topics, topical_dim)))
    topical = _unit(rng.normal(size=(n_docs, topical_dim)) * 0.5 / np.sqrt(topical_dim) + rng.normal(size=(n_docs, n_topics)) * 0.6 @ topics)
    docs = _unit(np.hstack([rng.normal(size=(n_docs, n_style)) * style_scale, topical]))
    doc_ids = [f"d{i:05d}" for i in range(n_docs)]
    order = rng.permutation(n_docs)
    popular_rows = order[:n_popular]
    unique_rows = iter(order[n_popular:])

    queries, query_ids, qrels = [], [], {}
    train_ids, test_ids = [], []

    def add(row: int, prefix: str, bucket: list[str], noise: float) -> None:
        qid = f"{prefix}{len(query_ids):05d}"
        doc_topical = docs[row, n_style:]
        topical_part = doc_topical + rng.normal(size=topical_dim) * noise * np.linalg.norm(doc_topical) / np.sqrt(topical_dim)
        topical_part *= np.linalg.norm(doc_topical) / np.linalg.norm(topical_part)
        queries.append(np.concatenate([rng.normal(size=n_style) * style_scale, topical_part]))
        query_ids.append(qid)
        qrels[qid] = {doc_ids[row]: 1}
        bucket.append(qid)

    for row in popular_rows:
        for _ in range(train_per_popular):
            add(int(row), "q", train_ids, popular_query_noise)
    for _ in range(n_train_unique):
        add(int(next(unique_rows)), "q", train_ids, query_noise)
    for i in range(n_test_seen):
        add(int(popular_rows[i % n_popular]), "t", test_ids, popular_query_noise)
    for _ in range(n_test_unseen):
        add(int(next(unique_rows)), "t", test_ids, query_noise)
    return PopularDocumentsDataset(query_ids, _unit(np.asarray(queries)), doc_ids, docs, qrels, train_ids, test_ids,
                                   {doc_ids[row] for row in popular_rows})
