"""Embeddings in, metrics out: the one call every evaluator and benchmark uses."""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np

from embedtune.errors import NoQueriesError, check_finite
from embedtune.evaluate.metrics import DEFAULT_METRICS, RetrievalMetrics, evaluate_run
from embedtune.evaluate.search import search_ids, unit_rows

__all__ = ["evaluate_embeddings", "identical_judged_pairs", "SIMILARITIES"]

logger = logging.getLogger(__name__)
_WARNED: set[tuple[int, tuple[str, ...]]] = set()

SIMILARITIES = ("cosine", "dot")


def evaluate_embeddings(
    query_ids: list[str],
    query_embeddings: np.ndarray,
    doc_ids: list[str],
    doc_embeddings: np.ndarray,
    qrels: dict[str, dict[str, int]],
    top_k: int = 100,
    ignore_identical_ids: bool = True,
    metrics: tuple[str, ...] = DEFAULT_METRICS,
    similarity: Literal["cosine", "dot"] = "dot",
) -> RetrievalMetrics:
    """Exact search of ``query_embeddings`` over ``doc_embeddings``, scored against ``qrels``.

    Only queries present in both ``query_ids`` and ``qrels`` are scored.

    Args:
        similarity: ``"dot"`` ranks by the raw inner product; ``"cosine"`` L2-normalises both
            sides first (rows that already have unit norm are used as they are, bit for bit),
            whatever the vectors' source.

    Raises:
        NoQueriesError: no query is left to score (no query ids, none judged in ``qrels``, or
            no judged document among ``doc_ids``), saying which.
        NonFiniteError: an embedding holds NaN or infinity.
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {list(SIMILARITIES)}; got {similarity!r}.")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1; got {top_k!r}.")
    wanted = [i for i, qid in enumerate(query_ids) if qrels.get(qid)]
    ids = [query_ids[i] for i in wanted]
    _check_something_to_score(query_ids, ids, doc_ids, qrels)
    check_finite(query_embeddings, "query embeddings", "query")
    check_finite(doc_embeddings, "document embeddings", "document")
    queries, docs = query_embeddings[wanted], doc_embeddings
    if similarity == "cosine":
        queries, docs = unit_rows(queries), unit_rows(docs)
    if ignore_identical_ids:
        warn_identical_judged_pairs(qrels, ids, doc_ids)
    run = search_ids(ids, queries, doc_ids, docs, top_k, ignore_identical_ids)
    return evaluate_run({qid: qrels[qid] for qid in ids}, run, metrics)


def identical_judged_pairs(qrels: dict[str, dict[str, int]], query_ids: list[str], doc_ids: list[str]) -> list[str]:
    """The queries judged relevant to a document with their own id: BEIR's identical-id rule drops that
    document from every ranking, so such a pair can never be found and counts as a miss."""
    documents = set(doc_ids)
    return [qid for qid in query_ids if qrels.get(qid, {}).get(qid, 0) > 0 and qid in documents]


def warn_identical_judged_pairs(qrels: dict[str, dict[str, int]], query_ids: list[str], doc_ids: list[str]) -> int:
    """Log a warning naming the judged pairs the identical-id rule makes unreachable; returns their count.

    The rule is right for BEIR data (on ArguAna every query is also a document, never judged
    relevant to itself), but on data whose queries and documents are numbered independently it
    silently turns real judgments into misses.
    """
    pairs = identical_judged_pairs(qrels, query_ids, doc_ids)
    key = (len(pairs), tuple(pairs[:5]))
    if pairs and key not in _WARNED:  # once per set of pairs, not once per evaluation of a training run
        _WARNED.add(key)
        logger.warning("%d judged (query, document) pair(s) share an id (e.g. query %r and document %r): BEIR's rule drops a hit "
                       "whose id equals its query's, so they count as misses. If your queries and documents are numbered "
                       "independently, score with `embedtune evaluate --keep-identical-ids` (and search with `search --keep-identical-ids`).",
                       len(pairs), pairs[0], pairs[0])
    return len(pairs)


def _check_something_to_score(query_ids: list[str], scored: list[str], doc_ids: list[str], qrels: dict[str, dict[str, int]]) -> None:
    """Refuse metrics over zero queries, or over queries none of whose judged documents can be retrieved."""
    if not query_ids:
        raise NoQueriesError("no query to score: the query list is empty. Fix: pass the queries of a non-empty split part.")
    if not scored:
        raise NoQueriesError(
            f"no query to score: none of the {len(query_ids)} queries (e.g. {query_ids[0]!r}) has a judgment in the "
            f"qrels ({len(qrels)} judged queries). Fix: pass the qrels that belong to these queries."
        )
    judged = {did for qid in scored for did, rel in qrels[qid].items() if rel > 0}
    if not judged:
        raise NoQueriesError(
            f"no query to score: none of the {len(scored)} judged queries has a relevant document (score > 0). "
            "Fix: mark relevant documents with a score of 1 or more."
        )
    if judged.isdisjoint(doc_ids):
        example = next(iter(doc_ids), None)
        raise NoQueriesError(
            f"no query can be scored: none of the {len(judged)} relevant documents of the {len(scored)} queries "
            f"(e.g. {sorted(judged)[0]!r}) is among the {len(doc_ids)} searched document ids"
            f"{f' (e.g. {example!r})' if example is not None else ''}. Fix: the document ids must be the corpus ids of the qrels."
        )
