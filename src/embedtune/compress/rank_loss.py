"""The pairwise rank loss shared by the supervised baselines (Search-Adaptor, Matryoshka-Adaptor, SMEC).

Yoon et al. (2024a, Search-Adaptor, Eq. 2) write it as

    L_rank = Σ_i Σ_{j,k: y_ij > y_ik} (y_ij − y_ik) · log(1 + exp(s_ik − s_ij)),

with ``s_ij`` the cosine similarity of adapted query ``i`` and adapted document ``j`` and
``y_ij`` their relevance. Matryoshka-Adaptor (Yoon et al. 2024b) and SMEC (Zhang et al. 2025)
reuse it. Every method in the DIVE benchmark learns from the same triplets
``(query row, positive row, negative row)``, so a triplet batch is turned into per-query
candidate lists: the candidates of query ``i`` are the distinct documents of its triplets in
the batch, with ``y = 1`` for a document that is one of its positives there and ``y = 0``
otherwise. One positive with its ``n`` negatives therefore gives ``n`` ordered pairs, whatever
way the triplets repeat the positive.

Reduction: the paper writes a sum; ``reduction="mean"`` (the default used in training)
divides by the number of contributing ``(i, j, k)`` pairs, so the loss weights of each method
do not depend on the batch size.

References:
    - J. Yoon, Y. Chen, S. Arik, T. Pfister. "Search-Adaptor: Embedding Customization for
      Information Retrieval". ACL 2024.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["REDUCTIONS", "TripletGroups", "group_triplets", "pairwise_rank_loss", "triplet_rank_loss"]

REDUCTIONS = ("mean", "sum")


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}.")


def pairwise_rank_loss(
    scores: Tensor, relevance: Tensor, mask: Tensor | None = None, reduction: Literal["mean", "sum"] = "mean"
) -> Tensor:
    """``Σ_i Σ_{j,k: y_ij > y_ik} (y_ij − y_ik) · softplus(s_ik − s_ij)`` over valid candidates.

    Args:
        scores: (n_queries, n_candidates) similarities ``s``.
        relevance: (n_queries, n_candidates) labels ``y`` (any non-negative grades).
        mask: (n_queries, n_candidates) bool; False marks a candidate that is not in query
            ``i``'s list. None means every candidate is valid.
        reduction: ``"sum"`` (the formula) or ``"mean"`` (divided by the number of pairs with
            ``y_ij > y_ik``).

    Returns:
        A scalar tensor; zero (with a graph) when no query has two differently labelled candidates.
    """
    _check_reduction(reduction)
    if scores.shape != relevance.shape or scores.ndim != 2:
        raise ValueError(
            "scores and relevance must share one (n_queries, n_candidates) shape; "
            f"got {tuple(scores.shape)} and {tuple(relevance.shape)}."
        )
    relevance = relevance.to(scores.dtype)
    if mask is not None and mask.shape != scores.shape:
        raise ValueError(f"mask must have shape {tuple(scores.shape)}; got {tuple(mask.shape)}.")
    # Work on the valid (query, candidate) entries only: a triplet batch has a handful of
    # candidates per query, so the dense (n_queries, n_candidates, n_candidates) form would
    # be almost all padding (and dominated the baselines' step time).
    valid = mask if mask is not None else torch.ones_like(scores, dtype=torch.bool)
    query_index, candidate_index = valid.nonzero(as_tuple=True)  # (E,)
    labels = relevance[query_index, candidate_index]
    entry_scores = scores[query_index, candidate_index]
    same_query = query_index.unsqueeze(1) == query_index.unsqueeze(0)  # (E, E)
    gap = (labels.unsqueeze(1) - labels.unsqueeze(0)).clamp(min=0) * same_query  # y_ij − y_ik where positive
    better, worse = gap.nonzero(as_tuple=True)
    weight = gap[better, worse]
    # softplus(s_ik − s_ij) = log(1 + exp(s_ik − s_ij)), computed stably.
    total = (weight * F.softplus(entry_scores[worse] - entry_scores[better])).sum()
    if reduction == "sum":
        return total
    return total / max(len(weight), 1)


class TripletGroups(NamedTuple):
    """A triplet batch regrouped by query (see :func:`group_triplets`).

    Attributes:
        query_rows: (n_queries,) distinct query rows of the batch, ascending.
        doc_rows: (n_docs,) distinct document rows of the batch, ascending.
        relevance: (n_queries, n_docs) float, 1 where the doc is a positive of the query.
        mask: (n_queries, n_docs) bool, True where the doc is in one of the query's triplets.
    """

    query_rows: Tensor
    doc_rows: Tensor
    relevance: Tensor
    mask: Tensor


def group_triplets(triplets: Tensor) -> TripletGroups:
    """Regroup (n, 3) ``(query, positive, negative)`` rows into per-query candidate lists.

    A document that is both a positive and a negative of one query in the batch counts as a
    positive (a label conflict the triplet miner should not produce).
    """
    triplets = torch.as_tensor(triplets, dtype=torch.long)
    if triplets.ndim != 2 or triplets.shape[1] != 3:
        raise ValueError(f"triplets must have shape (n, 3); got {tuple(triplets.shape)}.")
    query_rows, query_slot = torch.unique(triplets[:, 0], return_inverse=True)
    doc_rows, doc_slot = torch.unique(triplets[:, 1:].reshape(-1), return_inverse=True)
    doc_slot = doc_slot.view(-1, 2)
    n_queries, n_docs = len(query_rows), len(doc_rows)
    mask = torch.zeros(n_queries, n_docs, dtype=torch.bool)
    mask[query_slot, doc_slot[:, 0]] = True
    mask[query_slot, doc_slot[:, 1]] = True
    relevance = torch.zeros(n_queries, n_docs)
    relevance[query_slot, doc_slot[:, 0]] = 1.0
    return TripletGroups(query_rows, doc_rows, relevance, mask)


def triplet_rank_loss(
    query_embeddings: Tensor, doc_embeddings: Tensor, groups: TripletGroups, reduction: Literal["mean", "sum"] = "mean"
) -> Tensor:
    """Rank loss of adapted embeddings over :func:`group_triplets` candidate lists.

    Args:
        query_embeddings: (n_queries, k) adapted embeddings of ``groups.query_rows`` (any norm).
        doc_embeddings: (n_docs, k) adapted embeddings of ``groups.doc_rows`` (any norm).
        groups: the batch's :class:`TripletGroups`.
        reduction: see :func:`pairwise_rank_loss`.
    """
    if query_embeddings.shape[0] != groups.relevance.shape[0] or doc_embeddings.shape[0] != groups.relevance.shape[1]:
        raise ValueError(
            f"got {query_embeddings.shape[0]} query and {doc_embeddings.shape[0]} doc embeddings "
            f"for groups of shape {tuple(groups.relevance.shape)}."
        )
    scores = F.normalize(query_embeddings, dim=-1) @ F.normalize(doc_embeddings, dim=-1).T  # (n_queries, n_docs) cosines
    device = scores.device
    return pairwise_rank_loss(scores, groups.relevance.to(device), groups.mask.to(device), reduction=reduction)
