"""The query-disjoint hold-out of training queries that epoch selection scores on (DIVE and the
residual-adapter baselines, :mod:`embedtune.compress.selection`)."""

from __future__ import annotations

import math

import numpy as np

from embedtune.compress.base import TrainingData
from embedtune.data.splits import rank_by_hash

__all__ = ["holdout_split"]


def holdout_split(train: TrainingData, fraction: float, seed: int, method: str = "DIVE") -> tuple[TrainingData, TrainingData]:
    """Split ``train`` by query into (fit part, held-out part) for epoch selection.

    Queries that have triplets are ranked by ``sha256(f"{seed}:{query_id}")``
    (:func:`embedtune.data.splits.rank_by_hash`) and the first ``ceil(fraction · n)`` are held
    out, so the split depends on ids and seed only. Both parts keep the whole corpus; the fit
    part keeps the triplets of the other queries. ``method`` names the compressor in errors.
    """
    triplets = train.require_triplets(method)
    rows = np.unique(triplets[:, 0])
    ids = [train.query_ids[row] for row in rows]
    if len(ids) < 2:
        raise ValueError(
            f"{method} epoch_selection='best' holds out a fraction of the training queries, but only {len(ids)} "
            "query has triplets; add training queries or use epoch_selection='last'."
        )
    ranked = rank_by_hash(ids, seed)
    n_holdout = min(len(ids) - 1, max(1, math.ceil(fraction * len(ids))))
    held = set(ranked[:n_holdout])
    held_rows = np.array([row for row, query_id in zip(rows, ids) if query_id in held], dtype=np.int64)
    fit_triplets = triplets[~np.isin(triplets[:, 0], held_rows)]
    fit_part = TrainingData(train.query_ids, train.query_embeddings, train.doc_ids, train.doc_embeddings, train.qrels, fit_triplets)
    held_ids = [train.query_ids[row] for row in held_rows]
    holdout = TrainingData(
        held_ids, train.query_embeddings[held_rows], train.doc_ids, train.doc_embeddings,
        {query_id: train.qrels.get(query_id, {}) for query_id in held_ids},
    )
    return fit_part, holdout
