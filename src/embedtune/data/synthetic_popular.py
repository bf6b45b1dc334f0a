"""A synthetic retrieval set where memorising popular documents pays on seen queries only.

:func:`make_popular_documents_dataset` builds the situation found on SciFact (issue 27): most
training queries share a few **popular** relevant documents, so a map fitted on them can score
well by pulling every query toward those documents, which ranks every other document lower.

- ``n_popular`` documents are each relevant to many training queries and to the ``seen`` test
  queries; every other query (the ``unseen`` test queries and a few training ones) has its own
  relevant document that no other query shares;
- a query is its relevant document plus isotropic noise of expected norm ``query_noise``, so the frozen
  space is a fair but imperfect retriever and there is something to learn;
- the background corpus is random unit vectors plus ``n_topics`` shared directions, so PCA
  has structure to find.

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
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_popular_documents_dataset(
    dim: int = 48,
    n_docs: int = 1500,
    n_topics: int = 12,
    n_popular: int = 15,
    train_per_popular: int = 16,
    n_train_unique: int = 40,
    n_test_seen: int = 60,
    n_test_unseen: int = 120,
    query_noise: float = 1.5,
    seed: int = 0,
) -> PopularDocumentsDataset:
    """Build the set; see the module docstring. Deterministic for a given ``seed``."""
    rng = np.random.default_rng(seed)
    topics = _unit(rng.normal(size=(n_topics, dim)))
    weights = rng.normal(size=(n_docs, n_topics)) * 0.6
    docs = _unit(rng.normal(size=(n_docs, dim)) * 0.5 + weights @ topics)
    doc_ids = [f"d{i:05d}" for i in range(n_docs)]
    order = rng.permutation(n_docs)
    popular_rows = order[:n_popular]
    unique_rows = iter(order[n_popular:])

    queries, query_ids, qrels = [], [], {}
    train_ids, test_ids = [], []

    def add(row: int, prefix: str, bucket: list[str]) -> None:
        qid = f"{prefix}{len(query_ids):05d}"
        queries.append(docs[row] + rng.normal(size=dim) * query_noise / np.sqrt(dim))
        query_ids.append(qid)
        qrels[qid] = {doc_ids[row]: 1}
        bucket.append(qid)

    for row in popular_rows:
        for _ in range(train_per_popular):
            add(int(row), "q", train_ids)
    for _ in range(n_train_unique):
        add(int(next(unique_rows)), "q", train_ids)
    for i in range(n_test_seen):
        add(int(popular_rows[i % n_popular]), "t", test_ids)
    for _ in range(n_test_unseen):
        add(int(next(unique_rows)), "t", test_ids)
    return PopularDocumentsDataset(query_ids, _unit(np.asarray(queries)), doc_ids, docs, qrels, train_ids, test_ids,
                                   {doc_ids[row] for row in popular_rows})
