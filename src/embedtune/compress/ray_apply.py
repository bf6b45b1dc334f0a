"""Scale-out apply with Ray Data: a ``map_batches``-ready compressor callable.

One machine holds about a billion 128-d float32 vectors in RAM; past that, or to encode and
compress in one pass, spread the apply over a Ray cluster. Install the extra
(``pip install "embedtune[ray]"``), then:

Recipe::

    import ray
    from embedtune.compress.ray_apply import CompressorBatchFn, compress_dataset

    ray.init()                                   # or ray.init(address="auto") on a cluster
    ds = ray.data.read_parquet("s3://bucket/embeddings/")     # columns: id, embedding
    out = compress_dataset(ds, "adapters/dive-128", batch_size=4096, concurrency=8)
    out.write_parquet("s3://bucket/embeddings-dive128/")

    # or, by hand: the class is loaded once per actor, not once per batch
    out = ds.map_batches(
        CompressorBatchFn,
        fn_constructor_kwargs={"adapter": "adapters/dive-128"},
        batch_size=4096,
        batch_format="numpy",
        concurrency=8,
    )

The adapter folder must be readable from every worker (shared storage, or copy it there).
Use a ``batch_size`` that is a multiple of 4096: every batch is transformed in 4096-row tiles,
and a shorter last tile is padded. Each actor reserves ``num_cpus`` (default 1) for its lifetime: on a small cluster leave CPUs
for the read tasks (e.g. ``concurrency=2, num_cpus=0.5`` on 2 CPUs), or the pipeline waits
forever for a CPU to read with.
Each row's output equals what :func:`embedtune.compress.streaming.apply_compressor_streaming`
writes for it to float32 rounding: both transform in fixed 4096-row tiles (see
:func:`embedtune.compress.streaming.transform_rows`), but Ray cuts batches inside its own blocks,
and some BLAS kernels round a row by its position in the tile. Where a row's tile position is the
same in both (batches aligned to multiples of 4096 from the file's start), the bits are equal.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress.base import Compressor
from embedtune.compress.registry import load_compressor
from embedtune.compress.streaming import transform_rows

logger = logging.getLogger(__name__)

__all__ = ["CompressorBatchFn", "compress_dataset"]


def _stack_vectors(column: Any, name: str) -> np.ndarray:
    """A numpy batch column of vectors as an ``(n, d)`` float32 matrix.

    Ray gives a 2-D array for tensor columns and a 1-D object array of 1-D arrays for parquet
    list columns.
    """
    array = np.asarray(column)
    if array.dtype == object:
        if len(array) == 0:
            return np.zeros((0, 0), np.float32)
        try:
            array = np.stack([np.asarray(row, dtype=np.float32) for row in array])
        except ValueError as error:
            raise ValueError(f"column {name!r}: vectors have different lengths ({error}).") from error
    if array.ndim != 2:
        raise ValueError(f"column {name!r} must hold (n, d) vectors; got shape {array.shape}.")
    return np.ascontiguousarray(array, dtype=np.float32)


class CompressorBatchFn:
    """Callable class for ``Dataset.map_batches(..., batch_format="numpy")``.

    Args:
        adapter: a fitted :class:`Compressor`, or the folder it was saved to (loaded once per
            Ray actor).
        vector_column: the input column of ``(d,)`` vectors.
        output_column: where the ``(k,)`` vectors go; default replaces ``vector_column``.
    """

    def __init__(self, adapter: str | Path | Compressor, vector_column: str = "embedding", output_column: str | None = None) -> None:
        if isinstance(adapter, Compressor):
            self.compressor = adapter
        else:
            self.compressor = load_compressor(adapter)
        self.compressor._check_fitted()
        self.vector_column = vector_column
        self.output_column = output_column or vector_column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.vector_column not in batch:
            raise ValueError(f"batch has no column {self.vector_column!r} (columns: {sorted(batch)}).")
        vectors = _stack_vectors(batch[self.vector_column], self.vector_column)
        out = dict(batch)
        out[self.output_column] = transform_rows(self.compressor, vectors)  # (n, k) float32
        return out


def compress_dataset(
    ds: Any,
    adapter: str | Path | Compressor,
    vector_column: str = "embedding",
    output_column: str | None = None,
    batch_size: int = 4096,
    concurrency: int | tuple[int, int] | None = None,
    **map_batches_kwargs: Any,
) -> Any:
    """``ds.map_batches`` with :class:`CompressorBatchFn`, one compressor per actor.

    ``ds`` is a ``ray.data.Dataset``; returns the lazily compressed dataset. Extra keyword
    arguments go to ``map_batches`` (e.g. ``num_cpus=1``).
    """
    kwargs: dict[str, Any] = {
        "fn_constructor_kwargs": {"adapter": adapter if isinstance(adapter, Compressor) else str(adapter), "vector_column": vector_column, "output_column": output_column},
        "batch_size": batch_size,
        "batch_format": "numpy",
        "concurrency": concurrency if concurrency is not None else 1,
    }
    kwargs.update(map_batches_kwargs)
    return ds.map_batches(CompressorBatchFn, **kwargs)
