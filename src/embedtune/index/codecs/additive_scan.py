"""Search an additive quantiser's codes with the product quantiser's scan: same scores, about 3× faster.

An additive quantiser (FAISS ``IndexResidualQuantizer``, ``IndexLocalSearchQuantizer``, ...) with
``M`` codebooks of 256 entries decodes a vector as a sum of one full-dimensional codeword per
codebook, so a query's inner product with it is a sum of ``M`` look-ups in the table
``LUT[j, c] = q · codeword_jc``. A product quantiser's inner-product search computes the same kind
of table and sums the same kind of look-ups, with FAISS's fastest 8-bit scan; FAISS's additive
quantisers scan their codes through a generic bit reader instead (measured about 3× slower at
1M vectors, ``benchmarks/codec_speed.py``).

The two are one computation once the additive codebooks are read as a product quantiser over the
query repeated ``M`` times: sub-space ``j`` of ``[q, q, ..., q]`` (``M · d`` dimensions) is ``q``,
and its 256 centroids are codebook ``j``. With 8-bit codes, the additive quantiser's code bytes are
byte for byte the product quantiser's, so :func:`additive_search` runs
``ProductQuantizer.search_ip`` directly on the additive index's own code array: no copy of the
codes, the same bytes in RAM. Queries are repeated in blocks of at most :data:`REPEATED_QUERY_FLOATS`
floats. Anything else (another metric, other code widths, norms stored in the codes) is searched by
the index itself.

A *product* additive quantiser (``PRQ``, ``PLSQ``: the dimensions split into ``s`` parts, each with
its own additive quantiser) keeps its codebooks in their part's ``d / s`` dimensions. Each is placed
in its part of a full-dimensional codeword, zeros elsewhere, so that the same scan reads them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["REPEATED_QUERY_FLOATS", "additive_scanner", "additive_search"]

#: The most floats of repeated queries held at once (64 MB): the query block is sized to it.
REPEATED_QUERY_FLOATS = 16 * 1024 * 1024
_CACHE_ATTRIBUTE = "_embedtune_product_scan"


def _additive_parts(index: Any) -> tuple[list[Any], Any, Any] | None:
    """``(pre-transforms, additive index, its quantiser)`` when ``index`` is an 8-bit, inner-product additive quantiser
    (possibly behind an ``IndexPreTransform``) whose codes are exactly one byte per codebook; else ``None``."""
    import faiss

    chain: list[Any] = []
    inner = index
    if isinstance(index, faiss.IndexPreTransform):
        chain = [index.chain.at(i) for i in range(index.chain.size())]
        inner = faiss.downcast_index(index.index)
    if not isinstance(inner, faiss.IndexAdditiveQuantizer) or inner.metric_type != faiss.METRIC_INNER_PRODUCT:
        return None
    quantiser = inner.aq
    nbits = faiss.vector_to_array(quantiser.nbits)
    if len(nbits) != quantiser.M or not np.all(nbits == 8) or inner.code_size != quantiser.M or quantiser.d != inner.d:
        return None
    return chain, inner, quantiser


def full_dimensional_codebooks(inner: Any, quantiser: Any) -> np.ndarray | None:
    """``(M, 256, d)``: every codebook's codewords in the full ``d`` dimensions; a product additive quantiser's codebooks
    (kept in their part's ``d / s`` dimensions, the parts in order) padded with zeros outside their part. None for a
    layout this does not recognise."""
    import faiss

    m, d = int(quantiser.M), int(quantiser.d)
    codebooks = np.asarray(faiss.vector_to_array(quantiser.codebooks), dtype=np.float32)
    if codebooks.size == m * 256 * d:
        return codebooks.reshape(m, 256, d)
    splits = next((int(getattr(inner, name).nsplits) for name in ("prq", "plsq") if hasattr(inner, name)), 0)
    if splits < 1 or m % splits or d % splits or codebooks.size * splits != m * 256 * d:
        return None
    per_split, width = m // splits, d // splits
    full = np.zeros((m, 256, d), dtype=np.float32)
    for j, codebook in enumerate(codebooks.reshape(m, 256, width)):
        part = j // per_split
        full[j, :, part * width : (part + 1) * width] = codebook
    return full


def additive_scanner(index: Any) -> tuple[list[Any], Any, Any] | None:
    """The product-quantiser view of ``index``'s codebooks (built once, kept on the index object), or ``None`` if
    ``index`` is not an additive quantiser this scan reproduces exactly."""
    import faiss

    cached = getattr(index, _CACHE_ATTRIBUTE, None)
    if cached is not None:
        return cached
    parts = _additive_parts(index)
    if parts is None:
        return None
    chain, inner, quantiser = parts
    m, d = int(quantiser.M), int(quantiser.d)
    codebooks = full_dimensional_codebooks(inner, quantiser)
    if codebooks is None:
        return None
    product = faiss.ProductQuantizer(m * d, m, 8)
    faiss.copy_array_to_vector(np.ascontiguousarray(codebooks, dtype=np.float32).ravel(), product.centroids)
    scanner = (chain, inner, product)
    try:
        setattr(index, _CACHE_ATTRIBUTE, scanner)
    except AttributeError:  # an object that takes no attributes: build the view again next time
        pass
    return scanner


def additive_search(index: Any, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``index.search(xq, k)`` for any FAISS index; an 8-bit inner-product additive quantiser is scanned as a product
    quantiser (equal scores up to float rounding, FAISS's fast 8-bit scan)."""
    import faiss

    xq = np.ascontiguousarray(xq, dtype=np.float32)
    scanner = additive_scanner(index)
    k = int(min(k, index.ntotal))
    if scanner is None or k < 1 or len(xq) == 0:
        return index.search(xq, k)
    chain, inner, product = scanner
    for transform in chain:
        xq = np.ascontiguousarray(transform.apply(xq), dtype=np.float32)
    m = int(product.M)
    D = np.empty((len(xq), k), dtype=np.float32)
    I = np.empty((len(xq), k), dtype=np.int64)
    block = max(1, REPEATED_QUERY_FLOATS // (m * xq.shape[1]))
    for start in range(0, len(xq), block):
        part = np.ascontiguousarray(np.tile(xq[start : start + block], (1, m)))
        n = len(part)
        heap = faiss.float_minheap_array_t()
        heap.nh, heap.k = n, k
        heap.val = faiss.swig_ptr(D[start : start + n])
        heap.ids = faiss.swig_ptr(I[start : start + n])
        product.search_ip(faiss.swig_ptr(part), n, inner.codes.data(), inner.ntotal, heap, True)
    return D, I
