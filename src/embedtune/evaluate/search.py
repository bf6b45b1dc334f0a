"""Exact inner-product search, batched, with deterministic tie-breaking.

Plain functions in the FAISS-contrib style: float32 numpy in, ``(D, I)`` out.
"""

from __future__ import annotations

import logging
import time

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["exact_search", "search_ids"]


def _as_rows(x: np.ndarray, name: str) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d); got {x.shape}.")
    return x


def _break_ties(D: np.ndarray, I: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order equal scores by ascending corpus row, so results never depend on the kernel."""
    order = np.lexsort((I, -D), axis=1) if D.size else np.zeros_like(I)
    return np.take_along_axis(D, order, axis=1), np.take_along_axis(I, order, axis=1)


def exact_search(xq: np.ndarray, xb: np.ndarray, k: int = 100, batch_size: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` rows of ``xb`` by inner product for each row of ``xq`` (FAISS ``IndexFlatIP``).

    Returns ``D`` (scores, descending) and ``I`` (row indices), both of shape ``(nq, k')``
    with ``k' = min(k, nb)``. Ties are broken by ascending row index.
    """
    import faiss

    xq, xb = _as_rows(xq, "xq"), _as_rows(xb, "xb")
    if xq.shape[1] != xb.shape[1]:
        raise ValueError(f"query dim {xq.shape[1]} != corpus dim {xb.shape[1]}.")
    k = min(int(k), xb.shape[0])
    if k <= 0:
        return np.zeros((len(xq), 0), np.float32), np.zeros((len(xq), 0), np.int64)
    start = time.perf_counter()
    index = faiss.IndexFlatIP(xb.shape[1])
    index.add(xb)
    # One extra candidate lets a tie at rank k be resolved by row order, not by the kernel.
    fetch = min(k + 1, xb.shape[0])
    D_parts, I_parts = [], []
    for lo in range(0, len(xq), batch_size):
        D_b, I_b = index.search(xq[lo : lo + batch_size], fetch)
        D_b, I_b = _break_ties(D_b, I_b)
        D_parts.append(D_b[:, :k])
        I_parts.append(I_b[:, :k])
    D = np.concatenate(D_parts) if D_parts else np.zeros((0, k), np.float32)
    I = np.concatenate(I_parts) if I_parts else np.zeros((0, k), np.int64)
    logger.debug("exact_search: %d x %d-d queries over %d docs in %.3fs", len(xq), xq.shape[1], len(xb), time.perf_counter() - start)
    return D, I.astype(np.int64)


def search_ids(
    query_ids: list[str],
    query_embeddings: np.ndarray,
    doc_ids: list[str],
    doc_embeddings: np.ndarray,
    top_k: int = 100,
    ignore_identical_ids: bool = True,
) -> dict[str, dict[str, float]]:
    """Retrieve and return a BEIR/pytrec_eval run ``{query_id: {doc_id: score}}``.

    With ``ignore_identical_ids`` (BEIR's default) a retrieved doc whose id equals the query id
    is dropped, as ArguAna requires; one extra candidate is fetched so ``top_k`` stay.
    """
    if len(query_ids) != len(query_embeddings) or len(doc_ids) != len(doc_embeddings):
        raise ValueError("ids and embeddings must have the same number of rows.")
    extra = 1 if ignore_identical_ids else 0
    D, I = exact_search(query_embeddings, doc_embeddings, k=top_k + extra)
    run: dict[str, dict[str, float]] = {}
    for row, query_id in enumerate(query_ids):
        hits: dict[str, float] = {}
        for score, index in zip(D[row], I[row]):
            doc_id = doc_ids[index]
            if ignore_identical_ids and doc_id == query_id:
                continue
            hits[doc_id] = float(score)
            if len(hits) == top_k:
                break
        run[query_id] = hits
    return run
