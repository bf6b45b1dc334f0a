"""Binary codes: one sign bit per dimension (``x > 0``), searched by Hamming distance, optionally rescored.

``D = -hamming`` (higher is better), ties by ascending row. The top ``candidates`` can be rescored
against the float32 documents (``rescore_with="float"``, which must then be kept, e.g.
memory-mapped on disk) or asymmetrically as float query · ±1 bits (``"asym"``, nothing more to keep).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import numpy as np

from embedtune.evaluate.search import as_rows, break_ties, rescore

logger = logging.getLogger(__name__)

__all__ = ["Rescore", "binary_codes", "sign_vectors", "binary_index", "hamming_search", "binary_search"]

Rescore = Literal["float", "asym"]


def binary_codes(x: np.ndarray) -> np.ndarray:
    """Sign bits ``x > 0`` packed 8 per byte: ``(n, ceil(d / 8))`` uint8 (trailing bits zero)."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"binary_codes: expected (n, d) vectors; got shape {x.shape}.")
    return np.packbits(x > 0, axis=1)


def sign_vectors(codes: np.ndarray, dim: int) -> np.ndarray:
    """Unpack ``(n, ceil(d/8))`` sign bits into ``(n, d)`` float32 ±1 vectors."""
    return np.unpackbits(codes, axis=1)[:, :dim].astype(np.float32) * 2 - 1


def binary_index(codes: np.ndarray) -> Any:
    """``IndexBinaryFlat`` over packed codes (``d`` = 8 bits per byte)."""
    import faiss

    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    index = faiss.IndexBinaryFlat(codes.shape[1] * 8)
    index.add(codes)
    return index


def hamming_search(index: Any, codes_q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Hamming top-``k`` with ``D = -distance`` (higher is better), ties by ascending row.

    FAISS keeps the first rows it meets among equal distances at the cut and scans rows in
    order, so the kept set is the lowest rows; the sort below fixes the order within it.
    """
    codes_q = np.ascontiguousarray(codes_q, dtype=np.uint8)
    k = min(k, index.ntotal)
    distances, I = index.search(codes_q, k)
    return break_ties(-distances.astype(np.float32), I.astype(np.int64))


def binary_search(
    index: Any,
    xq: np.ndarray,
    k: int,
    rescore_with: Rescore | None = None,
    xb: np.ndarray | None = None,
    candidates: int = 100,
    codes: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Binary (sign-bit) search of float queries ``xq``, optionally rescoring the top ``candidates``.

    ``rescore_with="float"`` needs ``xb``, the float32 corpus (may be a memory map);
    ``"asym"`` scores the float query against the ±1 sign vectors of the candidates, unpacked from
    ``codes`` (the index's packed codes; default: read back from the index).
    """
    xq = as_rows(xq, "xq")
    start = time.perf_counter()
    if rescore_with is None:
        return hamming_search(index, binary_codes(xq), k)
    fetch = max(k, candidates)
    _, I = hamming_search(index, binary_codes(xq), fetch)
    if rescore_with == "float":
        if xb is None:
            raise ValueError('binary_search(rescore_with="float") needs xb, the float32 corpus.')
        D = rescore(xq, xb, I)
    elif rescore_with == "asym":
        if codes is None:
            import faiss

            codes = faiss.vector_to_array(index.xb).reshape(index.ntotal, index.code_size)
        d = xq.shape[1]
        signs = sign_vectors(codes[I.ravel()], d).reshape(len(xq), -1, d)  # (nq, fetch, d)
        D = np.einsum("qd,qmd->qm", xq.astype(np.float64), signs.astype(np.float64)).astype(np.float32)
    else:
        raise ValueError(f"rescore_with must be None, 'float' or 'asym'; got {rescore_with!r}.")
    D, I = break_ties(D, I)
    logger.debug("binary_search: %d queries, %d candidates rescored (%s) in %.3fs", len(xq), fetch, rescore_with, time.perf_counter() - start)
    return D[:, :k], I[:, :k]
