"""The shared pairwise rank loss against a naive loop over the formula."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from embedtune.compress.rank_loss import group_triplets, pairwise_rank_loss, triplet_rank_loss

# Tiny tensors: one thread is fastest and stays fast on a busy 2-core machine.
torch.set_num_threads(1)


def naive_pairwise_rank_loss(scores, relevance, mask=None):
    """Σ_i Σ_{j,k: y_ij > y_ik} (y_ij − y_ik) log(1 + exp(s_ik − s_ij)), and the number of pairs."""
    total, pairs = 0.0, 0
    n_queries, n_candidates = scores.shape
    for i in range(n_queries):
        for j in range(n_candidates):
            for k in range(n_candidates):
                if mask is not None and not (mask[i, j] and mask[i, k]):
                    continue
                y_ij, y_ik = float(relevance[i, j]), float(relevance[i, k])
                if y_ij > y_ik:
                    total += (y_ij - y_ik) * math.log(1 + math.exp(float(scores[i, k]) - float(scores[i, j])))
                    pairs += 1
    return total, pairs


def test_pairwise_rank_loss_matches_naive_loop_with_grades_and_mask():
    generator = torch.Generator().manual_seed(0)
    scores = torch.rand(4, 6, generator=generator) * 2 - 1
    relevance = torch.randint(0, 3, (4, 6), generator=generator).float()
    mask = torch.rand(4, 6, generator=generator) > 0.3
    expected_sum, pairs = naive_pairwise_rank_loss(scores, relevance, mask)
    assert pairs > 0
    assert pairwise_rank_loss(scores, relevance, mask, reduction="sum").item() == pytest.approx(expected_sum, rel=1e-5)
    assert pairwise_rank_loss(scores, relevance, mask, reduction="mean").item() == pytest.approx(expected_sum / pairs, rel=1e-5)
    unmasked_sum, _ = naive_pairwise_rank_loss(scores, relevance)
    assert pairwise_rank_loss(scores, relevance, reduction="sum").item() == pytest.approx(unmasked_sum, rel=1e-5)


def naive_triplet_rank_loss(query_emb, doc_emb, triplets):
    """Per query: every (distinct positive, distinct negative) pair of its triplets, from raw rows."""
    positives, negatives = {}, {}
    for q, p, n in triplets.tolist():
        positives.setdefault(q, set()).add(p)
        negatives.setdefault(q, set()).add(n)
    total, pairs = 0.0, 0
    for q in positives:
        for p in positives[q]:
            for n in negatives[q] - positives[q]:
                s_p = F.cosine_similarity(query_emb[q], doc_emb[p], dim=0).item()
                s_n = F.cosine_similarity(query_emb[q], doc_emb[n], dim=0).item()
                total += math.log(1 + math.exp(s_n - s_p))
                pairs += 1
    return total, pairs


def test_triplet_rank_loss_matches_naive_loop():
    generator = torch.Generator().manual_seed(1)
    query_emb = torch.randn(5, 7, generator=generator)
    doc_emb = torch.randn(12, 7, generator=generator)
    # Query 0 repeats its positive over three negatives; query 3 has two positives.
    triplets = torch.tensor([[0, 1, 2], [0, 1, 3], [0, 1, 4], [3, 5, 6], [3, 7, 6], [3, 5, 8], [2, 9, 10], [2, 9, 10]])
    groups = group_triplets(triplets)
    assert groups.query_rows.tolist() == [0, 2, 3]
    expected_sum, pairs = naive_triplet_rank_loss(query_emb, doc_emb, triplets)
    assert pairs == 3 + 4 + 1  # duplicates of a (query, doc) pair count once
    got_sum = triplet_rank_loss(query_emb[groups.query_rows], doc_emb[groups.doc_rows], groups, reduction="sum")
    got_mean = triplet_rank_loss(query_emb[groups.query_rows], doc_emb[groups.doc_rows], groups)
    assert got_sum.item() == pytest.approx(expected_sum, rel=1e-5)
    assert got_mean.item() == pytest.approx(expected_sum / pairs, rel=1e-5)


def test_group_triplets_masks_and_labels():
    groups = group_triplets(torch.tensor([[4, 0, 1], [2, 1, 3]]))
    assert groups.query_rows.tolist() == [2, 4]
    assert groups.doc_rows.tolist() == [0, 1, 3]
    # Doc 1 is a negative of query 4 and the positive of query 2.
    assert groups.relevance.tolist() == [[0, 1, 0], [1, 0, 0]]
    assert groups.mask.tolist() == [[False, True, True], [True, True, False]]


def test_rank_loss_gradient_raises_the_positive():
    scores = torch.tensor([[0.1, 0.3]], requires_grad=True)
    pairwise_rank_loss(scores, torch.tensor([[1.0, 0.0]])).backward()
    assert scores.grad[0, 0] < 0 < scores.grad[0, 1]


def test_no_ranked_pairs_gives_zero_with_a_graph():
    scores = torch.zeros(2, 3, requires_grad=True)
    loss = pairwise_rank_loss(scores, torch.ones(2, 3))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(scores.grad, torch.zeros(2, 3))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="reduction"):
        pairwise_rank_loss(torch.zeros(1, 2), torch.zeros(1, 2), reduction="max")
    with pytest.raises(ValueError, match="shape"):
        pairwise_rank_loss(torch.zeros(1, 2), torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"\(n, 3\)"):
        group_triplets(torch.zeros(2, 2, dtype=torch.long))
