"""The triplet miner as it was before the false-negative filter and the cap (commit 4515fa6).

A frozen, self-contained copy: tests check that ``mine_triplets`` with default options still
returns exactly these triplets, so triplets persisted by earlier versions stay valid.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import numpy as np

logger = logging.getLogger(__name__)

NEGATIVE_KINDS = ("hard", "random")
_STREAM = {"hard": 1, "random": 2}


def _row_index(ids: list[str], name: str) -> dict[str, int]:
    index = {doc_id: row for row, doc_id in enumerate(ids)}
    if len(index) != len(ids):
        raise ValueError(f"{name} contains duplicate ids; every row needs a unique id.")
    return index


def legacy_mine_triplets(
    query_ids: list[str],
    query_embeddings: np.ndarray,
    doc_ids: list[str],
    doc_embeddings: np.ndarray,
    qrels: dict[str, dict[str, int]],
    n_negatives: int = 4,
    negatives: Literal["hard", "random"] = "hard",
    hard_pool: int = 50,
    seed: int = 2027,
) -> np.ndarray:
    """Triplets for every (query, relevant doc) pair of the given (training) queries.

    Each pair of a query in ``query_ids`` and a doc with ``qrels[query][doc] > 0`` gets
    ``n_negatives`` negatives, drawn without replacement:

    - ``"hard"``: from the frozen model's ``hard_pool`` best-scoring docs (exact inner-product
      search) that remain after the exclusions;
    - ``"random"``: uniformly from the corpus, with the same exclusions.

    Excluded as negatives: every doc relevant to the query (``rel > 0``) and any doc whose id
    equals the query id (ArguAna-style self matches). A pool smaller than ``n_negatives`` gives
    fewer negatives (logged).

    Args:
        query_ids, query_embeddings: the queries, ndarray of shape (n_queries, d).
        doc_ids, doc_embeddings: the corpus, ndarray of shape (n_docs, d).
        qrels: ``{query_id: {doc_id: relevance}}``.
        n_negatives: negatives per (query, positive) pair.
        negatives: ``"hard"`` or ``"random"``.
        hard_pool: size of the hard-negative candidate pool (paper-style top-50).
        seed: seed of the numpy generator.

    Returns:
        ndarray of shape (n_triplets, 3), int64: rows (query row, positive doc row, negative doc
        row) into the given arrays, ordered by query id, then positive id, then draw order.
    """
    if negatives not in NEGATIVE_KINDS:
        raise ValueError(f"negatives must be one of {list(NEGATIVE_KINDS)}; got {negatives!r}.")
    if n_negatives < 1 or hard_pool < 1:
        raise ValueError(f"n_negatives and hard_pool must be >= 1; got {n_negatives} and {hard_pool}.")
    if len(query_ids) != len(query_embeddings) or len(doc_ids) != len(doc_embeddings):
        raise ValueError("ids and embeddings must have the same number of rows.")
    start = time.perf_counter()
    query_row = _row_index(query_ids, "query_ids")
    doc_row = _row_index(doc_ids, "doc_ids")
    n_docs = len(doc_ids)

    # (query id, its positive rows, its excluded rows), in sorted id order.
    plan: list[tuple[str, list[int], set[int]]] = []
    missing = 0
    for query_id in sorted(query_row):
        judged = qrels.get(query_id, {})
        positives = [doc_row[doc_id] for doc_id in sorted(judged) if judged[doc_id] > 0 and doc_id in doc_row]
        missing += sum(1 for doc_id, rel in judged.items() if rel > 0 and doc_id not in doc_row)
        if not positives:
            continue
        excluded = set(positives)
        if query_id in doc_row:
            excluded.add(doc_row[query_id])
        plan.append((query_id, positives, excluded))
    if missing:
        logger.warning("mine_triplets: %d relevant docs are not in the corpus and were skipped.", missing)

    pools: list[np.ndarray] = []
    if negatives == "hard" and plan:
        from embedtune.evaluate.search import exact_search

        widest = max(len(excluded) for _, _, excluded in plan)
        rows = np.array([query_row[query_id] for query_id, _, _ in plan])
        _, I = exact_search(np.asarray(query_embeddings)[rows], doc_embeddings, k=hard_pool + widest)
        for (_, _, excluded), candidates in zip(plan, I):
            pools.append(np.array([row for row in candidates if row not in excluded][:hard_pool], dtype=np.int64))

    # Random draws index docs in sorted-id order, so the result does not depend on row order.
    rows_by_id = np.array([doc_row[doc_id] for doc_id in sorted(doc_row)], dtype=np.int64)
    rank_of_row = np.empty(n_docs, dtype=np.int64)
    rank_of_row[rows_by_id] = np.arange(n_docs)
    rng = np.random.default_rng([seed, _STREAM[negatives]])
    triplets: list[tuple[int, int, int]] = []
    short = 0
    for position, (query_id, positives, excluded) in enumerate(plan):
        available = (len(pools[position]) if negatives == "hard" else n_docs - len(excluded))
        take = min(n_negatives, available)
        short += take < n_negatives
        for positive in positives:
            if negatives == "hard":
                chosen = rng.choice(pools[position], size=take, replace=False)
            else:
                ranks = _draw_uniform(rng, n_docs, take, {int(rank_of_row[row]) for row in excluded})
                chosen = rows_by_id[ranks]
            triplets.extend((query_row[query_id], positive, int(negative)) for negative in chosen)
    if short:
        logger.warning("mine_triplets: %d queries had fewer than %d candidate negatives.", short, n_negatives)
    result = np.array(triplets, dtype=np.int64).reshape(-1, 3)
    logger.info(
        "mine_triplets: %d triplets (%s negatives) for %d queries in %.2fs", len(result), negatives, len(plan), time.perf_counter() - start
    )
    return result


def _draw_uniform(rng: np.random.Generator, n_docs: int, take: int, excluded: set[int]) -> list[int]:
    """``take`` distinct values from ``range(n_docs)`` minus ``excluded``, by rejection.

    Rejection keeps each draw O(take) on a large corpus, where building the allowed list per
    pair would be O(n_docs).
    """
    if take * 2 > n_docs - len(excluded):
        allowed = np.setdiff1d(np.arange(n_docs), np.fromiter(excluded, dtype=np.int64, count=len(excluded)))
        return [int(row) for row in rng.choice(allowed, size=take, replace=False)]
    chosen: list[int] = []
    seen = set(excluded)
    while len(chosen) < take:
        row = int(rng.integers(n_docs))
        if row not in seen:
            seen.add(row)
            chosen.append(row)
    return chosen
