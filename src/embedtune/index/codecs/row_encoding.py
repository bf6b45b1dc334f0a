"""Encoding a corpus so that each row's code depends on that row alone, not on the rows encoded with it.

A KLT codec is a FAISS ``IndexPreTransform``: a linear map onto the principal axes, then a quantiser. FAISS applies the
map with its BLAS's ``sgemm``, whose last bits for a row depend on where the row sits in the call. Shifting a block of
512 SciFact MiniLM rows by one row changed the mapped bits of 84 of them. A near tie between two codewords then gives
another code. ``klt-pq:16`` encoded 103,660 rows in blocks of 1,000 gave 1 row another code than one call did, and
``klt-apq:32``, whose anisotropic search sweeps over near ties, 2 of 41,000 in blocks of 16,384. So the index that
``index build --plan`` writes, block by block, could differ from the one the plan scored.

Here the map is a float64 product in numpy (:func:`row_product`), on a number of rows that is a multiple of
:data:`ROW_TILE` (zero rows pad the last few). OpenBLAS's ``dgemm`` gives a row the same bits in any full tile of rows;
a short last tile, or a lone row (``gemv``), gives other bits (measured: blocks of 1, 3, 7 and 333 rows changed 5,000,
1,666, 714 and 16 of 5,000 rows unpadded, none padded; ``sgemm`` changed rows even padded, hence float64). The
quantisers of ``klt-pq``, ``klt-pq4``, ``klt-wpq`` and ``klt-apq`` then encode each row on its own (FAISS's product
quantiser compares sub-spaces of fewer than 16 axes row by row, and ``klt-apq``'s search uses the same padded
products), so a row's code depends on that row alone. ``klt-rq``'s residual encoder searches its beam with FAISS's
``sgemm``, so its codes can still differ at a near tie (none of 41,000 rows did in blocks of 333, 1,000 or 16,384).

The same holds for any FAISS index of that shape, a plan's ``OPQm,PQm`` peer included (its rotation is a
``LinearTransform``). The codes differ from FAISS's own ``sa_encode`` in a row or so per 100,000 (the same near ties,
broken by the more exact map); embedtune encodes every corpus it stores through here, in a plan's sweep, in ``index
build`` and in the full-corpus check, and :class:`~embedtune.index.codecs.DeployedCodec` encodes new rows so, so they
all hold the same codes; the distortion report (MSE, dB to the bound) decodes those codes too.

Encoding a corpus is also where the cores help: :func:`add_encoded` encodes blocks of :data:`ENCODE_BLOCK_ROWS` side by
side, each on one thread, and adds the codes in order, which gives the codes of one call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embedtune.runtime import map_single_threaded, single_threaded, thread_budget

__all__ = ["ENCODE_BLOCK_ROWS", "MAPPED_VALUES", "ROW_TILE", "add_encoded", "encode_rows", "encodes_rows_alone", "map_rows", "row_product",
           "transform_matrix"]

#: Rows per block that :func:`add_encoded` encodes side by side.
ENCODE_BLOCK_ROWS = 16_384
#: A float64 product gives a row the same bits in any whole tile of this many rows (OpenBLAS's kernels take 4 or 8).
ROW_TILE = 16
#: Float64 values a block's mapped copy holds at most (64 MB): wide vectors are mapped in fewer rows at a time
#: (:func:`map_rows`), which changes no code, since each row's depends on that row alone.
MAPPED_VALUES = 1 << 23


def map_rows(d: int) -> int:
    """Rows of ``d``-dim vectors mapped to float64 at a time: :data:`ENCODE_BLOCK_ROWS`, fewer for wide vectors."""
    return max(1, min(ENCODE_BLOCK_ROWS, MAPPED_VALUES // max(1, int(d))))


def transform_matrix(index: Any) -> np.ndarray:
    """``(d_out, d_in)`` (float64): the linear map of an ``IndexPreTransform``'s chain (``LinearTransform`` without bias and
    ``RemapDimensionsTransform`` steps), so ``y = matrix · x``."""
    import faiss

    matrix: np.ndarray | None = None
    for i in range(index.chain.size()):
        step = faiss.downcast_VectorTransform(index.chain.at(i))
        if isinstance(step, faiss.RemapDimensionsTransform):
            slots = faiss.vector_to_array(step.map)
            part = np.zeros((step.d_out, step.d_in))
            rows = np.flatnonzero(slots >= 0)
            part[rows, slots[rows]] = 1.0
        elif isinstance(step, faiss.LinearTransform) and not step.have_bias:
            part = faiss.vector_to_array(step.A).reshape(step.d_out, step.d_in).astype(np.float64)
        else:
            raise ValueError(f"a KLT codec's transform is linear with no bias; step {i} is {type(step).__name__}.")
        matrix = part if matrix is None else part @ matrix
    if matrix is None:
        raise ValueError("the index has no transform.")
    return matrix


def _klt_parts(index: Any) -> tuple[np.ndarray, Any] | None:
    """``(map, inner quantiser)`` of a KLT codec's FAISS index whose quantiser codes each row on its own, else None."""
    import faiss

    if not isinstance(index, faiss.IndexPreTransform) or index.chain.size() == 0:
        return None
    inner = faiss.downcast_index(index.index)
    if type(inner) not in (faiss.IndexPQ, faiss.IndexResidualQuantizer, faiss.IndexPQFastScan):
        return None
    try:
        return transform_matrix(index), inner
    except ValueError:  # a transform with a bias, or another kind of step: not a KLT codec's
        return None


def encodes_rows_alone(index: Any) -> bool:
    """Whether ``index``'s codes of a row depend on that row alone through :func:`encode_rows` (a KLT codec's FAISS index,
    or an embedtune index that says so with ``encodes_rows_alone = True``), so that blocks may be encoded apart."""
    return bool(getattr(index, "encodes_rows_alone", False)) or _klt_parts(index) is not None


def encode_rows(index: Any, x: np.ndarray) -> np.ndarray:
    """``index.sa_encode(x)``; for a KLT codec's FAISS index, with its map applied in float64 (see the module docstring),
    :func:`map_rows` rows at a time."""
    parts = _klt_parts(index)
    if parts is None:
        return index.sa_encode(np.ascontiguousarray(x, dtype=np.float32))
    matrix, inner = parts
    codes = np.empty((len(x), inner.sa_code_size()), dtype=np.uint8)
    step = map_rows(matrix.shape[1])
    for lo in range(0, len(x), step):
        mapped = _mapped(matrix, x[lo : lo + step])
        codes[lo : lo + len(mapped)] = inner.sa_encode(mapped)
    return codes


def row_product(x: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``x @ right`` in float64, each row's bits depending on that row alone: the rows are multiplied in whole tiles of
    :data:`ROW_TILE` (zero rows pad the last one), never alone or in a short tile."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    short = -n % ROW_TILE
    if short:
        x = np.concatenate([x, np.zeros((short, *x.shape[1:]), dtype=np.float64)])
    return (x @ np.asarray(right, dtype=np.float64))[:n]


def _mapped(matrix: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x``'s rows through ``matrix`` (float64, :func:`row_product`), as float32 rows."""
    return np.ascontiguousarray(row_product(x, matrix.T), dtype=np.float32)


def add_encoded(index: Any, xb: np.ndarray) -> None:
    """``index.add(xb)``, with codes that depend on each row alone, encoded in blocks side by side.

    An index whose codes depend on each row alone (:func:`encodes_rows_alone`) gets its rows encoded
    :data:`ENCODE_BLOCK_ROWS` at a time on the thread budget (:func:`~embedtune.runtime.map_single_threaded`, each block
    as on one thread), and the codes added in order: the codes of one call. Every other index is added to as it is, on
    one thread, so that its codes do not depend on the thread count.
    """
    import faiss

    if not encodes_rows_alone(index):
        with single_threaded():
            index.add(xb)
        return
    starts = range(0, len(xb), ENCODE_BLOCK_ROWS)
    parts = _klt_parts(index)
    if parts is not None and isinstance(parts[1], faiss.IndexPQFastScan):
        # A fast-scan index packs its codes in blocks of 32 rows and takes no codes from outside: it encodes the mapped
        # rows itself, each on its own, block after block. The maps (most of the time) run side by side, as many blocks
        # at a time as threads are held, so at most that many mapped blocks are in memory at once.
        matrix, inner = parts
        step = map_rows(matrix.shape[1])
        mapped_starts = list(range(0, len(xb), step))
        wave = max(1, thread_budget())
        for first in range(0, len(mapped_starts), wave):
            mapped = map_single_threaded(lambda lo: _mapped(matrix, xb[lo : lo + step]), mapped_starts[first : first + wave])
            with single_threaded():
                for block in mapped:
                    inner.add(block)
        index.ntotal = inner.ntotal
        return

    def encode(lo: int) -> np.ndarray:
        return encode_rows(index, xb[lo : lo + ENCODE_BLOCK_ROWS])

    if len(starts) > 1 and thread_budget() >= 2:
        blocks = map_single_threaded(encode, starts)
    else:
        with single_threaded():
            blocks = [encode(lo) for lo in starts]
    codes = np.concatenate(blocks) if blocks else np.zeros((0, index.sa_code_size()), dtype=np.uint8)
    with single_threaded():
        if isinstance(index, faiss.IndexPreTransform):
            inner = faiss.downcast_index(index.index)
            inner.add_sa_codes(codes)
            index.ntotal = inner.ntotal
        else:
            index.add_sa_codes(codes)
