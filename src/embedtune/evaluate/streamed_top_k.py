"""Exact inner-product top-k of a few queries over a corpus streamed in blocks, with each query's own row excluded.

What the label-free objectives score against (the uncompressed model's top-10 of each held-out
document or unlabelled query) and what a plan's full-corpus check re-scores over every row. The
corpus may be a memory map: it is read one block of rows at a time.
"""

from __future__ import annotations

import numpy as np

from embedtune.io import release_mapped_pages

__all__ = ["TOP_K_DOC_BLOCK", "exact_top_k"]

#: Rows of the corpus :func:`exact_top_k` scores at a time: a (queries x rows) block of scores, never queries x corpus.
TOP_K_DOC_BLOCK = 65_536


def exact_top_k(xq: np.ndarray, xb: np.ndarray, k: int, exclude: np.ndarray | None = None, block: int = 256,
                doc_block: int = TOP_K_DOC_BLOCK) -> np.ndarray:
    """``I`` of shape (n_queries, k): the rows of ``xb`` with the ``k`` highest inner products per query, best first
    (equal scores: the lower row first).

    ``exclude`` (one ``xb`` row per query, or -1 for none) is never returned for its query: a corpus
    document used as a query does not find itself. The corpus is streamed: ``block`` queries against
    ``doc_block`` rows at a time, each block's best ``k`` merged into the running best, so memory is
    ``block x doc_block`` scores whatever the corpus size (``xb`` may be a memory map; each block is
    read as float32 once). The result does not depend on the block sizes.
    """
    xq = np.ascontiguousarray(xq, dtype=np.float32)
    assert xq.ndim == 2 and xb.ndim == 2 and xq.shape[1] == xb.shape[1], (xq.shape, xb.shape)
    if block < 1 or doc_block < 1:
        raise ValueError(f"block sizes must be positive; got {block} and {doc_block}.")
    n_docs = len(xb)
    n_keep = n_docs - (0 if exclude is None else 1)
    if not 0 < k <= n_keep:
        raise ValueError(f"k must be in 1..{n_keep} (the documents a query can find); got {k}.")
    own_all = None if exclude is None else np.asarray(exclude, dtype=np.int64)
    best_s = np.full((len(xq), k), -np.inf, dtype=np.float32)
    best_i = np.full((len(xq), k), np.iinfo(np.int64).max, dtype=np.int64)
    for lo in range(0, n_docs, doc_block):
        docs = np.ascontiguousarray(xb[lo : lo + doc_block], dtype=np.float32)
        release_mapped_pages(xb)  # a memory-mapped corpus: only this block is held, never the whole file
        for start in range(0, len(xq), block):
            scores = xq[start : start + block] @ docs.T  # (block, doc_block)
            if own_all is not None:
                own = own_all[start : start + block] - lo
                hit = (own >= 0) & (own < len(docs))
                scores[np.flatnonzero(hit), own[hit]] = -np.inf
            take = min(k, scores.shape[1])
            part = np.argpartition(-scores, take - 1, axis=1)[:, :take] if take < scores.shape[1] else \
                np.broadcast_to(np.arange(scores.shape[1]), scores.shape).copy()
            cand_s = np.concatenate([best_s[start : start + block], np.take_along_axis(scores, part, axis=1)], axis=1)
            cand_i = np.concatenate([best_i[start : start + block], part + lo], axis=1)
            # Best first, equal scores by ascending row: the same order whatever blocks the corpus came in.
            order = np.lexsort((cand_i, -cand_s), axis=1)[:, :k]
            best_s[start : start + block] = np.take_along_axis(cand_s, order, axis=1)
            best_i[start : start + block] = np.take_along_axis(cand_i, order, axis=1)
    return best_i
