"""Embed a BEIR dataset's corpus and queries, through the embedding cache."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from embedtune.data.beir import BeirDataset, document_text
from embedtune.encoders.cache import EmbeddingCache
from embedtune.encoders.sentence_transformer import SentenceEncoder

logger = logging.getLogger(__name__)

__all__ = ["DatasetEmbeddings", "embed_dataset"]


@dataclass
class DatasetEmbeddings:
    """Row-aligned ids and float32 embeddings of a dataset's corpus and queries."""

    doc_ids: list[str]
    doc_embeddings: np.ndarray
    query_ids: list[str]
    query_embeddings: np.ndarray
    timings: dict[str, float]
    cache_hits: dict[str, bool]

    def queries(self, ids: list[str]) -> np.ndarray:
        """Embeddings of ``ids`` in that order."""
        row = {qid: i for i, qid in enumerate(self.query_ids)}
        return np.ascontiguousarray(self.query_embeddings[[row[qid] for qid in ids]], dtype=np.float32)

    @property
    def dim(self) -> int:
        return int(self.doc_embeddings.shape[1])


def embed_dataset(encoder: SentenceEncoder, dataset: BeirDataset, cache: EmbeddingCache | None | bool = True) -> DatasetEmbeddings:
    """Encode every document and query of ``dataset`` (cached unless ``cache=False``)."""
    if cache is True:
        cache = EmbeddingCache()
    timings: dict[str, float] = {}
    hits: dict[str, bool] = {}
    results: dict[str, np.ndarray] = {}
    sources = {
        "document": ("corpus.jsonl", list(dataset.corpus), lambda: [document_text(d) for d in dataset.corpus.values()]),
        "query": ("queries.jsonl", list(dataset.queries), lambda: list(dataset.queries.values())),
    }
    for kind, (file_name, ids, texts) in sources.items():
        start = time.perf_counter()
        all_texts = texts()
        compute = lambda lo, hi, texts=all_texts, kind=kind: encoder.encode(texts[lo:hi], kind)  # noqa: E731
        if cache:
            parts = {
                "model_sha256": encoder.fingerprint,
                "data_sha256": dataset.fingerprints[file_name],
                "recipe": encoder.recipe(kind),  # type: ignore[arg-type]
            }
            results[kind], hits[kind] = cache.get_or_compute(parts, ids, compute)
        else:
            results[kind], hits[kind] = compute(0, len(ids)), False
        timings[kind] = time.perf_counter() - start
        logger.info("%s embeddings: %d rows in %.1fs (cache %s)", kind, len(ids), timings[kind], "hit" if hits[kind] else "miss")
    return DatasetEmbeddings(
        doc_ids=list(dataset.corpus),
        doc_embeddings=results["document"],
        query_ids=list(dataset.queries),
        query_embeddings=results["query"],
        timings=timings,
        cache_hits=hits,
    )
