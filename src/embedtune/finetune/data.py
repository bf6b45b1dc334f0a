"""PACE training tuples ``(query, positive, negative_1..K)`` from BEIR train qrels.

Hard negatives are mined once with the frozen model, reusing :func:`embedtune.data.triplets.mine_triplets`
(``K`` negatives per (query, positive) pair from the frozen model's top ``hard_pool`` non-relevant
documents), so every recipe and baseline trains on the same tuples.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.data.beir import BeirDataset, document_text
from embedtune.data.triplets import mine_triplets
from embedtune.encoders.dataset import embed_dataset
from embedtune.io import atomic_write_json

logger = logging.getLogger(__name__)

__all__ = ["TrainingTuples", "mine_training_tuples", "negative_columns"]


def negative_columns(n_negatives: int) -> list[str]:
    return [f"negative_{k}" for k in range(1, n_negatives + 1)]


@dataclass
class TrainingTuples:
    """Row-aligned ids of the training tuples, and their texts on demand.

    Attributes:
        query_ids: one per tuple.
        positive_ids: one per tuple.
        negative_ids: one list of ``n_negatives`` doc ids per tuple.
        meta: how they were mined.
    """

    query_ids: list[str]
    positive_ids: list[str]
    negative_ids: list[list[str]]
    meta: dict[str, Any]

    def __len__(self) -> int:
        return len(self.query_ids)

    @property
    def n_negatives(self) -> int:
        return len(self.negative_ids[0]) if self.negative_ids else 0

    def columns(self, dataset: BeirDataset) -> dict[str, list[str]]:
        """Text columns ``anchor``, ``positive``, ``negative_1``..``negative_K``, in this order."""
        doc = lambda doc_id: document_text(dataset.corpus[doc_id])  # noqa: E731
        columns = {"anchor": [dataset.queries[qid] for qid in self.query_ids], "positive": [doc(pid) for pid in self.positive_ids]}
        for k, name in enumerate(negative_columns(self.n_negatives)):
            columns[name] = [doc(negatives[k]) for negatives in self.negative_ids]
        return columns

    def to_dataset(self, dataset: BeirDataset):
        """A :class:`datasets.Dataset` with the columns the s-t trainer feeds to the loss."""
        from datasets import Dataset

        return Dataset.from_dict(self.columns(dataset))

    def save(self, path: str | Path) -> Path:
        rows = [[q, p, n] for q, p, n in zip(self.query_ids, self.positive_ids, self.negative_ids)]
        return atomic_write_json(path, {"format": "embedtune.pace_tuples", "version": 1, "meta": self.meta, "tuples": rows})


def mine_training_tuples(
    dataset: BeirDataset,
    encoder,
    query_ids: list[str] | None = None,
    n_negatives: int = 5,
    hard_pool: int = 50,
    seed: int = 2027,
    cache: bool = True,
    *,
    false_negative_margin: float | None = None,
    false_negative_reference: str = "pair",
) -> TrainingTuples:
    """Mine ``n_negatives`` hard negatives per (query, positive) pair with a frozen encoder.

    Args:
        dataset: the BEIR dataset with its train qrels loaded.
        encoder: a :class:`embedtune.encoders.SentenceEncoder` (the frozen model, normalised output).
        query_ids: the training queries; default every judged query of ``dataset``.
        n_negatives: ``K`` (paper: 5).
        hard_pool: the frozen model's top-N non-relevant documents to draw from.
        seed: mining seed.
        cache: use the embedding cache (the frozen corpus embeddings are shared with evaluation).
        false_negative_margin, false_negative_reference: drop candidates that score within the
            margin of the positive (see :func:`embedtune.data.triplets.mine_triplets`): likely
            unjudged positives, which hard mining would otherwise push away.

    Pairs whose pool holds fewer than ``n_negatives`` documents are skipped (logged).
    """
    start = time.perf_counter()
    query_ids = list(query_ids) if query_ids is not None else dataset.judged_query_ids()
    embeddings = embed_dataset(encoder, dataset, cache=cache)
    query_vectors = embeddings.queries(query_ids)
    rows = mine_triplets(
        query_ids,
        query_vectors,
        embeddings.doc_ids,
        np.ascontiguousarray(embeddings.doc_embeddings, dtype=np.float32),
        {qid: dataset.qrels[qid] for qid in query_ids if qid in dataset.qrels},
        n_negatives=n_negatives,
        negatives="hard",
        hard_pool=hard_pool,
        seed=seed,
        false_negative_margin=false_negative_margin,
        false_negative_reference=false_negative_reference,  # type: ignore[arg-type]
    )
    # mine_triplets emits each (query, positive) pair's negatives consecutively.
    tuples_q: list[str] = []
    tuples_p: list[str] = []
    tuples_n: list[list[str]] = []
    skipped = 0
    position = 0
    while position < len(rows):
        q_row, p_row = int(rows[position, 0]), int(rows[position, 1])
        end = position
        while end < len(rows) and rows[end, 0] == q_row and rows[end, 1] == p_row:
            end += 1
        negatives = [embeddings.doc_ids[int(n)] for n in rows[position:end, 2]]
        if len(negatives) == n_negatives:
            tuples_q.append(query_ids[q_row])
            tuples_p.append(embeddings.doc_ids[p_row])
            tuples_n.append(negatives)
        else:
            skipped += 1
        position = end
    if skipped:
        logger.warning("mine_training_tuples: skipped %d pairs with fewer than %d negatives.", skipped, n_negatives)
    meta = {
        "dataset": dataset.name,
        "qrels_split": dataset.split,
        "n_queries": len(set(tuples_q)),
        "n_tuples": len(tuples_q),
        "n_negatives": n_negatives,
        "hard_pool": hard_pool,
        "false_negative_margin": false_negative_margin,
        "false_negative_reference": false_negative_reference,
        "seed": seed,
        "miner": encoder.model_name,
        "max_seq_length": encoder.max_seq_length,
    }
    logger.debug("mined %d training tuples for %d queries in %.1fs", len(tuples_q), meta["n_queries"], time.perf_counter() - start)
    return TrainingTuples(tuples_q, tuples_p, tuples_n, meta)
