"""Compress an embedding matrix larger than memory, block by block.

FAISS-contrib style: the input is read in row blocks, each block goes through
``compressor.transform``, and the result is written to a temporary file that is renamed over
the target only when complete. Peak memory is about one block in and one block out.

Inputs: an ``(n, d)`` float32/float16 ``.npy``, or a parquet file with an id column and a
list-of-floats vector column. Outputs: ``.npy`` (float32; for parquet input the ids go to
``<stem>.ids.txt`` beside it) or ``.parquet`` (id + vector columns, one row group per block).

A float32 ``.npy`` input is memory-mapped, which reads straight from the page cache with no
copy. Mapped pages count towards the process's resident set as soon as they are touched, so
each block's pages are dropped from it (``madvise(MADV_DONTNEED)``; the page cache keeps them)
once the next block is asked for: a 3 GB input does not end with a 3 GB RSS. float16/float64
inputs are read with ``readinto`` into two alternating buffers, the next block in a thread.
Parquet is read one record batch at a time, so its memory is bounded by the larger of
``chunk_size`` rows and one row group of the input. Tiles of a block are transformed by
several threads (one BLAS thread each), and the output of one block is written in a thread
while the next is transformed.

Every block goes through ``transform`` in tiles of exactly :data:`TILE_ROWS` rows (the last
one padded), see :func:`transform_rows`. 4096 rows is also the fastest tile measured
(PCA 768 -> 128: 238k vectors/s, against 131k for 256-row tiles and 98k for one call on
131k rows, whose temporaries leave the cache). BLAS picks its kernel by matrix shape, and kernels
round differently: a row transformed in a 300-row call and in a 50-row call can differ in
the last bit (measured: OpenBLAS for output dims under 32, and any BLAS under ~19 rows). Even
inside one tile shape, some CPUs round a row differently by its position in the tile (OpenBLAS
Haswell kernels, 384 -> 128: every 192nd row or so). So the file is re-cut into tile-aligned
pieces (:func:`tile_aligned_blocks`) whatever the read chunk size, and chunked, in-memory and
Ray applies (batch sizes that are multiples of the tile) agree exactly.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from pathlib import Path
import collections
import errno
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np

from embedtune.compress.base import Compressor, as_float32_rows
from embedtune.encoders.ray_encode import is_shard_folder, shard_files, shard_folder_shape
from embedtune.errors import NonFiniteError
from embedtune.io import atomic_write

logger = logging.getLogger(__name__)

__all__ = [
    "TILE_ROWS",
    "apply_compressor_streaming",
    "iter_row_blocks",
    "iter_embedding_blocks",
    "embedding_file_shape",
    "transform_rows",
    "default_tile_workers",
    "ids_path_for",
]

# float16 and float64 (e.g. vectors from an API) are cast to float32 block by block, with a note.
_INPUT_DTYPES = (np.float32, np.float16, np.float64)
TILE_ROWS = 4096


def iter_row_blocks(xb: np.ndarray, chunk_size: int):
    """Yield ``(start, block)`` with float32 C-contiguous blocks of at most ``chunk_size`` rows."""
    for start in range(0, len(xb), chunk_size):
        yield start, np.ascontiguousarray(xb[start : start + chunk_size], dtype=np.float32)


def default_tile_workers() -> int:
    """Threads that transform tiles side by side when the caller does not say: the CPU count, at most 4."""
    return max(1, min(os.cpu_count() or 1, 4))


def transform_rows(
    compressor: Compressor,
    X: np.ndarray,
    tile: int = TILE_ROWS,
    *,
    out: np.ndarray | None = None,
    validated: bool = False,
    workers: int = 1,
) -> np.ndarray:
    """``compressor.transform(X)`` computed in tiles of exactly ``tile`` rows (the last padded).

    Each row's output then depends only on the row and its position modulo ``tile``, never on how
    the input was split into tile-aligned blocks: streaming, in-memory and Ray applies, which all
    cut at multiples of ``tile``, give the same bits. Blocks cut elsewhere agree to float32
    rounding (BLAS may handle a tile's last rows with a different kernel).

    ``out``: a C-contiguous float32 ``(len(X), output_dim)`` array to fill (a streaming apply
    reuses one, so no output pages are faulted in per block). ``validated``: ``X`` is already a
    C-contiguous float32 array checked finite, so the tiles skip the input scan. Methods with
    ``non_finite_input_reaches_output`` skip it anyway and read the input only when an output
    row is not finite. ``workers``: threads that transform tiles side by side. Every tile runs on
    one BLAS thread, so the bits do not depend on the thread count either.
    """
    X = np.asarray(X)
    n = len(X)
    if out is None:
        out = np.empty((n, compressor.output_dim), dtype=np.float32)
    elif out.shape != (n, compressor.output_dim) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(n, compressor.output_dim)}; got {out.shape} {out.dtype}.")
    compressor._check_fitted()
    if X.ndim != 2 or (len(X) and X.shape[1] != compressor.input_dim_):
        as_float32_rows(X[:1] if X.ndim == 2 else X, "the input vectors", compressor.input_dim_)  # raises the shape error
    output_shows_input = compressor.non_finite_input_reaches_output

    def transform_tile(rows: np.ndarray, full: bool, start: int) -> None:
        rows = compressor.normalize_input(rows)  # the rows it was fitted and scored on (unit rows for a cosine fit)
        if full:
            compressor.transform_validated(rows, out=out[start : start + tile])
        else:
            out[start:] = compressor.transform_validated(rows)[: n - start]

    def one_tile(start: int) -> None:
        rows = X[start : start + tile]
        full = len(rows) == tile
        if not full:
            rows = np.concatenate([rows, np.repeat(rows[-1:], tile - len(rows), axis=0)])
        try:
            if validated or not output_shows_input:
                rows = rows if validated else as_float32_rows(rows, "the input vectors", compressor.input_dim_)
                transform_tile(rows, full, start)
            else:
                # Only the output is scanned; a non-finite output row is traced back to the input here.
                try:
                    transform_tile(np.ascontiguousarray(rows, dtype=np.float32), full, start)
                except NonFiniteError:
                    as_float32_rows(rows, "the input vectors", compressor.input_dim_)  # raises the input's error if the input is bad
                    raise
        except NonFiniteError as error:
            raise error.shifted(start) from None  # rows of X, not of the tile

    starts = range(0, n, tile)
    from threadpoolctl import threadpool_limits

    # Every tile on one BLAS thread, however many the process has: BLAS sums in another order with more
    # threads, so a tile's bits would follow the thread count (a 2-thread apply differed from a 1-thread
    # one, and from a Ray actor's, in the last bit). A 4096-row product is too small for BLAS's own
    # threads to pay off anyway (measured 2 threads, 768 -> 128: 2.2 s of matmul per 1M rows in tiles
    # against 1.6 s in 65536-row blocks); tiles run in parallel threads instead (BLAS and torch release the GIL).
    with threadpool_limits(limits=1):
        if workers > 1 and len(starts) > 1:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for _ in pool.map(one_tile, starts):  # in order, so the first bad tile is the one reported
                    pass
        else:
            for start in starts:
                one_tile(start)
    return out


def tile_aligned_blocks(
    blocks: Iterator[tuple[int, list[str] | None, np.ndarray]], tile: int = TILE_ROWS
) -> Iterator[tuple[int, list[str] | None, np.ndarray]]:
    """Re-cut ``(start, ids, block)`` pieces so that every piece but the last starts at a multiple of ``tile``.

    A row's bits depend on its position inside a tile (BLAS kernels), so the file is always
    transformed in the same tiles, whatever the read chunk size. Carries at most ``tile - 1`` rows
    (copied, since readers may reuse their buffer) from one piece to the next.
    """
    carry_start, carry_ids, carry = 0, None, None
    for start, ids, block in blocks:
        if carry is not None:
            block = np.concatenate([carry, block])
            ids = None if ids is None else [*carry_ids, *ids]
            start = carry_start
        cut = (len(block) // tile) * tile
        if cut:
            yield start, (None if ids is None else ids[:cut]), block[:cut]
        if cut < len(block):
            carry_start, carry = start + cut, np.array(block[cut:], copy=True)
            carry_ids = None if ids is None else list(ids[cut:])
        else:
            carry, carry_ids = None, None
    if carry is not None:
        yield carry_start, carry_ids, carry


def ids_path_for(output_path: str | Path) -> Path:
    """Where the ids of a ``.npy`` output made from parquet input go: ``out.npy`` -> ``out.ids.txt``."""
    output_path = Path(output_path)
    return output_path.with_name(output_path.stem + ".ids.txt")


# -- readers ---------------------------------------------------------------------------------
def _npy_layout(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and byte offset of the data of a C-order ``.npy``."""
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise ValueError(f"{path}: not a readable .npy array ({error}).") from error
    shape, dtype = mapped.shape, mapped.dtype
    offset = int(mapped.offset)
    fortran = bool(mapped.flags.f_contiguous and not mapped.flags.c_contiguous)
    del mapped
    if len(shape) != 2 or dtype not in _INPUT_DTYPES:
        raise ValueError(f"{path}: expected a 2-D float32, float16 or float64 array; got shape {shape}, dtype {dtype}.")
    if fortran:
        raise ValueError(f"{path}: Fortran-ordered arrays are not supported; save it with np.save(np.ascontiguousarray(x)).")
    return shape, dtype, offset


def _iter_npy(path: Path, chunk_size: int, reuse_buffer: bool = False) -> Iterator[tuple[int, None, np.ndarray]]:
    """Blocks of a ``.npy``. With ``reuse_buffer``, a float32 file is mapped (:func:`_iter_npy_mapped`);
    other dtypes alternate two buffers, the next block read in a thread while the caller works on
    this one (``readinto`` releases the GIL). The caller must be done with a block when it asks for the next."""
    (n, d), dtype, offset = _npy_layout(path)
    if reuse_buffer and dtype == np.float32 and n and hasattr(mmap, "MADV_DONTNEED"):
        yield from _iter_npy_mapped(path, n, d, offset, chunk_size)
        return
    if dtype != np.float32:
        logger.info("%s: %s vectors are cast to float32 block by block.", path, dtype)
    starts = list(range(0, n, chunk_size))
    rows_cap = min(chunk_size, max(n, 1))
    buffers = [np.empty((rows_cap, d), dtype=dtype) for _ in range(2)] if reuse_buffer else None

    def read(handle, index: int) -> np.ndarray:
        start = starts[index]
        rows = min(chunk_size, n - start)
        block = buffers[index % 2][:rows] if buffers is not None else np.empty((rows, d), dtype=dtype)
        target = memoryview(block).cast("B")
        filled = 0
        while filled < len(target):
            got = handle.readinto(target[filled:])
            if not got:
                raise ValueError(f"{path}: file ends early at row {start + filled // (d * dtype.itemsize)} of {n}.")
            filled += got
        return block

    with open(path, "rb", buffering=0) as handle, ThreadPoolExecutor(max_workers=1) as pool:
        handle.seek(offset)
        upcoming = pool.submit(read, handle, 0) if starts and reuse_buffer else None
        for index, start in enumerate(starts):
            if upcoming is not None:
                block = upcoming.result()
                upcoming = pool.submit(read, handle, index + 1) if index + 1 < len(starts) else None
            else:
                block = read(handle, index)
            yield start, None, block if dtype == np.float32 else block.astype(np.float32)


def _iter_npy_mapped(path: Path, n: int, d: int, offset: int, chunk_size: int) -> Iterator[tuple[int, None, np.ndarray]]:
    """Read-only views of a mapped float32 ``.npy``: no copy out of the page cache. Each block's
    pages are dropped from the process (``MADV_DONTNEED``; the page cache keeps them) once the
    caller asks for the next, so the resident set stays at about one block."""
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        mapped.madvise(mmap.MADV_SEQUENTIAL)
        array = np.frombuffer(mapped, dtype=np.float32, count=n * d, offset=offset).reshape(n, d)
        row_bytes = d * 4
        for start in range(0, n, chunk_size):
            rows = min(chunk_size, n - start)
            yield start, None, array[start : start + rows]
            # madvise wants page-aligned ranges: drop whole pages of this block only.
            lo = -(-(offset + start * row_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
            hi = ((offset + (start + rows) * row_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
            if hi > lo:
                mapped.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        del array
    finally:
        try:
            mapped.close()
        except BufferError:  # a caller still holds a view; the map closes when it is collected
            pass


def _parquet_vectors(column, path: Path, vector_column: str) -> np.ndarray:
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise ValueError(f"{path}: column {vector_column!r} has {column.null_count} null vectors.")
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or pa.types.is_fixed_size_list(column.type)):
        raise ValueError(f"{path}: column {vector_column!r} must be a list of floats; got {column.type}.")
    n = len(column)
    values = column.flatten().to_numpy(zero_copy_only=False)
    if n == 0:
        return np.zeros((0, 0), np.float32)
    if len(values) % n:
        raise ValueError(f"{path}: vectors in column {vector_column!r} have different lengths.")
    d = len(values) // n
    if not pa.types.is_fixed_size_list(column.type):
        lengths = np.diff(column.offsets.to_numpy())
        if (lengths != d).any():
            raise ValueError(f"{path}: vectors in column {vector_column!r} have different lengths ({lengths.min()}..{lengths.max()}).")
    return np.ascontiguousarray(values.reshape(n, d), dtype=np.float32)


def _iter_parquet(path: Path, chunk_size: int, id_column: str, vector_column: str) -> Iterator[tuple[int, list[str], np.ndarray]]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    for column in (id_column, vector_column):
        if column not in names:
            raise ValueError(f"{path}: no column {column!r} (columns: {names}); pass id_column=/vector_column=.")
    start = 0
    for batch in parquet.iter_batches(batch_size=chunk_size, columns=[id_column, vector_column]):
        ids = [str(value) for value in batch.column(id_column).to_pylist()]
        vectors = _parquet_vectors(batch.column(vector_column), path, vector_column)
        yield start, ids, vectors
        start += len(ids)


def embedding_file_shape(path: str | Path, vector_column: str = "embedding") -> tuple[int, int]:
    """``(n, d)`` of a ``.npy`` or parquet embeddings file, or an ``embed-corpus`` folder, without reading the vectors."""
    path = Path(path)
    if is_shard_folder(path):  # the manifest's count; every shard is checked when the blocks are read
        return shard_folder_shape(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: embeddings file not found.")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        n = parquet.metadata.num_rows
        if vector_column not in parquet.schema_arrow.names:
            raise ValueError(f"{path}: no column {vector_column!r} (columns: {parquet.schema_arrow.names}).")
        first = next(parquet.iter_batches(batch_size=1, columns=[vector_column]), None)
        d = 0 if first is None or first.num_rows == 0 else len(first.column(0)[0])
        return int(n), int(d)
    shape, _, _ = _npy_layout(path)
    return int(shape[0]), int(shape[1])


def iter_embedding_blocks(
    path: str | Path,
    chunk_size: int = 65536,
    id_column: str = "id",
    vector_column: str = "embedding",
    reuse_buffer: bool = False,
) -> Iterator[tuple[int, list[str] | None, np.ndarray]]:
    """Yield ``(start_row, ids or None, float32 block)`` from a ``.npy`` or parquet file.

    ``ids`` is ``None`` for ``.npy`` (it carries none). With ``reuse_buffer`` (use each block
    before asking for the next) memory stays at about one block: a float32 ``.npy`` is mapped
    and each block is a read-only view whose pages leave the resident set once the next block
    is asked for; other ``.npy`` dtypes are read into two alternating buffers, the next block
    read in a thread while the caller works on this one.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}.")
    path = Path(path)
    if is_shard_folder(path):
        return _iter_shard_folder(path, chunk_size, reuse_buffer)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: embeddings file not found.")
    if path.suffix == ".parquet":
        return _iter_parquet(path, chunk_size, id_column, vector_column)
    if path.suffix == ".npy":
        return _iter_npy(path, chunk_size, reuse_buffer)
    raise ValueError(f"{path}: unsupported extension {path.suffix!r}; use .npy or .parquet.")


def _iter_shard_folder(path: Path, chunk_size: int, reuse_buffer: bool) -> Iterator[tuple[int, list[str] | None, np.ndarray]]:
    """The blocks of an ``embed-corpus`` folder, shard after shard (each checked first), with their ids."""
    shards, _ = shard_files(path)
    offset = 0
    for npy, ids in shards:
        for start, _, block in _iter_npy(npy, chunk_size, reuse_buffer):
            yield offset + start, ids[start : start + len(block)], block
        offset += len(ids)


# -- writers ---------------------------------------------------------------------------------
def _write_error(path: Path, error: OSError) -> OSError:
    """An error naming ``path`` for a failed write (numpy reports a full disk as "N requested and M written")."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)) and error.filename is not None:
        return error
    detail = error.strerror or str(error)
    reason = "the disk is full or the file would exceed a size limit" if (
        error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or "requested and" in str(error)) else "the write failed"
    return OSError(error.errno or errno.EIO, f"could not write the compressed vectors: {reason} ({detail}); nothing was written "
                   "there. Fix: free space (or raise the limit) and run again, or choose an --out on another disk", str(path))


def _write_npy(tmp: Path, blocks, n: int, k: int, ids_out: list[str] | None) -> None:
    # The write of block i runs in a thread while block i + 1 is transformed (file writes release the
    # GIL); ``blocks`` must not reuse a block's memory before the next-but-one block is asked for.
    with open(tmp, "wb") as handle, ThreadPoolExecutor(max_workers=1) as pool:
        np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")), "fortran_order": False, "shape": (n, k)})
        written = 0
        pending_write = None
        for _, ids, out in blocks:
            if ids_out is not None and ids is not None:
                ids_out.extend(ids)
            if pending_write is not None:
                pending_write.result()
            pending_write = pool.submit(np.ascontiguousarray(out, dtype="<f4").tofile, handle)
            written += len(out)
        if pending_write is not None:
            pending_write.result()
        if written != n:
            raise ValueError(f"expected {n} rows, got {written}.")


def _write_parquet(tmp: Path, blocks, k: int, id_column: str, vector_column: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(id_column, pa.string()), (vector_column, pa.list_(pa.float32(), k))])
    written = 0
    with pq.ParquetWriter(tmp, schema) as writer:
        for start, ids, out in blocks:
            if ids is None:
                ids = [str(i) for i in range(start, start + len(out))]
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(out, dtype=np.float32).ravel()), k)
            writer.write_table(pa.Table.from_arrays([pa.array(ids, pa.string()), vectors], schema=schema))
            written += len(out)
    return written


def apply_compressor_streaming(
    compressor: Compressor,
    input_path: str | Path,
    output_path: str | Path,
    chunk_size: int = 65536,
    *,
    id_column: str = "id",
    vector_column: str = "embedding",
    workers: int | None = None,
) -> Path:
    """``compressor.transform`` of the ``(n, d)`` embeddings at ``input_path``, chunk by chunk.

    ``input_path``: a float32/float16 ``.npy``, or a ``.parquet`` with ``id_column`` and
    ``vector_column``. ``output_path``: ``.npy`` writes an ``(n, k)`` float32 array (and, for
    parquet input, the ids to :func:`ids_path_for`); ``.parquet`` writes ids and vectors
    (row numbers as ids for ``.npy`` input). Every file is written atomically. ``workers``:
    threads transforming tiles side by side (default: the CPU count, at most 4). Returns the
    output path.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}.")
    input_path, output_path = Path(input_path), Path(output_path)
    if not input_path.is_file():
        raise FileNotFoundError(f"{input_path}: embeddings file not found.")
    if output_path.suffix not in (".npy", ".parquet"):
        raise ValueError(f"{output_path}: unsupported output extension {output_path.suffix!r}; use .npy or .parquet.")
    n, d = embedding_file_shape(input_path, vector_column)
    compressor._check_fitted()
    if n and d != compressor.input_dim_:
        raise ValueError(f"{input_path} has {d} columns but the compressor was fitted on {compressor.input_dim_}-d input.")
    k = compressor.output_dim
    workers = default_tile_workers() if workers is None else max(1, workers)
    start_time = time.perf_counter()

    def checked_blocks():
        for start, ids, block in iter_embedding_blocks(input_path, chunk_size, id_column, vector_column, reuse_buffer=True):
            if ids is not None and output_path.suffix == ".npy" and any("\n" in i or "\r" in i for i in ids):
                raise ValueError(f"{input_path}: ids contain line breaks, which ids.txt cannot hold; write .parquet output instead.")
            yield start, ids, block  # each tile checks its rows (in parallel) before transforming them

    def compressed():
        # Transform in tile-aligned pieces (same bits whatever chunk_size is), but hand the
        # writer one output block per read chunk, so row groups and memory follow chunk_size.
        pending: collections.deque[tuple[int, list[str] | None, int]] = collections.deque()
        outputs: list[np.ndarray] = []

        def recorded():
            for start, ids, block in checked_blocks():
                pending.append((start, ids, len(block)))
                yield start, ids, block

        def ready():
            available = sum(len(o) for o in outputs)
            while pending and pending[0][2] <= available:
                start, ids, rows = pending.popleft()
                merged = np.concatenate(outputs) if len(outputs) > 1 else outputs[0]
                outputs[:] = [merged[rows:]] if rows < len(merged) else []
                available -= rows
                yield start, ids, merged[:rows]

        # When .npy blocks are whole tiles, two output buffers alternate (the writer may still be writing
        # the previous block). Parquet batches follow row groups, so a carried remainder could still
        # point into a buffer: those get a new array per block.
        reusable = input_path.suffix == ".npy" and chunk_size % TILE_ROWS == 0
        buffers: list[np.ndarray | None] = [None, None]
        for index, (start, _, block) in enumerate(tile_aligned_blocks(recorded(), TILE_ROWS)):
            target = None
            if reusable:
                buffer = buffers[index % 2]
                if buffer is None or len(buffer) < len(block):
                    buffer = buffers[index % 2] = np.empty((len(block), k), dtype=np.float32)
                target = buffer[: len(block)]
            try:
                outputs.append(transform_rows(compressor, block, out=target, workers=workers))
            except NonFiniteError as error:
                if error.what == "input":
                    raise error.shifted(start, source=str(input_path), what="input vectors") from None
                # Finite input rows, non-finite output: the adapter's weights are not.
                raise error.shifted(start, source=f"{input_path} through the {compressor.method} adapter") from None
            yield from ready()
        yield from ready()

    try:
        if output_path.suffix == ".parquet":
            atomic_write(output_path, lambda tmp: _write_parquet(tmp, compressed(), k, id_column, vector_column))
        else:
            ids_out: list[str] | None = [] if input_path.suffix == ".parquet" else None
            atomic_write(output_path, lambda tmp: _write_npy(tmp, compressed(), n, k, ids_out))
            if ids_out is not None:
                atomic_write(ids_path_for(output_path), lambda tmp: tmp.write_text("".join(i + "\n" for i in ids_out), encoding="utf-8"))
    except OSError as error:
        raise _write_error(output_path, error) from None
    seconds = time.perf_counter() - start_time
    logger.debug("apply_compressor_streaming: %d x %d -> %d-d in %.2fs (%.0f vectors/s)", n, d, k, seconds, n / max(seconds, 1e-9))
    return output_path
