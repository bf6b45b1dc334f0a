"""Sums of table look-ups over windows of packed bit streams, compiled: the trellis code's lone-query scan.

A lone query scores each trellis code as a sum over runs of axes of one table look-up each, the table
indexed by a window of the code's bit stream (see :class:`~embedtune.index.codecs.trellis.TrellisTransformIndex`).
In numpy that sum is several passes over an ``(n, runs)`` index array per block; compiled, it is one
pass, and the codes are walked a block at a time, run by run, so that one run's table (``2^13`` floats
at a 10-bit register) stays in cache for every code of the block instead of all the runs' tables
competing for it. On this module's reference machine (one core of a 2-core AMD EPYC VM, 1M codes of
32 B, 60 runs) that is about 0.06 s a query against 0.16 s for the numpy passes.

The kernel is compiled by numba on first use in a process (well under a second) and not cached on
disk, so that nothing is written outside a job's output. numba is imported only then.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from embedtune.runtime import thread_budget

__all__ = ["BLOCK_ROWS", "window_sums"]

#: Codes summed run by run together: their bytes (``rows × code bytes``) and sums stay in cache while one run's table
#: is read for all of them. Measured fastest from 16,384 up; larger blocks change nothing.
BLOCK_ROWS = 16_384


@lru_cache(maxsize=2)
def _kernel(columns: int) -> Callable[..., None]:
    """The compiled sum for tables of ``columns`` columns (a constant, so that the loop over them is unrolled)."""
    try:
        from numba import njit
    except ImportError as error:  # a dependency; only a broken install lacks it
        raise ImportError("the trellis code's lone-query scan is compiled by numba, which is not installed: "
                          "pip install 'numba>=0.60' (a dependency of embedtune).") from error

    @njit(nogil=True, boundscheck=False, cache=False, inline="always")
    def add(table: Any, index: Any, out: Any, row: int) -> None:
        for c in range(columns):
            out[row, c] += table[index, c]

    @njit(nogil=True, boundscheck=False, cache=False)
    def kernel(codes: Any, word: Any, shift: Any, mask: Any, offset: Any, tables: Any, out: Any, block: int) -> None:
        n = codes.shape[0]
        for lo in range(0, n, block):
            hi = min(lo + block, n)
            out[lo:hi] = 0.0
            for j in range(word.shape[0]):
                w = word[j]
                sh = np.uint32(shift[j])
                m = np.uint32(mask[j])
                table = tables[offset[j] : offset[j] + mask[j] + 1]
                # The window ends in byte `w` of the code; where the one or two bytes before it lie before the stream,
                # the register reads zeros. One loop per case keeps the branch out of the loop over codes.
                if w >= 2:
                    for row in range(lo, hi):
                        value = (np.uint32(codes[row, w - 2]) << np.uint32(16)) | (np.uint32(codes[row, w - 1]) << np.uint32(8)) \
                            | np.uint32(codes[row, w])
                        add(table, (value >> sh) & m, out, row)
                elif w == 1:
                    for row in range(lo, hi):
                        value = (np.uint32(codes[row, 0]) << np.uint32(8)) | np.uint32(codes[row, 1])
                        add(table, (value >> sh) & m, out, row)
                else:
                    for row in range(lo, hi):
                        add(table, (np.uint32(codes[row, 0]) >> sh) & m, out, row)

    return kernel


def window_sums(codes: np.ndarray, last_byte: np.ndarray, shift: np.ndarray, mask: np.ndarray, offset: np.ndarray,
                tables: np.ndarray, block: int = BLOCK_ROWS, threads: int | None = None) -> np.ndarray:
    """``out[i, c] = Σ_j tables[offset[j] + window_j(codes[i]), c]``: one table look-up per window, summed in window order.

    Args:
        codes: ``(n, size)`` uint8 packed codes.
        last_byte: ``(windows,)`` the code byte each window ends in, or -1 for a window that ends before the stream (it
            reads 0).
        shift, mask: ``(windows,)`` the window is ``(bytes last_byte − 2 .. last_byte as one big-endian 24-bit word) >>
            shift & mask``; bytes before the code read as zeros.
        offset: ``(windows,)`` where each window's table starts in ``tables``.
        tables: ``(entries, columns)`` float32, every window's table one after the other; columns are summed side by side
            (one look-up serves all of a row's columns).
        block: codes summed run by run together (:data:`BLOCK_ROWS`).
        threads: the codes split into this many contiguous parts summed at once (default
            :func:`~embedtune.runtime.thread_budget`); the sums do not depend on it.

    Returns:
        ``(n, columns)`` float32.
    """
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    tables = np.ascontiguousarray(tables, dtype=np.float32)
    if tables.ndim != 2:
        raise ValueError(f"window_sums: tables must be (entries, columns); got shape {tables.shape}.")
    last_byte = np.asarray(last_byte, dtype=np.int64)
    # A window ending before the stream reads zero: byte 0 shifted out entirely by a mask of 0.
    reads_nothing = last_byte < 0
    word = np.where(reads_nothing, 0, last_byte).astype(np.int64)
    mask = np.where(reads_nothing, 0, np.asarray(mask, dtype=np.int64)).astype(np.int64)
    shift = np.where(reads_nothing, 0, np.asarray(shift, dtype=np.int64)).astype(np.int64)
    offset = np.asarray(offset, dtype=np.int64)
    if len(codes) and len(word) and (word.max() >= codes.shape[1] or (offset + mask).max() >= len(tables)):
        raise ValueError("window_sums: a window reads past the code or its table past the tables; the windows do not "
                         f"describe codes of {codes.shape[1]} bytes and {len(tables)} table entries.")
    out = np.empty((len(codes), tables.shape[1]), dtype=np.float32)
    kernel = _kernel(int(tables.shape[1]))
    # A thread gets at least a few blocks: below that, starting threads costs more than it saves (20,000 codes: 5 ms on one).
    workers = min(thread_budget() if threads is None else int(threads), -(-len(codes) // (4 * int(block))))
    if workers > 1:  # the kernel releases the GIL: each thread sums its own rows into its own part of `out`
        bounds = np.linspace(0, len(codes), workers + 1).astype(np.int64)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda part: kernel(codes[bounds[part] : bounds[part + 1]], word, shift, mask, offset, tables,
                                              out[bounds[part] : bounds[part + 1]], int(block)), range(workers)))
    else:
        kernel(codes, word, shift, mask, offset, tables, out, int(block))
    return out
