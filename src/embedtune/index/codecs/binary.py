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
from embedtune.index.codecs.precision_registry import Encoded, PrecisionCodec, StoredIndex, register_precision

logger = logging.getLogger(__name__)

__all__ = ["Rescore", "binary_codes", "sign_vectors", "binary_index", "hamming_search", "binary_search",
           "Binary", "BinaryAsym", "BinaryRescore"]

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


@register_precision
class Binary(PrecisionCodec):
    """``binary``: sign bits searched by Hamming distance; ``binary-asym`` and ``binary-rescore`` rescore its candidates."""

    precision_name = "binary"
    summary = "sign bits, Hamming distance"
    sign_bits = True
    scores_are_inner_products = False  # negative Hamming distances
    predates_digests = True
    factory = "BFlat"
    index_kind = "binary"
    store_kind = "binary"

    def ram_bytes(self, dim: int) -> int:
        return (dim + 7) // 8

    def build(self, xb: np.ndarray, precision: Any, calibration: Any = None, float_vectors: np.ndarray | None = None,
              train: np.ndarray | None = None, trained_index: Any = None) -> Encoded:
        codes = np.ascontiguousarray(binary_codes(xb))
        return Encoded(binary_index(codes), float_vectors=self.float_vectors_for(xb, float_vectors), codes=codes)

    def encode(self, x: np.ndarray, calibration: Any = None, trained_index: Any = None) -> np.ndarray:
        return binary_codes(x)

    def search(self, index: StoredIndex, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return binary_search(index.backend, xq, k, self.rescore, index.float_vectors, index.precision.candidates, codes=index.codes)

    def reconstruct(self, index: StoredIndex, x: np.ndarray) -> np.ndarray | None:
        return None  # Hamming codes: no decoded vector the search scores against

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        return {"vector_type": f"uint8 x {(dim + 7) // 8}", "distance": "hamming", "exact": True,
                "note": "packed sign bits x > 0, as embedtune.index.codecs.binary_codes; exact Hamming scan"}


@register_precision
class BinaryAsym(Binary):
    precision_name = "binary-asym"
    summary = "Hamming top candidates, rescored as float query · ±1 sign vector"
    rescore = "asym"
    scores_are_inner_products = True
    store_kind = "binary-asym"

    def reconstruct(self, index: StoredIndex, x: np.ndarray) -> np.ndarray | None:
        """The ``±1`` signs scaled to the rows' mean absolute value (the least-squares scale of a sign code)."""
        return sign_vectors(binary_codes(x), index.dim) * np.abs(x).mean(axis=1, keepdims=True)

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        settings = super().lancedb_settings(dim, candidates, top_k)
        return {**settings, "rescore": self.rescore, "candidates": candidates,
                "note": settings["note"] + "; LanceDB cannot rescore across columns, so the top candidates are rescored by the "
                                           "client (embedtune.index.lancedb_store.search_lancedb)"}


@register_precision
class BinaryRescore(BinaryAsym):
    precision_name = "binary-rescore"
    summary = "Hamming top candidates, rescored against the float32 vectors memory-mapped from disk"
    rescore = "float"
    store_kind = "binary-rescore"

    def reconstruct(self, index: StoredIndex, x: np.ndarray) -> np.ndarray | None:
        return None

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        return {**super().lancedb_settings(dim, candidates, top_k), "float_column": "vector_float"}
