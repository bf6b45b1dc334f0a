"""Embed a BEIR dataset's corpus and queries, through the embedding cache."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embedtune.data.beir import BeirDataset, document_text
from embedtune.encoders.cache import EmbeddingCache
from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.runtime import progress_bar

logger = logging.getLogger(__name__)

_PLURAL = {"document": "documents", "query": "queries"}  # progress-bar labels

__all__ = ["DatasetEmbeddings", "embed_dataset", "encoder_description", "cache_parts"]

_SOURCE_FILES = {"document": "corpus.jsonl", "query": "queries.jsonl"}


def cache_parts(encoder: SentenceEncoder, dataset: BeirDataset, kind: str) -> dict[str, Any]:
    """The embedding-cache key parts of ``dataset``'s documents or queries encoded by ``encoder``."""
    return {
        "model_sha256": encoder.fingerprint,
        "data_sha256": dataset.fingerprints[_SOURCE_FILES[kind]],
        "recipe": encoder.recipe(kind),  # type: ignore[arg-type]
    }


@dataclass
class DatasetEmbeddings:
    """Row-aligned ids and float32 embeddings of a dataset's corpus and queries.

    ``model`` describes the encoder (name, path, sha256 fingerprint, max sequence length,
    normalisation, prompts) when :func:`embed_dataset` made them; results files record it.
    """

    doc_ids: list[str]
    doc_embeddings: np.ndarray
    query_ids: list[str]
    query_embeddings: np.ndarray
    timings: dict[str, float]
    cache_hits: dict[str, bool]
    model: dict[str, Any] = field(default_factory=dict)

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
        "document": (list(dataset.corpus), lambda: [document_text(d) for d in dataset.corpus.values()]),
        "query": (list(dataset.queries), lambda: list(dataset.queries.values())),
    }
    for kind, (ids, texts) in sources.items():
        start = time.perf_counter()
        all_texts = texts()
        # One bar over the whole corpus, across cache shards: created on the first shard that has
        # to be encoded (a cache hit draws none), starting at the rows resumed from earlier shards.
        bars: list = []

        def compute(lo: int, hi: int, texts: list[str] = all_texts, kind: str = kind, total: int = len(ids)) -> np.ndarray:
            if not bars:
                bars.append(progress_bar(total, f"encoding {dataset.name} {_PLURAL[kind]}", unit="doc" if kind == "document" else "query",
                                         initial=lo, enabled=encoder.show_progress))
            bar = bars[0]
            if lo > bar.n:  # a shard resumed from an interrupted run
                bar.update(lo - bar.n)
            return encoder.encode(texts[lo:hi], kind, progress=bar.update)  # type: ignore[arg-type]

        try:
            if cache:
                results[kind], hits[kind] = cache.get_or_compute(cache_parts(encoder, dataset, kind), ids, compute)  # type: ignore[arg-type]
            else:
                results[kind], hits[kind] = compute(0, len(ids)), False
        finally:
            for bar in bars:
                bar.close()
        timings[kind] = time.perf_counter() - start
        logger.debug("%s embeddings: %d rows in %.1fs (cache %s)", kind, len(ids), timings[kind], "hit" if hits[kind] else "miss")
    return DatasetEmbeddings(
        doc_ids=list(dataset.corpus),
        doc_embeddings=results["document"],
        query_ids=list(dataset.queries),
        query_embeddings=results["query"],
        timings=timings,
        cache_hits=hits,
        model=encoder_description(encoder),
    )


def encoder_description(encoder: SentenceEncoder) -> dict[str, Any]:
    """What made a set of embeddings: the model's name, folder and file hash, and the text recipe."""
    return {
        "name": encoder.model_name,
        "path": str(encoder.model_path),
        "fingerprint": encoder.fingerprint,
        "max_seq_length": encoder.max_seq_length,
        "normalize": encoder.normalize,
        "query_prompt": encoder.query_prompt,
        "document_prompt": encoder.document_prompt,
        # Only when not torch, so descriptions of torch runs read as before.
        **({"backend": encoder.backend} if encoder.backend != "torch" else {}),
    }
