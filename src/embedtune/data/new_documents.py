"""The new-documents protocol: a hashed share of the corpus "arrives after the fit".

A user who fits a compressor today and adds documents tomorrow needs the new documents to rank
as well as the old ones. To measure that, :func:`withheld_documents` picks a fixed fraction of
the corpus by hash; fitting and selection never touch those documents (they are never a
positive or a negative, and never in the corpus that PCA, distillation, calibration or mining
see), and the queries whose positives are *all* among them are then scored against the whole
corpus (:func:`new_document_queries`).

Documents are ranked by ``sha256(f"{seed}:new-documents:{doc_id}")``, so the choice depends on
the ids and the seed only: the same seed withholds the same documents on every machine.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

__all__ = ["DEFAULT_NEW_DOCUMENTS_FRACTION", "withheld_documents", "new_document_queries", "without_documents"]

#: The share of the corpus withheld by default: 20 %, enough documents to score queries on, most of the corpus left to fit.
DEFAULT_NEW_DOCUMENTS_FRACTION = 0.2


def withheld_documents(doc_ids: Iterable[str], fraction: float = DEFAULT_NEW_DOCUMENTS_FRACTION, seed: int = 2027) -> set[str]:
    """The ``round(fraction · n)`` documents with the smallest hash key: the ones that "arrive later"."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"new-documents fraction must be a number in (0, 1); got {fraction!r}.")
    ids = list(doc_ids)
    ranked = sorted(ids, key=lambda doc_id: (hashlib.sha256(f"{seed}:new-documents:{doc_id}".encode("utf-8")).hexdigest(), doc_id))
    n = min(len(ids) - 1, max(1, math.floor(fraction * len(ids) + 0.5))) if len(ids) > 1 else 0
    return set(ranked[:n])


def new_document_queries(qrels: Mapping[str, Mapping[str, int]], query_ids: Iterable[str], withheld: set[str]) -> list[str]:
    """The queries of ``query_ids`` whose positives (relevance > 0) all lie in ``withheld``."""
    out = []
    for qid in query_ids:
        positives = [doc for doc, rel in qrels.get(qid, {}).items() if rel > 0]
        if positives and all(doc in withheld for doc in positives):
            out.append(qid)
    return out


def without_documents(qrels: Mapping[str, Mapping[str, int]], withheld: set[str]) -> dict[str, dict[str, int]]:
    """``qrels`` with every judgment of a withheld document removed; queries left with no positive are dropped."""
    out: dict[str, dict[str, int]] = {}
    for qid, docs in qrels.items():
        kept = {doc: rel for doc, rel in docs.items() if doc not in withheld}
        if any(rel > 0 for rel in kept.values()):
            out[qid] = kept
    return out
