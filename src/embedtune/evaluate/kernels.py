"""Exact top-k inner-product kernels, and a measured choice of the fastest one per shape.

Every kernel here is exact: it scores every ``(query, corpus row)`` pair in float32 and keeps
the ``k`` best. They differ only in speed, which depends on the shape and the machine, so
:func:`select_kernel` times them on the caller's own data and caches the winner per shape
class. :func:`embedtune.evaluate.search.exact_search` then rescores the winners canonically, so
the returned results do not depend on which kernel won.

Why more than one kernel (measured on the 2-core dev machine; ``benchmarks/RESULTS_efficiency.md``):

* FAISS 1.15 takes its BLAS path only when ``nq * d >= distance_compute_blas_threshold``
  (default 128000). Below that, ``knn_inner_product`` runs one ``fvec_inner_product`` per
  (query, row) pair and streams the whole corpus once per query. With 256 queries only
  d >= 500 gets BLAS: at 256 and 128 dims FAISS was as slow as at 768, or slower (``perf``:
  78 % of the time in ``fvec_inner_product`` at d=256, against ``sgemm_kernel_ZEN`` at 768).
  ``faiss-blas`` sets the threshold to 20 queries whatever ``d`` (the rule of older FAISS).
* Threads: on a shared machine every OpenMP parallel region waits for its slowest thread, and
  a thread that another process has descheduled stalls it for a scheduler tick. With other
  jobs running, 2-thread FAISS with its 1024-row blocks (one barrier each) took 3.7 s where one
  thread took 0.80 s (256 queries, 131k x 768), and a single query 24 ms where one thread took
  0.16 ms (20k x 128). Hence the ``-1t`` variants, 64k-row blocks for the 2-thread one, and
  timing with idle gaps between calls, as real searches have.
* Top-k: at d=128 ``torch.topk`` over every score costs about as much as the matmul itself;
  ``torch-prune`` only selects inside groups of rows whose max can still enter the top k.
* A single query is memory-bound; FAISS's sequential scan on one thread read the corpus about
  twice as fast as an sgemv (MKL or OpenBLAS) on this CPU, or more.
* Not the cause: the FAISS wheel is one dynamic-dispatch library (compile options
  ``OPTIMIZE DD AVX2 AVX512 AVX512_VPOPCNT``, ``SIMDConfig`` level ``AVX512_VPOPCNT``); the
  loader's "could not load AVX512/AVX2" lines refer to the per-ISA modules of older wheels.
  Its bundled OpenBLAS 0.3.15 predates Zen 4 and runs its AVX2 "Zen" sgemm, 60-90 GFLOP/s
  on one core here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import sys
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
    "torch_pruned_topk",
    "numpy_blocked_topk",
    "select_kernel",
    "kernel_choices",
    "clear_kernel_cache",
    "set_search_threads",
    "search_threads",
]

Kernel = Callable[[np.ndarray, np.ndarray, int], "tuple[np.ndarray, np.ndarray]"]

_THREADS_LOCK = threading.RLock()
_BLOCK_LOCK = threading.Lock()


def _check(xq: np.ndarray, xb: np.ndarray, k: int) -> None:
    assert xq.dtype == np.float32 and xb.dtype == np.float32, (xq.dtype, xb.dtype)
    assert xq.ndim == 2 and xb.ndim == 2 and xq.shape[1] == xb.shape[1], (xq.shape, xb.shape)
    assert 0 < k <= xb.shape[0], (k, xb.shape)


def faiss_knn_ip(
    xq: np.ndarray, xb: np.ndarray, k: int, database_block: int | None = None, blas_min_queries: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """FAISS exact inner-product top-``k`` (the ``IndexFlatIP`` search, without copying ``xb``).

    FAISS 1.15 takes its BLAS path only when ``nq * d >= distance_compute_blas_threshold``
    (128000 by default); below that it runs one ``fvec_inner_product`` per (query, row) pair,
    streaming the whole corpus once per query. So 256 queries get BLAS only from d = 500 up:
    at d=256 the default took 1.69 s where BLAS took 0.29 s (131k rows, one thread).
    ``blas_min_queries`` sets the threshold to ``blas_min_queries * d`` for this call (BLAS
    from that many queries on, whatever ``d``); ``database_block`` overrides
    ``distance_compute_blas_database_bs`` (1024 rows). Both are process-wide FAISS settings,
    restored afterwards.
    """
    import faiss

    _check(xq, xb, k)
    if database_block is None and blas_min_queries is None:
        return faiss.knn(xq, xb, k, metric=faiss.METRIC_INNER_PRODUCT)
    with _BLOCK_LOCK:
        block_before = faiss.cvar.distance_compute_blas_database_bs
        threshold_before = faiss.cvar.distance_compute_blas_threshold
        if database_block is not None:
            faiss.cvar.distance_compute_blas_database_bs = int(database_block)
        if blas_min_queries is not None:
            faiss.cvar.distance_compute_blas_threshold = int(blas_min_queries) * xq.shape[1]
        try:
            return faiss.knn(xq, xb, k, metric=faiss.METRIC_INNER_PRODUCT)
        finally:
            faiss.cvar.distance_compute_blas_database_bs = block_before
            faiss.cvar.distance_compute_blas_threshold = threshold_before


@contextlib.contextmanager
def _threads(n: int | None, torch_too: bool = True):
    """Run with ``n`` FAISS threads (and torch's, with ``torch_too``), then restore (both are process-wide settings).

    A FAISS kernel leaves torch alone: importing torch only to set its threads would cost a
    torch-free command (a search on given vectors) a second of start-up.
    """
    if n is None:
        yield
        return
    import faiss

    torch = None
    if torch_too:
        import torch

    with _THREADS_LOCK:
        torch_before, faiss_before = (torch.get_num_threads() if torch else None), faiss.omp_get_max_threads()
        if torch:
            torch.set_num_threads(n)
        faiss.omp_set_num_threads(n)
        try:
            yield
        finally:
            if torch:
                torch.set_num_threads(torch_before)
            faiss.omp_set_num_threads(faiss_before)


def single_threaded(kernel: Kernel, uses_torch: bool = True) -> Kernel:
    """``kernel`` run with one FAISS thread, and one torch thread when it ``uses_torch`` (no OpenMP barriers to wait on)."""

    @functools.wraps(kernel)
    def run(xq: np.ndarray, xb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        with _threads(1, torch_too=uses_torch):
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


def torch_pruned_topk(
    xq: np.ndarray, xb: np.ndarray, k: int, score_bytes: int = 4 << 20, group: int = 256
) -> tuple[np.ndarray, np.ndarray]:
    """Blocked ``torch.mm`` whose top-k selection skips groups that cannot enter the top ``k``.

    At low ``d`` the matmul is cheap and ``torch.topk`` over every score costs as much again
    (measured at d=128, one thread, 256 x 131k: 154-182 ms of matmul, 65-172 ms more of top-k). Here
    each block's scores are cut into groups of ``group`` rows and only the groups whose max
    beats the query's current k-th best score go through ``topk``; the group max is a cheap
    pass over a block that is still in cache. Exact: a skipped group holds no score above the
    k-th best so far.
    """
    import torch

    _check(xq, xb, k)
    nq, nb = len(xq), len(xb)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        corpus = torch.from_numpy(xb)
        queries = torch.from_numpy(xq)
    rows = max(group, (_block_rows(nq, nb, score_bytes) // group) * group)
    buffer = torch.empty((nq, min(rows, nb)), dtype=torch.float32)
    top_values: torch.Tensor | None = None
    top_indices: torch.Tensor | None = None
    with torch.inference_mode():
        for start in range(0, nb, rows):
            block = corpus[start : start + rows]
            scores = torch.mm(queries, block.T, out=buffer[:, : len(block)])  # (nq, rows)
            if top_values is None or len(block) % group or top_values.shape[1] < k:
                values, indices = torch.topk(scores, min(k, len(block)), dim=1)
                indices = indices + start
            else:
                n_groups = len(block) // group
                grouped = scores.view(nq, n_groups, group)
                threshold = top_values[:, -1:]  # (nq, 1), the k-th best so far
                hot = (grouped.amax(dim=2) > threshold).nonzero()  # (n_hot, 2): (query, group)
                if len(hot) == 0:
                    continue
                query_rows, group_ids = hot[:, 0], hot[:, 1]
                values, offsets = torch.topk(grouped[query_rows, group_ids], min(k, group), dim=1)  # (n_hot, kk)
                # Lay each query's hot groups side by side: (nq, max_hot * kk), padded with -inf.
                counts = torch.bincount(query_rows, minlength=nq)
                slot = torch.arange(len(hot)) - (torch.cumsum(counts, 0) - counts)[query_rows]
                width = int(counts.max()) * values.shape[1]
                padded_values = torch.full((nq, width), -torch.inf)
                padded_indices = torch.zeros((nq, width), dtype=torch.int64)
                columns = slot[:, None] * values.shape[1] + torch.arange(values.shape[1])
                padded_values[query_rows[:, None], columns] = values
                padded_indices[query_rows[:, None], columns] = offsets + (group_ids[:, None] * group + start)
                values, indices = padded_values, padded_indices
            if top_values is None:
                merged_values, merged_indices = values, indices
            else:
                merged_values, merged_indices = torch.cat([top_values, values], 1), torch.cat([top_indices, indices], 1)
            top_values, order = torch.topk(merged_values, min(k, merged_values.shape[1]), dim=1)
            top_indices = torch.gather(merged_indices, 1, order)
    assert top_values is not None and top_indices is not None
    return top_values.numpy(), top_indices.numpy().astype(np.int64, copy=False)


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
    "faiss-1t": single_threaded(faiss_knn_ip, uses_torch=False),
    # BLAS from 20 queries on at every d (FAISS's rule before 1.15), 64k-row blocks for fewer barriers.
    "faiss-blas": functools.partial(faiss_knn_ip, database_block=65536, blas_min_queries=20),
    "faiss-blas-1t": single_threaded(functools.partial(faiss_knn_ip, blas_min_queries=20), uses_torch=False),
    "torch-16m": functools.partial(torch_blocked_topk, score_bytes=16 << 20),
    "torch-64m": functools.partial(torch_blocked_topk, score_bytes=64 << 20),
    "torch-1t": single_threaded(functools.partial(torch_blocked_topk, score_bytes=16 << 20)),
    "torch-prune": torch_pruned_topk,
    "torch-prune-1t": single_threaded(torch_pruned_topk),
    "numpy": numpy_blocked_topk,
}
"""Exact kernels by name; every one returns ``(D, I)`` of shape ``(nq, k)``, D descending."""

TUNED_KERNELS = ("faiss-blas", "faiss-blas-1t", "torch-prune", "torch-prune-1t")
"""Timed by default. The others stay available to pin or to pass as ``candidates``; on the dev
machine they were never clearly faster than these: the ``faiss-blas`` pair does FAISS's work
with BLAS at every d (``faiss``, ``faiss-bs64k`` and ``faiss-1t`` skip BLAS below nq * d = 128000,
and for fewer than 20 queries they all run the same sequential scan), ``torch-prune`` does the
blocked torch work with less top-k work, and numpy's ``argpartition`` is the slowest selection."""
TUNE_ROUNDS = 5
DEFAULT_KERNEL = "faiss-blas-1t"  # tiny problems: a parallel region costs more than it saves
# Below this much work (~10 ms) timing the kernels costs more than it saves. Work counts
# nb * d * max(nq, 16): a few queries are memory-bound, so they cost about what 16 would.
_TUNE_MIN_WORK = 5e8
_TUNE_ROWS = 65536
_TUNE_WORK = 4e9
_TUNE_QUERIES = 256
_TUNE_GAP_S = 0.005

_choices: dict[tuple, dict] = {}
_choices_lock = threading.Lock()


def search_threads() -> dict[str, int]:
    """Threads the kernels use now: torch intra-op (0 while torch is not imported) and FAISS OpenMP."""
    import faiss

    torch = sys.modules.get("torch")
    return {"torch": torch.get_num_threads() if torch is not None else 0, "faiss": faiss.omp_get_max_threads()}


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


def select_kernel(xq: np.ndarray, xb: np.ndarray, k: int, candidates: tuple[str, ...] | None = None) -> str:
    """Name of the fastest kernel for this shape, measured on ``xq``/``xb`` and cached.

    Small problems (``nb * d * max(nq, 16)`` under 5e8, about 10 ms) use ``DEFAULT_KERNEL``
    untimed. Otherwise the ``candidates`` (default :data:`TUNED_KERNELS`) are warmed up on a
    slice, then timed round-robin, :data:`TUNE_ROUNDS` rounds, on the first 256 queries and
    16k-64k corpus rows (about 4e9 multiply-adds; up to 1 GB of rows for 16 queries or fewer,
    which are memory-bound and cheap); a candidate over 3x slower than the fastest in the first
    round is dropped, and the lowest median time wins. Round-robin timing shares a noisy machine's
    slow moments among the candidates. Choices are cached per power-of-two class of
    ``(d, nq, nb, k)`` and per thread setting.
    """
    nq, nb, d = len(xq), len(xb), xq.shape[1]
    names = tuple(candidates or TUNED_KERNELS)
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
    # About 4e9 multiply-adds per timed run, between 16k and 64k rows (several blocks of each kernel).
    rows = int(min(_TUNE_ROWS, max(16384, _TUNE_WORK // (len(sample_q) * d))))
    if nq <= 16:
        # Few queries are memory-bound and cheap: time them on the whole corpus up to 1 GB.
        # (A 256 MB sample misled: 2-thread FAISS took 13 ms on 87k x 768 but 167 ms on 200k.)
        rows = max(rows, (1 << 30) // (4 * d))
    sample_b = xb[: max(rows, min(nb, k))]
    kk = min(k, len(sample_b))
    start = time.perf_counter()
    warm_b = sample_b[: max(kk, len(sample_b) // 8)]
    for name in names:
        KERNELS[name](sample_q, warm_b, kk)  # warm-up: allocations, thread pools
    runs: dict[str, list[float]] = {name: [] for name in names}
    alive = list(names)
    for round_index in range(TUNE_ROUNDS):
        for name in alive:
            # Idle first, as between real searches: sleeping OpenMP workers must be woken up,
            # which on a busy machine can cost a scheduler tick (back-to-back calls hide it).
            time.sleep(_TUNE_GAP_S)
            begin = time.perf_counter()
            KERNELS[name](sample_q, sample_b, kk)
            runs[name].append(time.perf_counter() - begin)
        if round_index == 0:
            fastest = min(r[0] for r in runs.values())
            alive = [name for name in alive if runs[name][0] <= 3 * fastest]
    # The median, not the best run: a kernel whose parallel regions sometimes stall behind
    # other processes (OpenMP barriers on a busy machine) must pay for it.
    seconds = {name: float(np.median(r)) for name, r in runs.items()}
    best = min(seconds, key=seconds.__getitem__)
    record = {
        "kernel": best,
        "seconds": seconds,
        "tune_seconds": time.perf_counter() - start,
        "sample": [len(sample_q), len(sample_b), d, kk],
    }
    with _choices_lock:
        _choices[key] = record
    logger.debug(  # an internal choice: shown with embedtune -v
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
