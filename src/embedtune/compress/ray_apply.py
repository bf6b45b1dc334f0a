"""Scale-out apply with Ray: a row-range apply of a ``.npy`` file, and a ``map_batches``-ready compressor callable.

One machine holds about a billion 128-d float32 vectors in RAM; past that, or to encode and
compress in one pass, spread the apply over a Ray cluster. Install the extra
(``pip install "embedtune[ray]"``).

A ``.npy`` file (what ``embedtune compress apply --ray-actors N`` runs)::

    from embedtune.compress.ray_apply import RayPool, apply_compressor_ray, ray_session

    with ray_session("auto"):                    # None: a local Ray; "ray://host:10001": a remote one
        apply_compressor_ray("adapters/dive-128", "/shared/emb.npy", "/shared/emb-128.npy", RayPool(actors=8))

The file is cut into row ranges whose starts are multiples of 4096 (:data:`TILE_ROWS`). Each
actor memory-maps the input, transforms its range and writes the rows straight into their place
of the output file, which the driver created at full size; the driver moves it into place once
every range is written. No vector goes through Ray's object store or a dataframe, and every row
sits at the same tile position as in :func:`embedtune.compress.streaming.apply_compressor_streaming`,
so the two outputs are equal bit for bit. Input, output and adapter folder must be reachable
under the same paths from every node (shared storage).

A Ray Data dataset (parquet, or vectors made by another stage)::

    import ray
    from embedtune.compress.ray_apply import CompressorBatchFn, compress_dataset

    ray.init()                                   # or ray.init(address="auto") on a cluster
    ds = ray.data.read_parquet("s3://bucket/embeddings/")     # columns: id, embedding
    out = compress_dataset(ds, "adapters/dive-128", batch_size=65536, concurrency=8)
    out.write_parquet("s3://bucket/embeddings-dive128/")

    # or, by hand: the class is loaded once per actor, not once per batch
    out = ds.map_batches(
        CompressorBatchFn,
        fn_constructor_kwargs={"adapter": "adapters/dive-128"},
        batch_size=65536,
        batch_format="pyarrow",
        zero_copy_batch=True,
        concurrency=8,
    )

Batches go as Arrow tables: a list (or fixed-size list) column of vectors becomes one ``(n, d)``
matrix without a Python object per row (numpy batches of a parquet list column are object arrays
of one array per row), and the output is a fixed-size list column. This route moves every vector
through Ray's object store (a single ``.npy`` read with ``read_numpy`` is one block: the whole file),
so for files on shared storage :func:`apply_compressor_ray` is several times faster and lighter;
``benchmarks/ray_apply_speed.py`` measures both against the local apply.
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
import mmap
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress.base import Compressor
from embedtune.compress.registry import load_compressor
from embedtune.compress.streaming import TILE_ROWS, _npy_layout, transform_rows
from embedtune.errors import EmbedtuneError, NonFiniteError
from embedtune.io import atomic_write
from embedtune.runtime import RAY_CHATTER, native_chatter_filtered, progress_bar, verbose_enabled

logger = logging.getLogger(__name__)

__all__ = ["CompressorBatchFn", "RangeCompressor", "RayPool", "apply_compressor_ray", "check_ray_apply_paths", "compress_dataset", "pool_from_flags", "ray_session", "row_ranges"]


@dataclass(frozen=True)
class RayPool:
    """An actor pool: ``actors`` actors of ``cpus_per_actor`` CPUs, each transforming with ``threads_per_actor``
    threads (default: the CPUs it reserves, at least 1), on the cluster at ``address`` (None: a local Ray)."""

    actors: int = 2
    cpus_per_actor: float = 1.0
    threads_per_actor: int | None = None
    address: str | None = None

    @property
    def threads(self) -> int:
        """Transform threads per actor: so that the actors together use the cores they reserved, not each of them every core."""
        return self.threads_per_actor if self.threads_per_actor is not None else max(1, int(self.cpus_per_actor))

    def check(self) -> None:
        """A clear error for a pool that cannot run."""
        if self.actors < 1:
            raise ValueError(f"--ray-actors must be at least 1; got {self.actors}.")
        if self.cpus_per_actor <= 0:
            raise ValueError(f"--cpus-per-actor must be above 0; got {self.cpus_per_actor}.")
        if self.threads_per_actor is not None and self.threads_per_actor < 1:
            raise ValueError(f"--threads-per-actor must be at least 1; got {self.threads_per_actor}.")


def pool_from_flags(actors: int, address: str | None, cpus_per_actor: float = 1.0, threads_per_actor: int | None = None) -> RayPool | None:
    """The pool that ``--ray-actors``, ``--ray-address``, ``--cpus-per-actor`` and ``--threads-per-actor`` describe; None for ``--ray-actors 0``."""
    if actors < 0:
        raise ValueError(f"--ray-actors must be 0 (run in this process) or more; got {actors}.")
    if actors == 0:
        if address is not None:
            raise ValueError("--ray-address needs --ray-actors N (N >= 1): how many actors to run on that cluster.")
        return None
    pool = RayPool(actors=actors, cpus_per_actor=cpus_per_actor, threads_per_actor=threads_per_actor, address=address)
    pool.check()
    return pool


def _import_ray() -> Any:
    try:
        import ray  # the optional `ray` extra
    except ImportError as error:
        raise ImportError('--ray-actors needs Ray: pip install "embedtune[ray]" (or ray[data]).') from error
    return ray


def _check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) nobody listens on now, instead of Ray's minute of retries."""
    import socket

    if address is None or address == "auto" or address.startswith("local"):
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise EmbedtuneError(f"--ray-address {address}: expected 'auto', HOST:PORT (the head node's GCS port, 6379 by default) "
                             "or ray://HOST:PORT (its Ray Client port, 10001 by default).")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise EmbedtuneError(f"--ray-address {address}: nothing answers at {host}:{port} ({error.strerror or error}). Fix: start the "
                             "cluster (`ray start --head` on its head node) and give its address, 'auto' on one of its nodes, or drop "
                             "--ray-address for a local Ray.") from None


@contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
    """Ray, started here (``address=None``) or joined (``"auto"`` on a cluster node, ``"ray://host:10001"``), for the block.

    A Ray already initialised in this process is used as it is and left running; one started here
    is shut down at the end. Ray's start-up lines and its workers' logs show only with ``embedtune -v``.
    """
    ray = _import_ray()
    started_here = not ray.is_initialized()
    # Native lines of Ray's start-up and shutdown (and gRPC's, when Ray forks its workers) hidden too, unless -v.
    with native_chatter_filtered(RAY_CHATTER) if started_here else nullcontext():
        if started_here:
            quiet = not verbose_enabled()
            _check_reachable(address)
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=not quiet,
                         logging_level=logging.ERROR if quiet else logging.INFO)
            except ConnectionError as error:
                raise EmbedtuneError(f"--ray-address {address}: no Ray cluster answers there ({error}). Fix: start one "
                                     "(`ray start --head`) and pass its address, 'auto' on one of its nodes, or drop --ray-address "
                                     "for a local Ray.") from None
        try:
            yield ray
        finally:
            if started_here:
                ray.shutdown()


@contextmanager
def _quiet_ray_data(ray: Any) -> Iterator[None]:
    """Ray Data's bars and per-run log lines hidden for the block (shown with ``embedtune -v``); actors' errors raised as themselves."""
    context = ray.data.DataContext.get_current()
    saved = (context.enable_progress_bars, context.print_on_execution_start, context.raise_original_map_exception)
    context.raise_original_map_exception = True  # an actor's own error (a NaN row, a full disk) reaches the driver as itself
    saved_levels = {name: logging.getLogger(name).level for name in ("ray", "ray.data")}
    if not verbose_enabled():
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        for name in saved_levels:
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with native_chatter_filtered(RAY_CHATTER):
            yield
    finally:
        context.enable_progress_bars, context.print_on_execution_start, context.raise_original_map_exception = saved
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


def row_ranges(n: int, rows_per_range: int, tile: int = TILE_ROWS) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges covering ``n`` rows, each (but the last) ``rows_per_range`` rounded up to a multiple of ``tile``.

    Every range starts at a multiple of ``tile``, so each row sits at the same position of its tile
    as in the local apply (a row's bits can depend on it, see :func:`transform_rows`).
    """
    if rows_per_range < 1:
        raise ValueError(f"rows per range must be >= 1; got {rows_per_range}.")
    step = -(-rows_per_range // tile) * tile
    return [(start, min(start + step, n)) for start in range(0, n, step)]


class RangeCompressor:
    """Ray actor for ``map_batches`` over ``{"start", "stop"}`` rows: transforms those rows of a ``.npy`` and writes them in place.

    Args:
        adapter: a fitted :class:`Compressor` or its folder (loaded once per actor).
        input_path: the ``(n, d)`` float ``.npy``, memory-mapped; each range's pages leave the
            actor's resident set once it is written.
        output_path: the ``(n, k)`` float32 file the driver created at full size, the rows at ``data_offset``.
        threads: transform threads (tiles side by side, one BLAS thread each).
        source: the name errors give the input (the path the user gave).
    """

    def __init__(self, adapter: str | Path | Compressor, input_path: str, output_path: str, data_offset: int, threads: int = 1,
                 source: str | None = None) -> None:
        self.compressor = adapter if isinstance(adapter, Compressor) else load_compressor(adapter)
        self.compressor._check_fitted()
        self.input_path, self.output_path, self.data_offset = Path(input_path), Path(output_path), int(data_offset)
        self.threads, self.source = max(1, int(threads)), source or str(input_path)
        (self.n, self.d), self.dtype, self.input_offset = _npy_layout(self.input_path)
        with open(self.input_path, "rb") as handle:
            self.mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        self.rows = np.frombuffer(self.mapped, dtype=self.dtype, count=self.n * self.d, offset=self.input_offset).reshape(self.n, self.d)
        self.buffer: np.ndarray | None = None

    def transform_range(self, start: int, stop: int) -> int:
        """Transform rows ``[start, stop)`` and write them to their place in the output; returns the rows written."""
        block = self.rows[start:stop]
        if self.dtype != np.float32:
            block = block.astype(np.float32)
        rows, k = stop - start, self.compressor.output_dim
        if self.buffer is None or len(self.buffer) < rows:
            self.buffer = np.empty((rows, k), dtype=np.float32)
        out = self.buffer[:rows]
        try:
            transform_rows(self.compressor, block, out=out, workers=self.threads)  # one BLAS thread per tile, as everywhere
        except NonFiniteError as error:
            if error.what == "input":
                raise error.shifted(start, source=self.source, what="input vectors") from None
            raise error.shifted(start, source=f"{self.source} through the {self.compressor.method} adapter") from None
        self._drop_pages(start, stop)
        view = memoryview(np.ascontiguousarray(out, dtype="<f4")).cast("B")
        position = self.data_offset + start * k * 4
        with open(self.output_path, "r+b", buffering=0) as handle:
            while len(view):
                written = os.pwrite(handle.fileno(), view, position)
                view, position = view[written:], position + written
        return rows

    def _drop_pages(self, start: int, stop: int) -> None:
        """Drop this range's input pages from the resident set (the page cache keeps them)."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        row_bytes = self.d * self.dtype.itemsize
        lo = -(-(self.input_offset + start * row_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = ((self.input_offset + stop * row_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        if hi > lo:
            self.mapped.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        starts = [int(s) for s in batch["start"]]
        rows = [self.transform_range(s, int(e)) for s, e in zip(starts, batch["stop"])]
        return {"start": np.array(starts, dtype=np.int64), "rows": np.array(rows, dtype=np.int64)}


def _task_error(error: BaseException) -> BaseException:
    """The embedtune error inside a Ray task failure (so the command prints it, not Ray's traceback), else the failure."""
    seen = error
    for _ in range(5):
        cause = getattr(seen, "cause", None) or seen.__cause__
        if cause is None:
            break
        if isinstance(cause, (EmbedtuneError, ValueError, OSError)) and not type(cause).__module__.startswith("ray"):
            return cause
        seen = cause
    return error


def check_ray_apply_paths(input_path: str | Path, output_path: str | Path, compressor: Compressor | None = None) -> tuple[Path, Path]:
    """Refuse what the Ray apply cannot do before any Ray starts: it reads a ``.npy`` (of ``compressor``'s input width) and writes a ``.npy``."""
    input_path, output_path = Path(input_path), Path(output_path)
    if not input_path.is_file():
        raise FileNotFoundError(f"{input_path}: embeddings file not found.")
    if input_path.suffix != ".npy":
        raise ValueError(f"{input_path}: the Ray apply (--ray-actors) reads a .npy file; convert the parquet to .npy "
                         "(`embedtune compress apply` without --ray-actors writes one), or drop --ray-actors.")
    if output_path.suffix != ".npy":
        raise ValueError(f"{output_path}: the Ray apply (--ray-actors) writes a .npy file; give an --out ending in .npy, or drop --ray-actors.")
    (n, d), _, _ = _npy_layout(input_path)  # a 2-D float C-order array, or an error naming the file
    if compressor is not None and n and d != compressor.input_dim_:
        raise ValueError(f"{input_path} has {d} columns but the compressor was fitted on {compressor.input_dim_}-d input.")
    return input_path, output_path


def apply_compressor_ray(
    adapter: str | Path | Compressor,
    input_path: str | Path,
    output_path: str | Path,
    pool: RayPool = RayPool(),
    rows_per_range: int = 65536,
    show_progress: bool = True,
) -> Path:
    """:func:`~embedtune.compress.streaming.apply_compressor_streaming` of a ``.npy`` on a Ray actor pool; the same bits.

    Runs on the Ray this process has initialised, or else in a :func:`ray_session` at ``pool.address``. ``adapter``: a fitted compressor or its folder
    (every node must reach it under that path; a compressor object is sent to the actors).
    ``input_path``: an ``(n, d)`` float32/float16/float64 ``.npy``; ``output_path``: the
    ``(n, k)`` float32 ``.npy``, written atomically. ``rows_per_range``: rows per Ray task, rounded
    up to a multiple of 4096 (memory per actor: about one range in and one out). Returns the output path.
    """
    ray = _import_ray()
    pool.check()
    compressor = adapter if isinstance(adapter, Compressor) else load_compressor(adapter)
    compressor._check_fitted()
    input_path, output_path = check_ray_apply_paths(input_path, output_path, compressor)
    (n, d), _, _ = _npy_layout(input_path)
    k = compressor.output_dim
    # At least one range per actor (a small file too), and no actor without a range.
    ranges = row_ranges(n, min(rows_per_range, -(-n // pool.actors))) if n else []
    actors = max(1, min(pool.actors, len(ranges)))
    start_time = time.perf_counter()

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")), "fortran_order": False,
                                                          "shape": (n, k)})
            data_offset = handle.tell()
            handle.truncate(data_offset + n * k * 4)  # full size now; the actors fill in their rows
        if not ranges:
            return
        done: set[int] = set()
        try:
            # The dataset takes Ray Data's settings when it is made: make it inside.
            with _quiet_ray_data(ray), progress_bar(n, f"compressing {n} vectors on {actors} Ray actor{'s' if actors > 1 else ''}", unit="vec",
                                                     enabled=show_progress) as bar:
                dataset = ray.data.from_items([{"start": a, "stop": b} for a, b in ranges], override_num_blocks=len(ranges))
                mapped = dataset.map_batches(
                    RangeCompressor,
                    fn_constructor_kwargs={"adapter": adapter if isinstance(adapter, Compressor) else str(Path(adapter).resolve()),
                                           "input_path": str(input_path.resolve()), "output_path": str(tmp.resolve()),
                                           "data_offset": data_offset, "threads": pool.threads, "source": str(input_path)},
                    batch_size=1,
                    batch_format="numpy",
                    compute=ray.data.ActorPoolStrategy(size=actors),
                    num_cpus=pool.cpus_per_actor,
                )
                for row in mapped.iter_rows():
                    done.add(int(row["start"]))
                    bar.update(int(row["rows"]))
        except Exception as error:  # noqa: BLE001 - a worker's own error is re-raised as itself
            found = _task_error(error)
            if found is error:
                raise
            raise found from None
        missing = [a for a, _ in ranges if a not in done]
        if missing:
            raise EmbedtuneError(f"{output_path}: the Ray actors returned without rows {missing[0]}.. ({len(missing)} ranges); "
                                 "nothing was written. Fix: run again.")

    with ray_session(pool.address):
        atomic_write(output_path, write)
    seconds = time.perf_counter() - start_time
    logger.debug("apply_compressor_ray: %d x %d -> %d-d on %d actors in %.2fs", n, d, k, pool.actors, seconds)
    return output_path


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


def _arrow_vectors(column: Any, name: str) -> np.ndarray:
    """An Arrow list, fixed-size list or tensor column of vectors as an ``(n, d)`` float32 matrix, without a Python object per row."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if isinstance(column.type, pa.ExtensionType):  # Ray's tensor column: (n, d) already
        return _stack_vectors(column.to_numpy(), name)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or pa.types.is_fixed_size_list(column.type)):
        raise ValueError(f"column {name!r} must hold vectors (a list of floats); got {column.type}.")
    if column.null_count:
        raise ValueError(f"column {name!r} has {column.null_count} null vectors.")
    n = len(column)
    if n == 0:
        return np.zeros((0, 0), np.float32)
    values = column.flatten().to_numpy(zero_copy_only=False)
    d = len(values) // n
    if len(values) % n or (not pa.types.is_fixed_size_list(column.type) and (np.diff(column.offsets.to_numpy()) != d).any()):
        raise ValueError(f"column {name!r}: vectors have different lengths.")
    return np.ascontiguousarray(values.reshape(n, d), dtype=np.float32)


class CompressorBatchFn:
    """Callable class for ``Dataset.map_batches``, with ``batch_format="pyarrow"`` (fastest) or ``"numpy"``.

    Args:
        adapter: a fitted :class:`Compressor`, or the folder it was saved to (loaded once per
            Ray actor).
        vector_column: the input column of ``(d,)`` vectors.
        output_column: where the ``(k,)`` vectors go; default replaces ``vector_column``.

    An Arrow batch comes back as a table whose output column is a fixed-size list of float32 (a Ray
    tensor column for a tensor column in); a numpy batch as a dict with an ``(n, k)`` array.
    """

    def __init__(self, adapter: str | Path | Compressor, vector_column: str = "embedding", output_column: str | None = None) -> None:
        if isinstance(adapter, Compressor):
            self.compressor = adapter
        else:
            self.compressor = load_compressor(adapter)
        self.compressor._check_fitted()
        self.vector_column = vector_column
        self.output_column = output_column or vector_column

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, dict):
            if self.vector_column not in batch:
                raise ValueError(f"batch has no column {self.vector_column!r} (columns: {sorted(batch)}).")
            vectors = _stack_vectors(batch[self.vector_column], self.vector_column)
            out = dict(batch)
            out[self.output_column] = self._transform(vectors)  # (n, k) float32
            return out
        import pyarrow as pa

        if self.vector_column not in batch.column_names:
            raise ValueError(f"batch has no column {self.vector_column!r} (columns: {sorted(batch.column_names)}).")
        source = batch.column(self.vector_column)
        compressed = self._transform(_arrow_vectors(source, self.vector_column))
        if isinstance(source.type, pa.ExtensionType):  # a Ray tensor column in, a tensor column out (numpy readers keep working)
            from ray.data.extensions import ArrowTensorArray

            column = ArrowTensorArray.from_numpy(compressed)
        else:
            column = pa.FixedSizeListArray.from_arrays(pa.array(compressed.ravel()), self.compressor.output_dim)
        if self.output_column in batch.column_names:
            return batch.set_column(batch.column_names.index(self.output_column), self.output_column, column)
        return batch.append_column(self.output_column, column)

    def _transform(self, vectors: np.ndarray) -> np.ndarray:
        return transform_rows(self.compressor, vectors)  # one BLAS thread per tile, as the local apply: the same bits


def compress_dataset(
    ds: Any,
    adapter: str | Path | Compressor,
    vector_column: str = "embedding",
    output_column: str | None = None,
    batch_size: int = 65536,
    concurrency: int | tuple[int, int] | None = None,
    **map_batches_kwargs: Any,
) -> Any:
    """``ds.map_batches`` with :class:`CompressorBatchFn`, one compressor per actor, on Arrow batches.

    ``ds`` is a ``ray.data.Dataset``; returns the lazily compressed dataset. ``batch_size``: rows
    per call, a multiple of 4096 (larger batches mean fewer calls; each is one block in and one
    out). Extra keyword arguments go to ``map_batches`` (e.g. ``num_cpus=1``, or
    ``batch_format="numpy"``).
    """
    import ray

    kwargs: dict[str, Any] = {
        "fn_constructor_kwargs": {"adapter": adapter if isinstance(adapter, Compressor) else str(adapter), "vector_column": vector_column, "output_column": output_column},
        "batch_size": batch_size,
        "batch_format": "pyarrow",
        "zero_copy_batch": True,
        "compute": ray.data.ActorPoolStrategy(size=concurrency if concurrency is not None else 1)
        if not isinstance(concurrency, tuple) else ray.data.ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1]),
    }
    kwargs.update(map_batches_kwargs)
    return ds.map_batches(CompressorBatchFn, **kwargs)
