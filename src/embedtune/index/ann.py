"""Approximate FAISS indexes from ``index_factory`` strings, scored by recall@k against exact search."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from embedtune.evaluate.search import as_rows, exact_search
from embedtune.index.codecs.faiss_codes import without_polysemous_training
from embedtune.runtime import native_chatter_filtered

logger = logging.getLogger(__name__)

__all__ = ["build_factory_index", "set_search_params", "recall_at_k", "evaluate_ann", "default_params"]


def default_params(factory: str) -> dict[str, Any]:
    """Search-time parameters worth setting for common factory strings (FAISS defaults are 1 probe)."""
    params: dict[str, Any] = {}
    if "IVF" in factory:
        params["nprobe"] = 16
    if "HNSW" in factory:
        params["efSearch"] = 64
    return params


def build_factory_index(xb: np.ndarray, factory: str, train_size: int = 100_000, seed: int = 2027):
    """``faiss.index_factory(d, factory, METRIC_INNER_PRODUCT)``, trained and filled with ``xb``.

    Training uses at most ``train_size`` rows drawn without replacement with ``seed``.
    Returns ``(index, seconds)``.
    """
    import faiss

    xb = as_rows(xb, "xb")
    start = time.perf_counter()
    index = without_polysemous_training(faiss.index_factory(xb.shape[1], factory, faiss.METRIC_INNER_PRODUCT))
    if not index.is_trained:
        rows = np.sort(np.random.default_rng(seed).choice(len(xb), min(len(xb), train_size), replace=False))
        with native_chatter_filtered():  # FAISS's "WARNING clustering" lines, unless -v
            index.train(xb[rows])
    index.add(xb)
    return index, time.perf_counter() - start


def set_search_params(index, params: dict[str, Any]) -> None:
    """Set ``nprobe``/``efSearch``/... on ``index`` (through wrappers) with FAISS ``ParameterSpace``."""
    import faiss

    space = faiss.ParameterSpace()
    for name, value in params.items():
        space.set_index_parameter(index, name, value)


def recall_at_k(I: np.ndarray, I_exact: np.ndarray, k: int = 10) -> float:
    """Mean over queries of |top-k ∩ exact top-k| / k."""
    assert I.shape[0] == I_exact.shape[0]
    hits = [len(set(a[:k].tolist()) & set(b[:k].tolist())) for a, b in zip(I, I_exact)]
    return float(np.mean(hits) / k) if hits else 0.0


def evaluate_ann(
    xb: np.ndarray,
    xq: np.ndarray,
    factory: str,
    k: int = 10,
    params: dict[str, Any] | None = None,
    I_exact: np.ndarray | None = None,
    train_size: int = 100_000,
    n_single: int = 50,
) -> dict[str, Any]:
    """Build ``factory`` over ``xb`` and report recall@k vs exact, memory, build time, latency, q/s."""
    import faiss

    xb, xq = as_rows(xb, "xb"), as_rows(xq, "xq")
    if I_exact is None:
        _, I_exact = exact_search(xq, xb, k)
    index, build_seconds = build_factory_index(xb, factory, train_size)
    params = default_params(factory) if params is None else params
    set_search_params(index, params)
    index.search(xq[:1], k)  # warm-up
    latencies = []
    for row in range(min(n_single, len(xq))):
        start = time.perf_counter()
        index.search(xq[row : row + 1], k)
        latencies.append(time.perf_counter() - start)
    start = time.perf_counter()
    _, I = index.search(xq, k)
    batch_seconds = time.perf_counter() - start
    return {
        "factory": factory,
        "params": params,
        "n": int(len(xb)),
        "d": int(xb.shape[1]),
        "memory_bytes": int(faiss.serialize_index(index).nbytes),
        "build_s": build_seconds,
        "latency_p50_ms": float(np.percentile(latencies, 50) * 1e3),
        "latency_p95_ms": float(np.percentile(latencies, 95) * 1e3),
        "throughput_qps": len(xq) / batch_seconds,
        f"recall@{k}": recall_at_k(I, I_exact, k),
    }
