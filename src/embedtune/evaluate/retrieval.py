"""Embeddings in, metrics out: the one call every evaluator and benchmark uses."""

from __future__ import annotations

import numpy as np

from embedtune.evaluate.metrics import DEFAULT_METRICS, RetrievalMetrics, evaluate_run
from embedtune.evaluate.search import search_ids

__all__ = ["evaluate_embeddings"]


def evaluate_embeddings(
    query_ids: list[str],
    query_embeddings: np.ndarray,
    doc_ids: list[str],
    doc_embeddings: np.ndarray,
    qrels: dict[str, dict[str, int]],
    top_k: int = 100,
    ignore_identical_ids: bool = True,
    metrics: tuple[str, ...] = DEFAULT_METRICS,
) -> RetrievalMetrics:
    """Exact search of ``query_embeddings`` over ``doc_embeddings``, scored against ``qrels``.

    Only queries present in both ``query_ids`` and ``qrels`` are scored.
    """
    wanted = [i for i, qid in enumerate(query_ids) if qrels.get(qid)]
    ids = [query_ids[i] for i in wanted]
    run = search_ids(ids, query_embeddings[wanted], doc_ids, doc_embeddings, top_k, ignore_identical_ids)
    return evaluate_run({qid: qrels[qid] for qid in ids}, run, metrics)
