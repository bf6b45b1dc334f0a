"""Retrieval efficiency at full vs compressed dimensions (DIVE paper §4.9, Figure 8).

``embedtune benchmark index`` measures exact flat inner-product search at full ``d`` and at
compressed dims (256, 128, 64): index memory, build time, single-query latency (p50/p95 over
many timed searches, after warm-up) and batched throughput (256 queries per search), for FAISS
``IndexFlatIP`` and for embedtune's :func:`~embedtune.evaluate.search.exact_search` side by side.
Every dim and engine is timed in the same run, interleaved round by round, so the ratios
against full ``d`` share the machine's noise. An exact flat index costs the same whatever the
vectors contain, so synthetic vectors measure it as well as real ones.

Also here: approximate ``index_factory`` indexes with recall@10 against exact search, the
quantisation-stacking table (bytes per vector and nDCG@10 of int8/binary on top of a
compressor), and the streaming-apply throughput against a bare numpy matmul.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import platform
import subprocess
import sys
import time
from typing import Any

import faiss
import numpy as np
import torch

from embedtune.compress import TrainingData, load_compressor, make_compressor
from embedtune.compress.streaming import embedding_file_shape, iter_embedding_blocks
from embedtune.evaluate.kernels import kernel_choices, search_threads
from embedtune.evaluate.metrics import evaluate_run
from embedtune.evaluate.search import exact_search, run_from_topk
from embedtune.index import codecs
from embedtune.index.ann import evaluate_ann
from embedtune.workflows.experiment import load_experiment

logger = logging.getLogger(__name__)

__all__ = [
    "PAPER_REFERENCE",
    "CONTENT_NOTE",
    "synthetic_vectors",
    "flat_search_benchmark",
    "corpus_cases",
    "synthetic_cases",
    "run_index_benchmark",
    "ann_benchmark",
    "quantization_table",
    "streaming_benchmark",
    "machine_info",
    "format_table",
]

PAPER_REFERENCE = (
    "DIVE paper §4.9 (A100, GpuIndexFlatIP, Quora 523k, 4096-d frozen vs 256/128-d DIVE): "
    "16x/32x less memory, 2.96x/3.31x lower single-query latency, 7.50x/9.51x higher batched throughput."
)
CONTENT_NOTE = "An exact flat index scores every vector, so its cost depends only on n and d, never on what the vectors contain."


def machine_info() -> dict[str, Any]:
    """CPU, thread settings and library versions, to print beside every figure."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        simd = faiss.SIMDConfig.get_level_name()
    except AttributeError:  # older FAISS: no dynamic dispatch
        simd = None
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "threads": search_threads(),
        "faiss": faiss.__version__,
        "faiss_compile_options": faiss.get_compile_options().strip(),
        "faiss_simd_level": simd,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


# -- data ------------------------------------------------------------------------------------
def synthetic_vectors(n: int, d: int, seed: int = 2027, block: int = 65536) -> np.ndarray:
    """``(n, d)`` float32 unit rows drawn from a standard normal, generated block by block."""
    rng = np.random.default_rng(seed)
    xb = np.empty((n, d), dtype=np.float32)
    for start in range(0, n, block):
        part = rng.standard_normal((min(block, n - start), d), dtype=np.float32)
        part /= np.linalg.norm(part, axis=1, keepdims=True)
        xb[start : start + len(part)] = part
    return xb


def synthetic_cases(n: int, dims: list[int], n_queries: int = 1024, seed: int = 2027):
    """Yield ``(label, d, xb, xq)`` for synthetic corpora, one dim at a time."""
    for d in dims:
        yield f"synthetic-{n}", d, synthetic_vectors(n, d, seed + d), synthetic_vectors(n_queries, d, seed + 10_000 + d)


def corpus_cases(data: str, model: str, dims: list[int], compressor: str = "pca"):
    """Yield ``(label, d, xb, xq)`` for a BEIR corpus at full ``d`` and at each smaller dim.

    The smaller dims come from ``compressor`` (default PCA) fitted on the corpus: the cost of a
    flat index does not depend on which compressor made the vectors.
    """
    experiment = load_experiment(data=data, model=model, split_seed=None)
    emb = experiment.embeddings
    xb = np.ascontiguousarray(emb.doc_embeddings, dtype=np.float32)
    xq = np.ascontiguousarray(emb.query_embeddings, dtype=np.float32)
    full = xb.shape[1]
    label = f"{experiment.dataset.name}/{model}"
    yield label, full, xb, xq
    train = TrainingData(emb.query_ids[:1], xq[:1], emb.doc_ids, xb, {})
    for d in dims:
        if d >= full:
            continue
        fitted = make_compressor(compressor, dim=d).fit(train)
        yield label, d, fitted.transform(xb), fitted.transform(xq)


# -- exact flat search -----------------------------------------------------------------------
def _faiss_flat(xb: np.ndarray):

    start = time.perf_counter()
    index = faiss.IndexFlatIP(xb.shape[1])
    index.add(xb)
    return index, time.perf_counter() - start


def _stored_vectors(index) -> np.ndarray:
    """The float32 rows inside a FAISS flat index, as a numpy view (no copy)."""

    return faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d)


def flat_search_benchmark(
    cases,
    k: int = 10,
    batch: int = 256,
    rounds: int = 5,
    singles: int = 20,
    warmup: int = 3,
    engines: tuple[str, ...] = ("faiss", "embedtune"),
) -> list[dict[str, Any]]:
    """Time exact flat search for every ``(label, d, xb, xq)`` case and engine, interleaved.

    Per case and engine: ``memory_bytes`` (the float32 vectors held), ``build_s`` (FAISS:
    ``IndexFlatIP`` + ``add``; embedtune: copying the float32 matrix, as it needs no index),
    single-query ``latency_p50_ms``/``latency_p95_ms`` over ``rounds * singles`` searches of
    distinct queries after ``warmup`` ones, and ``throughput_qps`` = ``batch`` / median time of
    one batched search (one per round). embedtune's first searches also pick its kernels; that
    time is ``tune_s``. Within a round the engines alternate order, and every case runs in
    every round, so slow drifts of the machine hit all of them alike.
    """
    states = []
    for label, d, xb, xq in cases:
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if len(xq) < batch:
            xq = np.tile(xq, (batch // len(xq) + 1, 1))
        index, faiss_build = _faiss_flat(np.ascontiguousarray(xb, dtype=np.float32))
        del xb  # keep one copy of each corpus: FAISS's, shared with embedtune as a view
        gc.collect()
        vectors = _stored_vectors(index)
        start = time.perf_counter()
        copy = np.array(vectors, dtype=np.float32, copy=True)
        copy_seconds = time.perf_counter() - start
        del copy
        states.append({"label": label, "d": d, "n": index.ntotal, "index": index, "xb": vectors, "xq": xq,
                       "build": {"faiss": faiss_build, "embedtune": copy_seconds}, "single": {e: [] for e in engines},
                       "batch": {e: [] for e in engines}, "tune": 0.0, "kernels": {}})
        logger.info("bench: %s d=%d n=%d built (FAISS %.2fs)", label, d, index.ntotal, faiss_build)

    def search(engine: str, state: dict, queries: np.ndarray):
        if engine == "faiss":
            return state["index"].search(queries, k)
        return exact_search(queries, state["xb"], k)

    for state in states:  # warm-up, and embedtune's kernel choice for both shapes
        for engine in engines:
            start = time.perf_counter()
            for row in range(warmup):
                search(engine, state, state["xq"][row : row + 1])
            search(engine, state, state["xq"][:batch])
            if engine == "embedtune":
                state["tune"] = time.perf_counter() - start
        if "embedtune" in engines:
            state["kernels"] = {
                str(c["nq_class"]): c["kernel"] for c in kernel_choices() if c["d"] == state["d"] and c["nb_class"] >= state["n"] > c["nb_class"] // 2
            }
        if "faiss" in engines and "embedtune" in engines:
            _, I_faiss = state["index"].search(state["xq"][:batch], k)
            _, I_ours = exact_search(state["xq"][:batch], state["xb"], k)
            state["agree"] = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(I_faiss, I_ours)]))

    cursor = warmup
    for round_index in range(rounds):
        order = engines if round_index % 2 == 0 else tuple(reversed(engines))
        for state in states:
            for engine in order:
                n_q = len(state["xq"])
                for i in range(singles):
                    row = (cursor + i) % n_q
                    query = state["xq"][row : row + 1]
                    start = time.perf_counter()
                    search(engine, state, query)
                    state["single"][engine].append(time.perf_counter() - start)
                start = time.perf_counter()
                search(engine, state, state["xq"][:batch])
                state["batch"][engine].append(time.perf_counter() - start)
        cursor += singles
        logger.info("bench: round %d/%d done", round_index + 1, rounds)

    rows = []
    for state in states:
        for engine in engines:
            single = np.asarray(state["single"][engine])
            batch_times = np.asarray(state["batch"][engine])
            rows.append({
                "corpus": state["label"],
                "n": int(state["n"]),
                "d": int(state["d"]),
                "engine": "faiss IndexFlatIP" if engine == "faiss" else "embedtune exact_search",
                "memory_bytes": int(state["n"]) * int(state["d"]) * 4,
                "build_s": state["build"][engine],
                "latency_p50_ms": float(np.percentile(single, 50) * 1e3),
                "latency_p95_ms": float(np.percentile(single, 95) * 1e3),
                "throughput_qps": float(batch / np.median(batch_times)),
                "n_single": int(len(single)),
                "n_batch": int(len(batch_times)),
                **({"tune_s": state["tune"], "kernels": state["kernels"]} if engine == "embedtune" else {}),
                **({"agree@k_with_faiss": state.get("agree")} if engine == "embedtune" and "agree" in state else {}),
            })
    return add_ratios(rows)


def add_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ratios against the largest ``d`` of the same corpus and engine (higher is better), and bytes per vector."""
    for row in rows:
        _with_bytes(row)
        peers = [r for r in rows if r["corpus"] == row["corpus"] and r["engine"] == row["engine"]]
        full = max(peers, key=lambda r: r["d"])
        row["dim_ratio"] = full["d"] / row["d"]
        row["memory_ratio"] = full["memory_bytes"] / row["memory_bytes"]
        row["latency_ratio"] = full["latency_p50_ms"] / row["latency_p50_ms"]
        row["throughput_ratio"] = row["throughput_qps"] / full["throughput_qps"]
    return rows


def run_index_benchmark(
    datasets: list[str] = (),  # type: ignore[assignment]
    model: str = "minilm",
    synthetic: list[int] = (),  # type: ignore[assignment]
    synthetic_dim: int = 768,
    dims: list[int] = (256, 128, 64),  # type: ignore[assignment]
    k: int = 10,
    batch: int = 256,
    rounds: int = 5,
    singles: int = 20,
    engines: tuple[str, ...] = ("faiss", "embedtune"),
    ann: list[str] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """The whole ``benchmark index`` run: real corpora, then each synthetic size, each in one timed group."""
    result: dict[str, Any] = {"machine": machine_info(), "note": CONTENT_NOTE, "paper": PAPER_REFERENCE, "flat": [], "ann": []}
    for data in datasets:
        cases = list(corpus_cases(data, model, list(dims)))
        result["flat"] += flat_search_benchmark(cases, k, batch, rounds, singles, engines=engines)
        for factory in ann:
            label, d, xb, xq = cases[0]
            result["ann"].append(_with_bytes({"corpus": label, **ann_benchmark(xb, xq, factory, k)}))
        del cases
        gc.collect()
    for n in synthetic:
        all_dims = [synthetic_dim] + [d for d in dims if d < synthetic_dim]
        result["flat"] += flat_search_benchmark(synthetic_cases(n, all_dims), k, batch, rounds, singles, engines=engines)
        gc.collect()
        for factory in ann:
            _, d, xb, xq = next(synthetic_cases(n, [min(dims)]))
            result["ann"].append(_with_bytes({"corpus": f"synthetic-{n}", **ann_benchmark(xb, xq[:batch], factory, k)}))
            del xb
            gc.collect()
    result["kernel_choices"] = kernel_choices()
    return result


def _with_bytes(row: dict[str, Any]) -> dict[str, Any]:
    """``bytes_per_vector`` of an index row: its memory over its vectors (codes plus the index's share of fixed state)."""
    if "memory_bytes" in row and row.get("n"):
        row["bytes_per_vector"] = row["memory_bytes"] / row["n"]
    return row


def ann_benchmark(xb: np.ndarray, xq: np.ndarray, factory: str, k: int = 10) -> dict[str, Any]:
    """:func:`embedtune.index.ann.evaluate_ann` with an nlist that fits the corpus size."""
    n = len(xb)
    if factory.startswith("IVF"):
        nlist = int(factory[3:].split(",")[0])
        if nlist * 39 > n:  # FAISS wants >= 39 training points per list
            fitted = max(1, n // 39)
            factory = f"IVF{fitted}," + factory.split(",", 1)[1]
    return evaluate_ann(xb, xq, factory, k)


# -- quantisation stacking -------------------------------------------------------------------
def quantization_table(experiment, compressor=None, part: str = "test", top_k: int = 100, candidates: int = 100) -> list[dict[str, Any]]:
    """Bytes per vector and nDCG@10/Recall@10 of int8 and binary stacked on the frozen and compressed vectors.

    ``compressor`` is a fitted compressor (e.g. DIVE at 128 dims); ``part`` the held-out
    queries. Rows: float32, FAISS SQ8, sentence-transformers int8, binary (Hamming), binary
    with asymmetric rescoring of the top ``candidates``, binary with float32 rescoring (the
    float vectors then stay on disk; ``disk_bytes_per_vector`` counts them).
    """
    ids = experiment.part_ids(part)
    qrels = experiment.qrels_for(ids)
    ids = [qid for qid in ids if qrels.get(qid)]
    doc_ids = experiment.embeddings.doc_ids
    frozen_q = experiment.embeddings.queries(ids)
    frozen_b = np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32)
    spaces = [("frozen", frozen_q, frozen_b)]
    if compressor is not None:
        spaces.append((f"{compressor.method}-{compressor.output_dim}", compressor.transform(frozen_q), compressor.transform(frozen_b)))
    fetch = top_k + 1  # one extra: identical query/doc ids are dropped, as BEIR does

    def score(D, I) -> dict[str, float]:
        metrics = evaluate_run(qrels, run_from_topk(ids, D, I, doc_ids, top_k, True))
        return {"ndcg@10": metrics["ndcg@10"], "recall@10": metrics["recall@10"], "n_queries": metrics.n_queries}

    rows = []
    for name, xq, xb in spaces:
        d = xb.shape[1]
        start = time.perf_counter()
        rows.append({"vectors": name, "d": d, "quantization": "float32", "bytes_per_vector": 4 * d, **score(*exact_search(xq, xb, fetch))})
        sq8 = codecs.sq8_index(d, xb=xb)
        sq8.add(xb)
        rows.append({"vectors": name, "d": d, "quantization": "int8 (FAISS SQ8)", "bytes_per_vector": d, **score(*codecs.sq8_search(sq8, xq, fetch))})
        ranges = codecs.int8_ranges(xb)
        rows.append({"vectors": name, "d": d, "quantization": "int8 (s-t quantize_embeddings)", "bytes_per_vector": d,
                     **score(*codecs.int8_search(codecs.int8_quantize(xq, ranges), codecs.int8_quantize(xb, ranges), fetch))})
        binary = codecs.binary_index(codecs.binary_codes(xb))
        nbytes = codecs.bytes_per_vector("binary", d)
        rows.append({"vectors": name, "d": d, "quantization": "binary (Hamming)", "bytes_per_vector": nbytes,
                     **score(*codecs.binary_search(binary, xq, fetch))})
        rows.append({"vectors": name, "d": d, "quantization": f"binary + asym rescore top {candidates}", "bytes_per_vector": nbytes,
                     **score(*codecs.binary_search(binary, xq, fetch, "asym", candidates=max(candidates, fetch)))})
        rows.append({"vectors": name, "d": d, "quantization": f"binary + float32 rescore top {candidates}", "bytes_per_vector": nbytes,
                     "disk_bytes_per_vector": 4 * d,
                     **score(*codecs.binary_search(binary, xq, fetch, "float", xb, candidates=max(candidates, fetch)))})
        logger.info("quantization_table: %s done in %.1fs", name, time.perf_counter() - start)
    return rows


# -- streaming apply -------------------------------------------------------------------------
_RSS_SCRIPT = r"""
import json, resource, sys, time
import numpy as np
from embedtune.compress import load_compressor
from embedtune.compress.streaming import apply_compressor_streaming

def status(key):
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith(key))

compressor = load_compressor(sys.argv[1])
compressor.transform(np.zeros((64, compressor.input_dim_), np.float32))  # load BLAS/torch before the baseline
before = status("VmRSS:")
start = time.perf_counter()
apply_compressor_streaming(compressor, sys.argv[2], sys.argv[3], int(sys.argv[4]))
seconds = time.perf_counter() - start
print(json.dumps({"rss_before": before, "peak_rss": status("VmHWM:"), "seconds": seconds}))
"""


def measure_apply_rss(adapter_dir: str, input_path: str, output_path: str, chunk_size: int) -> dict[str, Any]:
    """Run the streaming apply in a fresh subprocess; its RSS before and peak (VmHWM), and seconds."""
    completed = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(adapter_dir), str(input_path), str(output_path), str(chunk_size)],
                               check=True, capture_output=True, text=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def streaming_benchmark(adapter_dir: str, input_path: str, output_path: str, chunk_size: int = 65536, repeats: int = 1) -> dict[str, Any]:
    """Streaming apply (subprocess, peak RSS) against a bare numpy matmul of the same shapes.

    Order: a read-only pass over the file (block reader, a column sum per block; this also puts the file in
    the page cache), then ``repeats`` rounds of the bare baseline (each block from a memory map
    times a random ``(d, k)`` float32 matrix: the arithmetic floor of a linear compressor, no
    output written) followed by the real apply in a fresh subprocess. Alternating the two lets
    them share the machine's drifts; the figures are medians over the rounds (every round is
    kept). Both compute figures read from the page cache; the read-only pass shows what the
    reading alone costs.
    """
    compressor = load_compressor(adapter_dir)
    n, d = embedding_file_shape(input_path)
    start = time.perf_counter()
    for _, _, block in iter_embedding_blocks(input_path, chunk_size, reuse_buffer=True):
        block.sum(axis=0)  # touch every value: a mapped block costs nothing until it is read
    read_seconds = time.perf_counter() - start
    weights = np.random.default_rng(0).standard_normal((d, compressor.output_dim), dtype=np.float32)
    bares, applies = [], []
    for _ in range(max(1, repeats)):
        xb = np.load(input_path, mmap_mode="r")
        itemsize = xb.dtype.itemsize
        start = time.perf_counter()
        for lo in range(0, n, chunk_size):
            np.ascontiguousarray(xb[lo : lo + chunk_size], dtype=np.float32) @ weights
        bares.append(time.perf_counter() - start)
        del xb
        applies.append(measure_apply_rss(adapter_dir, input_path, output_path, chunk_size))
    bare = float(np.median(bares))
    apply_seconds = float(np.median([a["seconds"] for a in applies]))
    peak = max(a["peak_rss"] for a in applies)
    before = min(a["rss_before"] for a in applies)
    return {
        "n": n, "d": d, "k": compressor.output_dim, "method": compressor.method, "chunk_size": chunk_size,
        "input_bytes": n * d * itemsize,
        "read_only_s": read_seconds, "read_only_vectors_per_s": n / read_seconds,
        "apply_s": apply_seconds, "apply_vectors_per_s": n / apply_seconds,
        "bare_matmul_s": bare, "bare_matmul_vectors_per_s": n / bare,
        "apply_vs_bare": bare / apply_seconds,
        "repeats": len(bares), "bare_matmul_runs_s": bares, "apply_runs_s": [a["seconds"] for a in applies],
        "rss_before_bytes": before, "peak_rss_bytes": peak,
        "peak_rss_increase_bytes": max(a["peak_rss"] - a["rss_before"] for a in applies),
    }


# -- output ----------------------------------------------------------------------------------
def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain-text table (floats to 3 significant decimals)."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    widths = {c: max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in columns} if rows else {c: len(c) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns), "  ".join("-" * widths[c] for c in columns)]
    lines += ["  ".join(cell(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


FLAT_COLUMNS = ["corpus", "n", "d", "engine", "bytes_per_vector", "memory_bytes", "build_s", "latency_p50_ms", "latency_p95_ms", "throughput_qps",
                "memory_ratio", "latency_ratio", "throughput_ratio"]
ANN_COLUMNS = ["corpus", "factory", "params", "n", "d", "bytes_per_vector", "memory_bytes", "build_s", "latency_p50_ms", "throughput_qps", "recall@10"]
QUANT_COLUMNS = ["vectors", "d", "quantization", "bytes_per_vector", "ndcg@10", "recall@10", "n_queries"]
