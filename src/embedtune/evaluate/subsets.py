"""Seen and unseen test queries: does a supervised gain hold on documents training never saw?

A compressor or fine-tune fitted on labels can learn two things: to retrieve, and **which
documents are popular** (the positives of its training queries). On SciFact 64 % of the test
positives are also training positives, and a map that pulls every query toward them scores well
on those queries while ranking every other document lower. Scoring per subset separates the two:

- ``seen``: every positive of the query was a positive of a fitting or selection query;
- ``unseen``: no positive of the query was one;
- ``mixed``: some were; it counts in ``all`` only.

"The labels the method fitted and selected on" are the training part's qrels (``train`` or
``train+val``), never the test qrels. A positive is a judged document with relevance > 0.

>>> train = {"q1": {"d1": 1}, "q2": {"d2": 1}}
>>> test = {"t1": {"d1": 1}, "t2": {"d9": 1}, "t3": {"d2": 1, "d8": 1}}
>>> query_subsets(test, training_positives(train))
{'seen': ['t1'], 'unseen': ['t2'], 'mixed': ['t3']}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["SUBSETS", "training_positives", "query_subsets", "subset_means", "subset_counts", "subset_table_rows"]

#: The subsets every supervised report gives, in print order (``mixed`` counts in ``all`` only).
SUBSETS = ("all", "seen", "unseen")


def training_positives(qrels: Mapping[str, Mapping[str, int]], query_ids: Iterable[str] | None = None) -> set[str]:
    """The documents judged relevant (> 0) for ``query_ids`` (every query of ``qrels`` when None)."""
    ids = qrels.keys() if query_ids is None else query_ids
    return {doc for qid in ids for doc, rel in qrels.get(qid, {}).items() if rel > 0}


def query_subsets(eval_qrels: Mapping[str, Mapping[str, int]], seen_docs: set[str]) -> dict[str, list[str]]:
    """Sort the judged queries of ``eval_qrels`` into ``seen``, ``unseen`` and ``mixed`` (each sorted).

    A query without any positive is left out of all three (it has no relevant document to find).
    """
    out: dict[str, list[str]] = {"seen": [], "unseen": [], "mixed": []}
    for qid in sorted(eval_qrels):
        positives = [doc for doc, rel in eval_qrels[qid].items() if rel > 0]
        if not positives:
            continue
        known = sum(doc in seen_docs for doc in positives)
        out["seen" if known == len(positives) else "unseen" if known == 0 else "mixed"].append(qid)
    return out


def subset_counts(subsets: Mapping[str, list[str]], all_ids: Iterable[str]) -> dict[str, int]:
    """``{"all": n, "seen": n, "unseen": n, "mixed": n}``."""
    return {"all": len(list(all_ids)), **{name: len(ids) for name, ids in subsets.items()}}


def subset_means(
    per_query: Mapping[str, Mapping[str, float]],
    subsets: Mapping[str, list[str]],
    metrics: tuple[str, ...] = ("ndcg@10", "recall@10"),
) -> dict[str, dict[str, Any]]:
    """Mean of each metric on ``all`` scored queries and on each subset, with the query count.

    A subset with no query has ``None`` means (never a 0 that reads like a score).
    """
    groups = {"all": sorted(per_query), **{name: [q for q in ids if q in per_query] for name, ids in subsets.items()}}
    out: dict[str, dict[str, Any]] = {}
    for name, ids in groups.items():
        row: dict[str, Any] = {"n_queries": len(ids)}
        for metric in metrics:
            values = [per_query[q][metric] for q in ids if metric in per_query[q]]
            row[metric] = float(np.mean(values)) if values else None
        out[name] = row
    return out


def subset_table_rows(means: Mapping[str, Mapping[str, Any]], metric: str = "ndcg@10") -> str:
    """``all 0.6492 (300) · seen 0.6341 (193) · unseen 0.6804 (104)``: one line for terminals and notes."""
    parts = []
    for name in SUBSETS:
        row = means.get(name)
        if row is None:
            continue
        value = row.get(metric)
        parts.append(f"{name} {'n/a' if value is None else f'{value:.4f}'} ({row['n_queries']})")
    return " · ".join(parts)
