"""Exact inner-product search, batched, with deterministic tie-breaking.

Plain functions in the FAISS-contrib style: float32 numpy in, ``(D, I)`` out.

The top candidates come from the fastest exact kernel for the shape
(:mod:`embedtune.evaluate.kernels`, measured on first use). Kernels round differently, so
the candidates are then rescored canonically (float64 accumulation, rounded to float32) and
ordered by descending score, then ascending row. A few extra candidates are fetched so that a
near-tie at rank ``k`` cannot depend on the kernel; where a tie reaches the last extra
candidate (duplicate documents), that query is resolved against the whole corpus. The results
are therefore the same whichever kernel wins.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Iterable, Iterator

import numpy as np

from embedtune.array_facts import known, remember

from embedtune.evaluate import kernels as _kernels

logger = logging.getLogger(__name__)

__all__ = ["as_rows", "unit_rows", "break_ties", "exact_search", "exact_search_blocks", "merge_topk", "search_ids", "rescore"]

# Extra candidates fetched past k so that kernel rounding cannot change which rows make the cut.
TIE_MARGIN = 8
_RESCORE_BYTES = 32 << 20


def as_rows(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` as a C-contiguous float32 matrix of shape (n, d), the input every search helper expects.

    Raises:
        ValueError: naming ``name`` when ``x`` is not two-dimensional.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d); got {x.shape}.")
    return x


def unit_rows(x: np.ndarray, tolerance: float = 1e-4) -> np.ndarray:
    """``x`` with every row scaled to unit L2 norm (cosine similarity as an inner product).

    Rows already within ``tolerance`` of unit norm are kept bit for bit (encoders that normalise,
    and compressors, give such rows), so scores of normalised inputs do not change; a zero row
    stays zero. Returns ``x`` itself when every row is unit, else a float32 copy.
    """
    x = as_rows(x, "x")
    if tolerance >= 1e-4 and known(x, "unit"):  # a read-only corpus found unit before (array_facts)
        return x
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))  # (n,)
    off = np.abs(norms - 1.0) > tolerance
    if not off.any():
        if tolerance <= 1e-4:
            remember(x, "unit")
        return x
    scale = np.ones_like(norms)
    scale[off & (norms > 0)] = 1.0 / norms[off & (norms > 0)]
    out = x.copy()
    out[off] = (x[off].astype(np.float64) * scale[off, None]).astype(np.float32)
    return out


def break_ties(D: np.ndarray, I: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort each query's ``(D, I)`` by descending score, equal scores by ascending corpus row.

    Every search in embedtune returns this order, so results never depend on the kernel or index.
    ``D`` and ``I`` have shape (nq, k); returns new arrays of the same shape.
    """
    order = np.lexsort((I, -D), axis=1) if D.size else np.zeros_like(I)
    return np.take_along_axis(D, order, axis=1), np.take_along_axis(I, order, axis=1)


def rescore(xq: np.ndarray, xb: np.ndarray, I: np.ndarray) -> np.ndarray:
    """Canonical scores ``xq[i] . xb[I[i, j]]``: float64 accumulation, rounded to float32.

    ``I`` has shape ``(nq, m)``; returns ``D`` of the same shape. Independent of any BLAS.
    """
    nq, m = I.shape
    D = np.empty((nq, m), dtype=np.float32)
    if D.size == 0:
        return D
    d = xq.shape[1]
    step = max(1, _RESCORE_BYTES // (8 * m * d))
    for lo in range(0, nq, step):
        rows = xb[I[lo : lo + step].ravel()].reshape(-1, m, d)  # (step, m, d)
        # einsum casts to float64 in its own buffers: the same sums as on float64 copies, without making them.
        D[lo : lo + step] = np.einsum("qd,qmd->qm", xq[lo : lo + step], rows, dtype=np.float64)
    return D


def _rounding_bound(xq: np.ndarray, xb: np.ndarray, I: np.ndarray) -> np.ndarray:
    """Per-query bound on float32 dot-product rounding, ``d * 2^-23 * |q| * max |x|`` over candidates."""
    d = xq.shape[1]
    query_norms = np.linalg.norm(xq, axis=1)
    if I.size >= len(xb):  # more candidates than rows: every row's norm once, not a gathered copy of the candidates
        candidate_norms = np.sqrt(np.einsum("ij,ij->i", xb, xb, dtype=np.float64))[I].max(axis=1)
    else:
        candidate_norms = np.linalg.norm(xb[I.ravel()], axis=1).reshape(I.shape).max(axis=1)
    return d * 2.0**-23 * query_norms * candidate_norms


def _resolve_whole_corpus(q: np.ndarray, xb: np.ndarray, k: int, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` of one query with ties by row: every row scoring above ``floor`` is rescored."""
    rows = []
    block = max(1, (64 << 20) // (4 * xb.shape[1]))
    for start in range(0, len(xb), block):
        scores = xb[start : start + block] @ q
        rows.append(np.flatnonzero(scores >= floor) + start)
    I = np.concatenate(rows)[None, :]
    D = rescore(q[None, :], xb, I)
    D, I = break_ties(D, I)
    return D[0, :k], I[0, :k]


def _search_batch(xq: np.ndarray, xb: np.ndarray, k: int, kernel: str) -> tuple[np.ndarray, np.ndarray]:
    nb = len(xb)
    fetch = min(k + TIE_MARGIN, nb)
    name = _kernels.select_kernel(xq, xb, fetch) if kernel == "auto" else kernel
    _, I = _kernels.KERNELS[name](xq, xb, fetch)
    D = rescore(xq, xb, I)
    D, I = break_ties(D, I)
    if fetch < nb:
        # A row left out scores (in the kernel) at most the last candidate's kernel score; if the
        # k-th canonical score is not clearly above the last candidate, rounding or a duplicate
        # could have put a lower row, or a better one, outside the candidates.
        bound = _rounding_bound(xq, xb, I)
        unsure = np.flatnonzero(D[:, k - 1] - D[:, fetch - 1] <= 4 * bound)
        for row in unsure:
            D[row, :k], I[row, :k] = _resolve_whole_corpus(xq[row], xb, k, float(D[row, k - 1] - 4 * bound[row]))
        if len(unsure):
            logger.debug("exact_search: %d queries with a tie at rank %d resolved on the whole corpus", len(unsure), k)
    return D[:, :k], I[:, :k]


def exact_search(
    xq: np.ndarray,
    xb: np.ndarray,
    k: int = 100,
    batch_size: int = 1024,
    kernel: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` rows of ``xb`` by inner product for each row of ``xq``.

    Returns ``D`` (scores, descending) and ``I`` (row indices), both of shape ``(nq, k')``
    with ``k' = min(k, nb)``. Ties are broken by ascending row index.

    Args:
        kernel: ``"auto"`` (default) times the exact kernels of
            :data:`embedtune.evaluate.kernels.KERNELS` once per shape class and uses the
            fastest; a name pins one. ``EMBEDTUNE_SEARCH_KERNEL`` sets the default. The
            results do not depend on the kernel, only the speed does.
    """
    xq, xb = as_rows(xq, "xq"), as_rows(xb, "xb")
    if len(xb) == 0:
        raise ValueError("the corpus to search is empty (0 document vectors). Fix: give at least one document.")
    if xq.shape[1] != xb.shape[1]:
        raise ValueError(
            f"the queries have {xq.shape[1]} dimensions but the documents have {xb.shape[1]}. "
            "Fix: embed (or compress) queries and documents with the same model."
        )
    kernel = kernel or os.environ.get("EMBEDTUNE_SEARCH_KERNEL", "auto")
    if kernel != "auto" and kernel not in _kernels.KERNELS:
        raise ValueError(f"unknown search kernel {kernel!r}; valid: auto, {', '.join(_kernels.KERNELS)}.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}.")
    k = min(int(k), xb.shape[0])
    if k <= 0:
        return np.zeros((len(xq), 0), np.float32), np.zeros((len(xq), 0), np.int64)
    start = time.perf_counter()
    D_parts, I_parts = [], []
    for lo in range(0, len(xq), batch_size):
        D_b, I_b = _search_batch(xq[lo : lo + batch_size], xb, k, kernel)
        D_parts.append(D_b)
        I_parts.append(I_b)
    D = np.concatenate(D_parts) if D_parts else np.zeros((0, k), np.float32)
    I = np.concatenate(I_parts) if I_parts else np.zeros((0, k), np.int64)
    logger.debug("exact_search: %d x %d-d queries over %d docs in %.3fs", len(xq), xq.shape[1], len(xb), time.perf_counter() - start)
    return D, I.astype(np.int64, copy=False)


def merge_topk(parts: Iterable[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-block ``(D, I)`` results (global row ids) into the top ``k``, ties by row."""
    D_all, I_all = zip(*parts)
    D, I = break_ties(np.concatenate(D_all, axis=1), np.concatenate(I_all, axis=1))
    return D[:, :k], I[:, :k]


def exact_search_blocks(
    xq: np.ndarray,
    blocks: Iterable[tuple[int, np.ndarray]] | Iterator[tuple[int, np.ndarray]],
    k: int = 100,
    batch_size: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`exact_search` over a corpus that arrives as ``(start_row, block)`` pieces.

    For corpora larger than memory (e.g. ``embedtune.compress.streaming.iter_row_blocks`` of
    a memory-mapped ``.npy``): each block is searched exactly and the results are merged, so
    ``D, I`` equal one search over the concatenated corpus.
    """
    xq = as_rows(xq, "xq")
    merged: tuple[np.ndarray, np.ndarray] | None = None
    for start, block in blocks:
        D_b, I_b = exact_search(xq, block, k, batch_size)
        current = (D_b, I_b + int(start))
        merged = current if merged is None else merge_topk([merged, current], k)
    if merged is None:
        return np.zeros((len(xq), 0), np.float32), np.zeros((len(xq), 0), np.int64)
    return merged


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
    return run_from_topk(query_ids, D, I, doc_ids, top_k, ignore_identical_ids)


def run_from_topk(
    query_ids: list[str],
    D: np.ndarray,
    I: np.ndarray,
    doc_ids: list[str],
    top_k: int = 100,
    ignore_identical_ids: bool = True,
) -> dict[str, dict[str, float]]:
    """Turn ``(D, I)`` rows into a run ``{query_id: {doc_id: score}}`` (any search, exact or not)."""
    run: dict[str, dict[str, float]] = {}
    for row, query_id in enumerate(query_ids):
        hits: dict[str, float] = {}
        for score, index in zip(D[row], I[row]):
            if index < 0:  # FAISS pads missing results with -1
                continue
            doc_id = doc_ids[index]
            if ignore_identical_ids and doc_id == query_id:
                continue
            hits[doc_id] = float(score)
            if len(hits) == top_k:
                break
        run[query_id] = hits
    return run
