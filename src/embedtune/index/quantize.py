"""Quantised indexes stacked on (compressed) embeddings: int8 and binary, with optional rescoring.

FAISS-contrib style: numpy in, ``(D, I)`` out, ``D`` higher-is-better, ties by ascending row.

* ``sq8``: FAISS ``IndexScalarQuantizer`` ``QT_8bit`` (one byte per dimension, per-dimension
  min/max ranges calibrated on the corpus); the query stays float32 and is scored against the
  decoded codes (asymmetric).
* ``int8``: sentence-transformers ``quantize_embeddings(precision="int8")`` with ranges
  calibrated on the corpus; queries and documents are both int8 and scored by their integer
  dot product (symmetric).
* ``binary``: one sign bit per dimension (``x > 0``), FAISS ``IndexBinaryFlat`` Hamming search;
  ``D = -hamming``. Optionally the top ``candidates`` (100) are rescored, either against the
  float32 documents (``rescore="float"``, which must then be kept, e.g. memory-mapped on disk)
  or asymmetrically as float query · ±1 bits (``rescore="asym"``, nothing more to keep).
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import numpy as np

from embedtune.evaluate.search import as_rows, break_ties, exact_search, rescore

logger = logging.getLogger(__name__)

__all__ = [
    "sq8_index",
    "sq8_ranges",
    "sq8_search",
    "int8_quantize",
    "int8_ranges",
    "int8_search",
    "binary_codes",
    "binary_index",
    "hamming_search",
    "binary_search",
    "bytes_per_vector",
]

Rescore = Literal["float", "asym"]


def bytes_per_vector(kind: str, d: int) -> int:
    """Index bytes per vector: float32 ``4d``, int8/sq8 ``d``, binary ``ceil(d / 8)``."""
    if kind in ("flat", "float32"):
        return 4 * d
    if kind in ("sq8", "int8"):
        return d
    if kind == "binary":
        return (d + 7) // 8
    raise ValueError(f"unknown kind {kind!r}; valid: flat, sq8, int8, binary.")


# -- int8: FAISS SQ8 (asymmetric) ------------------------------------------------------------
def sq8_ranges(blocks) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension ``(vmin, vmax)`` over an iterable of ``(start, block)`` (one streaming pass)."""
    vmin = vmax = None
    for _, block in blocks:
        if len(block) == 0:
            continue
        lo, hi = block.min(axis=0), block.max(axis=0)
        vmin = lo if vmin is None else np.minimum(vmin, lo)
        vmax = hi if vmax is None else np.maximum(vmax, hi)
    if vmin is None:
        raise ValueError("sq8: no vectors to calibrate on.")
    return vmin.astype(np.float32), vmax.astype(np.float32)


def sq8_index(d: int, ranges: tuple[np.ndarray, np.ndarray] | None = None, xb: np.ndarray | None = None):
    """An empty, trained ``IndexScalarQuantizer(d, QT_8bit, METRIC_INNER_PRODUCT)``.

    Trained by FAISS on ``xb`` (its default min/max range statistic), or from precomputed
    per-dimension ``ranges`` (e.g. :func:`sq8_ranges` over a file too large to load): the
    same ``[vmin, vmax - vmin]`` table FAISS would learn from all of the data.
    """
    import faiss

    index = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    if ranges is not None:
        vmin, vmax = (np.asarray(r, dtype=np.float32) for r in ranges)
        assert vmin.shape == (d,) and vmax.shape == (d,)
        faiss.copy_array_to_vector(np.concatenate([vmin, vmax - vmin]).astype(np.float32), index.sq.trained)
        index.is_trained = True
    elif xb is not None:
        index.train(as_rows(xb, "xb"))
    else:
        raise ValueError("sq8_index needs ranges or xb to train on.")
    return index


def sq8_search(index, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Search a (SQ8 or any FAISS float) index, with ties by ascending row."""
    xq = as_rows(xq, "xq")
    k = min(k, index.ntotal)
    D, I = index.search(xq, k)
    return break_ties(D, I)


# -- int8: sentence-transformers (symmetric) -------------------------------------------------
def int8_ranges(xb: np.ndarray) -> np.ndarray:
    """``(2, d)`` per-dimension min/max, the calibration sentence-transformers uses."""
    xb = as_rows(xb, "xb")
    return np.stack([xb.min(axis=0), xb.max(axis=0)]).astype(np.float32)


def int8_quantize(x: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """sentence-transformers ``quantize_embeddings(x, "int8", ranges=ranges)``: ``(n, d)`` int8."""
    from sentence_transformers.util.quantization import quantize_embeddings

    return quantize_embeddings(as_rows(x, "x"), precision="int8", ranges=ranges)


def int8_search(codes_q: np.ndarray, codes_b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` by the integer dot product of int8 codes (exact in float32 for d <= 1024)."""
    assert codes_q.dtype == np.int8 and codes_b.dtype == np.int8, (codes_q.dtype, codes_b.dtype)
    if codes_q.shape[1] > 1024:
        raise ValueError("int8_search: d > 1024 could round the integer dot products in float32.")
    # |sum| <= 128 * 128 * 1024 = 2^24: every partial sum is an exactly representable float32.
    return exact_search(codes_q.astype(np.float32), codes_b.astype(np.float32), k)


# -- binary ----------------------------------------------------------------------------------
def binary_codes(x: np.ndarray) -> np.ndarray:
    """Sign bits ``x > 0`` packed 8 per byte: ``(n, ceil(d / 8))`` uint8 (trailing bits zero)."""
    x = np.asarray(x)
    assert x.ndim == 2, x.shape
    return np.packbits(x > 0, axis=1)


def binary_index(codes: np.ndarray):
    """``IndexBinaryFlat`` over packed codes (``d`` = 8 bits per byte)."""
    import faiss

    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    index = faiss.IndexBinaryFlat(codes.shape[1] * 8)
    index.add(codes)
    return index


def hamming_search(index, codes_q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Hamming top-``k`` with ``D = -distance`` (higher is better), ties by ascending row.

    FAISS keeps the first rows it meets among equal distances at the cut and scans rows in
    order, so the kept set is the lowest rows; the sort below fixes the order within it.
    """
    codes_q = np.ascontiguousarray(codes_q, dtype=np.uint8)
    k = min(k, index.ntotal)
    distances, I = index.search(codes_q, k)
    return break_ties(-distances.astype(np.float32), I)


def binary_search(
    index,
    xq: np.ndarray,
    k: int,
    rescore_with: Rescore | None = None,
    xb: np.ndarray | None = None,
    candidates: int = 100,
) -> tuple[np.ndarray, np.ndarray]:
    """Binary (sign-bit) search of float queries ``xq``, optionally rescoring the top ``candidates``.

    ``rescore_with="float"`` needs ``xb``, the float32 corpus (may be a memory map);
    ``"asym"`` scores the float query against the ±1 sign vectors of the candidates.
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
        import faiss

        codes = faiss.vector_to_array(index.xb).reshape(index.ntotal, index.code_size)
        d = xq.shape[1]
        signs = np.unpackbits(codes[I.ravel()], axis=1)[:, :d].astype(np.float32) * 2 - 1  # (nq * fetch, d)
        D = np.einsum("qd,qmd->qm", xq.astype(np.float64), signs.reshape(len(xq), -1, d).astype(np.float64)).astype(np.float32)
    else:
        raise ValueError(f"rescore_with must be None, 'float' or 'asym'; got {rescore_with!r}.")
    D, I = break_ties(D, I)
    logger.debug("binary_search: %d queries, %d candidates rescored (%s) in %.3fs", len(xq), fetch, rescore_with, time.perf_counter() - start)
    return D[:, :k], I[:, :k]
