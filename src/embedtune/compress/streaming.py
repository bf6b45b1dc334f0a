"""Compress an embedding matrix larger than memory, block by block.

FAISS-contrib style: the input is memory-mapped and read in row blocks, each block goes through
``compressor.transform``, and the result is written into a memory-mapped ``.npy`` that is
renamed over the target only when complete. Peak memory is about one block in and one out.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from embedtune.compress.base import Compressor
from embedtune.io import atomic_write

logger = logging.getLogger(__name__)

__all__ = ["apply_compressor_streaming", "iter_row_blocks"]

_INPUT_DTYPES = (np.float32, np.float16)


def iter_row_blocks(xb: np.ndarray, chunk_size: int):
    """Yield ``(start, block)`` with float32 C-contiguous blocks of at most ``chunk_size`` rows."""
    for start in range(0, len(xb), chunk_size):
        yield start, np.ascontiguousarray(xb[start : start + chunk_size], dtype=np.float32)


def apply_compressor_streaming(compressor: Compressor, input_path: str | Path, output_path: str | Path, chunk_size: int = 65536) -> Path:
    """``compressor.transform`` of the ``(n, d)`` float32/float16 ``.npy`` at ``input_path``.

    Writes an ``(n, k)`` float32 ``.npy`` to ``output_path`` atomically and returns its path.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}.")
    input_path = Path(input_path)
    if not input_path.is_file():
        raise FileNotFoundError(f"{input_path}: embeddings file not found.")
    try:
        xb = np.load(input_path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise ValueError(f"{input_path}: not a readable .npy array ({error}).") from error
    if xb.ndim != 2 or xb.dtype not in _INPUT_DTYPES:
        raise ValueError(f"{input_path}: expected a 2-D float32 or float16 array; got shape {xb.shape}, dtype {xb.dtype}.")
    compressor._check_fitted()
    if xb.shape[1] != compressor.input_dim_:
        raise ValueError(f"{input_path} has {xb.shape[1]} columns but the compressor was fitted on {compressor.input_dim_}-d input.")
    n, k = len(xb), compressor.output_dim
    start_time = time.perf_counter()

    def _write(tmp: Path) -> None:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, k))
        try:
            for start, block in iter_row_blocks(xb, chunk_size):
                out[start : start + len(block)] = compressor.transform(block)
            out.flush()
        finally:
            del out  # closes the map before the rename

    output = atomic_write(output_path, _write)
    logger.info("apply_compressor_streaming: %d x %d -> %d-d in %.2fs", n, xb.shape[1], k, time.perf_counter() - start_time)
    return output
