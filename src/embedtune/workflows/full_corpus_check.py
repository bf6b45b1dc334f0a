"""Check a label-free plan fitted on a sample against the whole corpus it will index.

A label-free plan on a large corpus runs on a seeded sample of its rows
(:func:`~embedtune.workflows.label_free.plan_sample`). Agreement@10 (the share of the exact
float32 top-10 a setting finds in its own top-10) falls as the corpus grows: a larger corpus is
denser, so the same codes must separate more near neighbours. The sample's figure is then a
promise the full index may not keep (a tiled 1M-row corpus: 0.958 on a 16k sample, 0.715 on every
row; ``benchmarks/results/scale/REPORT.md``).

:func:`full_corpus_agreement` measures the chosen setting as ``index build --plan`` serves it: the
plan's compressor and trained codec tables (nothing refitted), every corpus row encoded in blocks,
searched with the plan's own validation queries, against their exact float32 top-10 over every
row (:func:`~embedtune.evaluate.streamed_top_k.exact_top_k`, streamed over the corpus).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.evaluate.streamed_top_k import exact_top_k
from embedtune.index.codecs import QuantizedIndex, read_codec_index
from embedtune.index.codecs.row_encoding import add_encoded
from embedtune.index.plan_format import PLAN_FILE, load_plan
from embedtune.index.refine import RefinedIndex, plan_refine
from embedtune.io import release_mapped_pages
from embedtune.workflows.experiment import Experiment

__all__ = ["full_corpus_agreement", "CHECK_BLOCK"]

logger = logging.getLogger(__name__)

#: Corpus rows transformed and encoded at a time: memory for the check's floats stays at this many rows.
CHECK_BLOCK = 65536


def _block(compressor: Any, docs: np.ndarray, lo: int, block: int) -> np.ndarray:
    """Rows ``lo .. lo + block`` of ``docs`` (a memory map is read here), through the plan's compressor, as float32 rows."""
    rows = np.ascontiguousarray(docs[lo: lo + block], dtype=np.float32)
    release_mapped_pages(docs)  # a memory-mapped corpus: only this block is held, never the whole file
    return np.ascontiguousarray(compressor.transform(rows), dtype=np.float32)


def _planned_index(directory: Path, docs: np.ndarray, block: int) -> tuple[Any, Any, dict[str, Any]]:
    """The plan's index over every row of ``docs``, encoded ``block`` rows at a time with the plan's trained tables."""
    plan, compressor, precision, calibration = load_plan(directory)
    dim = int(plan["dim"])
    trained = None
    if precision.precision_codec.faiss_backed and (directory / precision.precision_codec.tables_file).is_file():
        trained = read_codec_index(directory, precision, dim)
    index = None
    if (trained is not None or calibration is not None or precision.precision_codec.fits_nothing) and not precision.rescores_float:
        # Nothing left to fit (the plan's trained tables, int8 ranges, or float16): encode block by block into one FAISS
        # index, as `index build --plan` does, so no copy of the compressed floats is held.
        index = QuantizedIndex.build(_block(compressor, docs, 0, block), precision, calibration=calibration, trained_index=trained)
        if index.codes is None and index.float_vectors is None:
            for lo in range(block, len(docs), block):
                add_encoded(index.backend, _block(compressor, docs, lo, block))  # the codes QuantizedIndex.build writes
            index.ntotal = len(docs)
        else:
            index = None
    if index is None:
        if trained is not None:  # the first try added its first block to the plan's tables: read them again
            trained = read_codec_index(directory, precision, dim)
        xb = np.concatenate([_block(compressor, docs, lo, block) for lo in range(0, len(docs), block)])
        index = QuantizedIndex.build(xb, precision, calibration=calibration, trained_index=trained)
    refine = plan_refine(plan, str(directory / PLAN_FILE))
    if refine is not None:  # as `index build --plan` serves it: the codes' candidates, ranked by the original vectors
        index = RefinedIndex(index, compressor.normalize_input(np.ascontiguousarray(docs, dtype=np.float32)), refine, compressor)
    return index, compressor, plan


def full_corpus_agreement(experiment: Experiment, directory: str | Path, queries: np.ndarray, held_out: Sequence[str] = (),
                          k: int = 10, block: int = CHECK_BLOCK, truth: dict[str, Any] | None = None) -> dict[str, Any]:
    """Agreement@``k`` of plan ``directory``'s choice over every document of ``experiment`` (the whole corpus).

    ``queries`` are the plan's validation queries: its held-out documents' vectors (``held_out`` their
    ids, each then excluded from its own results and targets), or the user's unlabelled queries
    (``held_out`` empty). ``truth``: a dict kept between calls on the same corpus and queries (a plan that measures
    several settings), which holds their exact top-``k`` after the first. Returns what ``plan.json`` records under ``full_corpus``: the agreement,
    the figure on the plan's sample, the numbers of queries and documents, and the seconds each part took.

    Raises:
        ValueError: ``held_out`` does not match the queries, or names a document that is not in the corpus.
    """
    directory = Path(directory)
    doc_ids = list(experiment.embeddings.doc_ids)
    docs = experiment.embeddings.doc_embeddings  # may be a memory map: read a block at a time
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    exclude = None
    if len(held_out):
        if len(held_out) != len(queries):
            raise ValueError(f"{len(held_out)} held-out document ids for {len(queries)} query vectors: one id per query.")
        position = {doc_id: row for row, doc_id in enumerate(doc_ids)}
        missing = [d for d in held_out if d not in position]
        if missing:
            raise ValueError(f"{len(missing)} held-out documents of the plan are not in the corpus, e.g. {missing[0]!r}.")
        exclude = np.array([position[d] for d in held_out], dtype=np.int64)
    logger.info("full-corpus check: exact top-%d of %d queries over %d documents", k, len(queries), len(doc_ids))
    kept = truth if truth is not None else {}
    if kept.get("k") != k or "top_k" not in kept:
        start = time.perf_counter()
        kept.update(top_k=exact_top_k(queries, docs, k, exclude), k=k, seconds=time.perf_counter() - start)
    target_rows, truth_s = kept["top_k"], kept["seconds"]
    start = time.perf_counter()
    index, compressor, plan = _planned_index(directory, docs, block)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    wanted = k + (exclude is not None)
    if isinstance(index, RefinedIndex):
        _, found = index.search(queries, wanted)
    else:
        _, found = index.search(np.ascontiguousarray(compressor.transform(queries), dtype=np.float32), wanted)
    search_s = time.perf_counter() - start
    shares = []
    for row, (result, target) in enumerate(zip(found, target_rows)):
        own = -1 if exclude is None else exclude[row]
        top = [r for r in result.tolist() if r != own and r >= 0][:k]
        shares.append(len(set(top) & set(target.tolist())) / k)
    agreement = float(np.mean(shares))
    logger.info("full-corpus check: agreement@%d %.4f over %d documents (%.4f on the plan's sample)", k, agreement,
                len(doc_ids), plan["chosen"]["objective"])
    return {"setting": plan["chosen"]["setting"], "k": k, "agreement": agreement, "on_sample": float(plan["chosen"]["objective"]),
            "n_queries": len(queries), "n_documents": len(doc_ids), "truth_s": round(truth_s, 3), "build_s": round(build_s, 3),
            "search_s": round(search_s, 3)}
