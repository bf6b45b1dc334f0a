"""The hold-out of training queries that epoch selection scores on (DIVE and the
residual-adapter baselines, :mod:`embedtune.compress.selection`).

Two rules (``selection_holdout``):

- ``"disjoint-positives"`` (the default): queries are grouped by shared positives (two queries
  that share a relevant document are in one group, transitively) and whole groups are held out,
  so no held-out query has a positive that a fitting query has. The held-out score then rewards
  what carries over to documents the fit never saw as positives, and a map that only learns
  where the popular documents lie cannot raise it.
- ``"random-queries"``: the first ``ceil(fraction · n)`` queries by hash, whatever their
  positives (the earlier rule; the ``static-corpus`` preset keeps it). When most positives are
  shared, this rewards memorising them.

Both rank by ``sha256(f"{seed}:{query_id}")`` (:func:`embedtune.data.splits.rank_by_hash`), so
the split depends on ids and seed only. Both parts keep the whole corpus; the fit part keeps the
triplets of the other queries.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from embedtune.compress.base import TrainingData
from embedtune.data.splits import positive_components, rank_by_hash

logger = logging.getLogger(__name__)

__all__ = ["SELECTION_HOLDOUTS", "holdout_ids", "holdout_split"]

SELECTION_HOLDOUTS = ("disjoint-positives", "random-queries")


def holdout_ids(ids: list[str], qrels: dict[str, dict[str, int]], n_holdout: int, seed: int, rule: str = "disjoint-positives",
                what: str = "selection") -> list[str]:
    """About ``n_holdout`` of ``ids`` to hold out, in hash order; with ``"disjoint-positives"``, whole positive groups.

    Groups are taken in the hash order of their first-ranked query until ``n_holdout`` queries are
    held out, skipping a group that would leave nothing to fit. When every query falls in one group
    it says so (naming ``what``) and falls back to the first ``n_holdout`` queries by hash.
    """
    if rule not in SELECTION_HOLDOUTS:
        raise ValueError(f"selection_holdout must be one of {list(SELECTION_HOLDOUTS)}; got {rule!r}.")
    ranked = rank_by_hash(ids, seed)
    if rule == "disjoint-positives":
        position = {qid: i for i, qid in enumerate(ranked)}
        held: list[str] = []
        for group in sorted(positive_components(qrels, list(ids)), key=lambda group: min(position[q] for q in group)):
            if len(held) >= n_holdout:
                break
            if len(held) + len(group) < len(ids):  # the fit part keeps at least one query
                held += group
        if held:
            return sorted(held, key=position.__getitem__)
        logger.warning("%s: every query shares a positive with another (one group), so none can be held out with disjoint "
                       "positives; holding out %d hash-ranked queries instead (rule 'random-queries'), which rewards "
                       "memorising the shared positives.", what, n_holdout)
    return ranked[:n_holdout]


def holdout_split(train: TrainingData, fraction: float, seed: int, method: str = "DIVE",
                  rule: str = "disjoint-positives") -> tuple[TrainingData, TrainingData]:
    """Split ``train`` by query into (fit part, held-out part) for epoch selection; see the module docstring.

    With ``rule="disjoint-positives"``, groups are taken in the hash order of their first-ranked
    query until ``ceil(fraction · n)`` queries are held out. When every query falls in one group
    (nothing can be held out disjointly), it says so and falls back to ``"random-queries"``.
    """
    triplets = train.require_triplets(method)
    rows = np.unique(triplets[:, 0])
    ids = [train.query_ids[row] for row in rows]
    if len(ids) < 2:
        raise ValueError(
            f"{method} epoch_selection='best' holds out a fraction of the training queries, but only {len(ids)} "
            "query has triplets; add training queries or use epoch_selection='last'."
        )
    n_holdout = min(len(ids) - 1, max(1, math.ceil(fraction * len(ids))))
    held = set(holdout_ids(ids, train.qrels, n_holdout, seed, rule, method))
    held_rows = np.array([row for row, query_id in zip(rows, ids) if query_id in held], dtype=np.int64)
    fit_triplets = triplets[~np.isin(triplets[:, 0], held_rows)]
    # Pseudo-queries only ever train: the held-out part is real queries alone.
    fit_part = TrainingData(train.query_ids, train.query_embeddings, train.doc_ids, train.doc_embeddings, train.qrels, fit_triplets,
                            train.pseudo_queries)
    held_ids = [train.query_ids[row] for row in held_rows]
    holdout = TrainingData(
        held_ids, train.query_embeddings[held_rows], train.doc_ids, train.doc_embeddings,
        {query_id: train.qrels.get(query_id, {}) for query_id in held_ids},
    )
    return fit_part, holdout
