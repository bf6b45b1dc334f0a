"""Exact top-k inner-product kernels, and a measured choice of the fastest one per shape.

Every kernel here is exact: it scores every ``(query, corpus row)`` pair in float32 and keeps
the ``k`` best. They differ only in speed, which depends on the shape and the machine, so
:func:`select_kernel` times them on the caller's own data and caches the winner per shape
class. :func:`embedtune.evaluate.search.exact_search` then rescores the winners canonically, so
the returned results do not depend on which kernel won.

Why more than one kernel (measured on the 2-core dev machine; ``benchmarks/RESULTS_efficiency.md``):

* FAISS ``IndexFlatIP``/``knn_inner_product`` with ``nq >= 20`` runs one sgemm per
  1024-row database block (``distance_compute_blas_database_bs``), then an OpenMP region that
  pushes the block's scores through one heap per query: about 1000 sgemm calls and 1000 thread
  barriers per million rows. At low ``d`` each sgemm is tiny, so the barriers and the heap pass
  dominate, and on a shared 2-core machine a descheduled thread stalls every barrier. A
  64k-row database block (``faiss-bs64k``) removes most of them.
* With ``nq < 20`` FAISS scans sequentially with one thread per query: a single query uses
  one core. Its bundled OpenBLAS (0.3.15) also predates Zen 4 and runs its AVX2 "Zen" kernels.
* ``torch``: MKL sgemm over corpus blocks sized so the score block stays near the L3 cache,
  then ``torch.topk``; a single query is one sgemv over the whole corpus on every core.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
import warnings
from typing import Callable

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "KERNELS",
    "Kernel",
    "faiss_knn_ip",
    "torch_blocked_topk",
    "numpy_blocked_topk",
    "select_kernel",
    "kernel_choices",
    "clear_kernel_cache",
    "set_search_threads",
    "search_threads",
]

Kernel = Callable[[np.ndarray, np.ndarray, int], "tuple[np.ndarray, np.ndarray]"]

_FAISS_LOCK = threading.RLock()
_BLOCK_LOCK = threading.Lock()


def _check(xq: np.ndarray, xb: np.ndarray, k: int) -> None:
    assert xq.dtype == np.float32 and xb.dtype == np.float32, (xq.dtype, xb.dtype)
    assert xq.ndim == 2 and xb.ndim == 2 and xq.shape[1] == xb.shape[1], (xq.shape, xb.shape)
    assert 0 < k <= xb.shape[0], (k, xb.shape)


def faiss_knn_ip(xq: np.ndarray, xb: np.ndarray, k: int, database_block: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FAISS exact inner-product top-``k`` (the ``IndexFlatIP`` search, without copying ``xb``).

    ``database_block`` overrides FAISS's process-wide ``distance_compute_blas_database_bs``
    (1024 by default) for this call only.
    """
    import faiss

    _check(xq, xb, k)
    if database_block is None:
        return faiss.knn(xq, xb, k, metric=faiss.METRIC_INNER_PRODUCT)
    with _BLOCK_LOCK:
        previous = faiss.cvar.distance_compute_blas_database_bs
        faiss.cvar.distance_compute_blas_database_bs = int(database_block)
        try:
            return faiss.knn(xq, xb, k, metric=faiss.METRIC_INNER_PRODUCT)
        finally:
            faiss.cvar.distance_compute_blas_database_bs = previous


@contextlib.contextmanager
def _threads(n: int | None):
    """Run with ``n`` torch and FAISS threads, then restore (both are process-wide settings)."""
    if n is None:
        yield
        return
    import faiss
    import torch

    with _FAISS_LOCK:
        torch_before, faiss_before = torch.get_num_threads(), faiss.omp_get_max_threads()
        torch.set_num_threads(n)
        faiss.omp_set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(torch_before)
            faiss.omp_set_num_threads(faiss_before)


def single_threaded(kernel: Kernel) -> Kernel:
    """``kernel`` run with one torch/FAISS thread (no OpenMP barriers to wait on)."""

    @functools.wraps(kernel)
    def run(xq: np.ndarray, xb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        with _threads(1):
            return kernel(xq, xb, k)

    return run


def _block_rows(nq: int, nb: int, score_bytes: int) -> int:
    """Corpus rows per block so that the (nq, rows) float32 score block is about ``score_bytes``."""
    return int(max(1024, min(nb, score_bytes // (4 * max(nq, 1)))))


def torch_blocked_topk(xq: np.ndarray, xb: np.ndarray, k: int, score_bytes: int = 16 << 20) -> tuple[np.ndarray, np.ndarray]:
    """``torch.mm`` over corpus blocks into a reused score buffer, ``torch.topk`` per block, then a merge."""
    import torch

    _check(xq, xb, k)
    nq, nb = len(xq), len(xb)
    with warnings.catch_warnings():
        # A read-only memory map is fine: the corpus is only read.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        corpus = torch.from_numpy(xb)
        queries = torch.from_numpy(xq)
    rows = _block_rows(nq, nb, score_bytes)
    buffer = torch.empty((nq, min(rows, nb)), dtype=torch.float32)
    values, indices = [], []
    with torch.inference_mode():
        for start in range(0, nb, rows):
            block = corpus[start : start + rows]
            scores = torch.mm(queries, block.T, out=buffer[:, : len(block)])  # (nq, rows)
            top_values, top_indices = torch.topk(scores, min(k, len(block)), dim=1, sorted=False)
            values.append(top_values)
            indices.append(top_indices + start)
        if len(values) == 1:
            top_values, top_indices = values[0], indices[0]
        else:
            top_values, top_indices = torch.cat(values, 1), torch.cat(indices, 1)  # (nq, n_blocks * k)
        D, order = torch.topk(top_values, k, dim=1, sorted=True)
        I = torch.gather(top_indices, 1, order)
    return D.numpy(), I.numpy().astype(np.int64, copy=False)


def numpy_blocked_topk(xq: np.ndarray, xb: np.ndarray, k: int, score_bytes: int = 16 << 20) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.matmul`` over corpus blocks, ``argpartition`` per block, then a merge."""
    _check(xq, xb, k)
    nq, nb = len(xq), len(xb)
    rows = _block_rows(nq, nb, score_bytes)
    values, indices = [], []
    for start in range(0, nb, rows):
        scores = xq @ xb[start : start + rows].T  # (nq, rows)
        kk = min(k, scores.shape[1])
        part = np.argpartition(scores, scores.shape[1] - kk, axis=1)[:, -kk:]
        values.append(np.take_along_axis(scores, part, axis=1))
        indices.append(part + start)
    top_values, top_indices = np.concatenate(values, 1), np.concatenate(indices, 1)
    order = np.argsort(-top_values, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(top_values, order, 1), np.take_along_axis(top_indices, order, 1).astype(np.int64)


KERNELS: dict[str, Kernel] = {
    "faiss": faiss_knn_ip,
    "faiss-bs64k": functools.partial(faiss_knn_ip, database_block=65536),
    "faiss-1t": single_threaded(faiss_knn_ip),
    "torch-16m": functools.partial(torch_blocked_topk, score_bytes=16 << 20),
    "torch-64m": functools.partial(torch_blocked_topk, score_bytes=64 << 20),
    "torch-1t": single_threaded(functools.partial(torch_blocked_topk, score_bytes=16 << 20)),
    "numpy": numpy_blocked_topk,
}
"""Exact kernels by name; every one returns ``(D, I)`` of shape ``(nq, k)``, D descending."""

DEFAULT_KERNEL = "torch-1t"  # tiny problems: a parallel region costs more than it saves
# Below this much work (~10 ms) timing the kernels costs more than it saves. Work counts
# nb * d * max(nq, 16): a few queries are memory-bound, so they cost about what 16 would.
_TUNE_MIN_WORK = 5e8
_TUNE_ROWS = 65536
_TUNE_QUERIES = 256

_choices: dict[tuple, dict] = {}
_choices_lock = threading.Lock()


def search_threads() -> dict[str, int]:
    """Threads the kernels use now: torch intra-op and FAISS OpenMP."""
    import faiss
    import torch

    return {"torch": torch.get_num_threads(), "faiss": faiss.omp_get_max_threads()}


def set_search_threads(n: int) -> None:
    """Use ``n`` threads in both torch and FAISS (process-wide), and forget measured choices."""
    import faiss
    import torch

    if n < 1:
        raise ValueError(f"threads must be >= 1; got {n}.")
    torch.set_num_threads(int(n))
    faiss.omp_set_num_threads(int(n))
    clear_kernel_cache()


def _bucket(value: int) -> int:
    """Powers-of-two class of a size: 1, 2, 4, 8, ..."""
    return 1 << max(0, math.ceil(math.log2(max(value, 1))))


def _shape_class(nq: int, nb: int, d: int, k: int) -> tuple:
    threads = search_threads()
    return (d, _bucket(nq), _bucket(nb), _bucket(k), threads["torch"], threads["faiss"])


def _time(kernel: Kernel, xq: np.ndarray, xb: np.ndarray, k: int, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        kernel(xq, xb, k)
        best = min(best, time.perf_counter() - start)
    return best


def select_kernel(xq: np.ndarray, xb: np.ndarray, k: int, candidates: tuple[str, ...] | None = None) -> str:
    """Name of the fastest kernel for this shape, measured on ``xq``/``xb`` and cached.

    Small problems (``nb * d * max(nq, 16)`` under 5e8, ~10 ms) use ``DEFAULT_KERNEL`` untimed. Otherwise every
    candidate runs once to warm up and twice timed on at most 65536 corpus rows (256 MB of
    them for 16 queries or fewer, which are memory-bound) and 256 queries; a candidate over 3x slower than the best after its first timed run is dropped.
    Choices are cached per (d, nq, nb, k) power-of-two class and thread setting.
    """
    nq, nb, d = len(xq), len(xb), xq.shape[1]
    names = tuple(candidates or KERNELS)
    unknown = [name for name in names if name not in KERNELS]
    if unknown:
        raise ValueError(f"unknown search kernel(s) {unknown}; valid: {', '.join(KERNELS)}.")
    if len(names) == 1:
        return names[0]
    if float(max(nq, 16)) * nb * d < _TUNE_MIN_WORK:
        return DEFAULT_KERNEL if DEFAULT_KERNEL in names else names[0]
    key = _shape_class(nq, nb, d, k) + (names,)
    with _choices_lock:
        cached = _choices.get(key)
    if cached is not None:
        return cached["kernel"]
    sample_q = xq[:_TUNE_QUERIES]
    rows = _TUNE_ROWS
    if nq <= 16:
        # Few queries are memory-bound: time them on more than the L3 cache holds (256 MB).
        rows = max(rows, (256 << 20) // (4 * d))
    sample_b = xb[: max(rows, min(nb, k))]
    kk = min(k, len(sample_b))
    start = time.perf_counter()
    seconds: dict[str, float] = {}
    for name in names:
        KERNELS[name](sample_q, sample_b, kk)  # warm-up: allocations, thread pools, page faults
        first = _time(KERNELS[name], sample_q, sample_b, kk, 1)
        if seconds and first > 3 * min(seconds.values()):
            seconds[name] = first
            continue
        seconds[name] = min(first, _time(KERNELS[name], sample_q, sample_b, kk, 1))
    best = min(seconds, key=seconds.__getitem__)
    record = {
        "kernel": best,
        "seconds": seconds,
        "tune_seconds": time.perf_counter() - start,
        "sample": [len(sample_q), len(sample_b), d, kk],
    }
    with _choices_lock:
        _choices[key] = record
    logger.info(
        "search kernel for nq~%d nb~%d d=%d k~%d: %s (%s; tuned in %.2fs)",
        key[1], key[2], d, key[3], best, ", ".join(f"{n} {s * 1e3:.1f}ms" for n, s in seconds.items()), record["tune_seconds"],
    )
    return best


def kernel_choices() -> list[dict]:
    """The measured choices so far, one dict per shape class (for logs and benchmarks)."""
    with _choices_lock:
        items = list(_choices.items())
    return [
        {"d": key[0], "nq_class": key[1], "nb_class": key[2], "k_class": key[3], "torch_threads": key[4], "faiss_threads": key[5], **value}
        for key, value in items
    ]


def clear_kernel_cache() -> None:
    with _choices_lock:
        _choices.clear()
