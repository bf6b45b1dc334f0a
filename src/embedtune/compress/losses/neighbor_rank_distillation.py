"""Neighbour-rank distillation from the frozen embedding space (DIVE's unsupervised mode)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embedtune.compress.losses.self_limiting_triplet import DIVE_CITATION

__all__ = ["NeighborRankDistillationLoss", "neighbor_rank_distillation_loss"]


def neighbor_rank_distillation_loss(
    student_anchors: Tensor,
    student_pool: Tensor,
    teacher_anchors: Tensor,
    teacher_pool: Tensor,
    anchor_slots: Tensor,
    temperature: float = 0.5,
    standardize: bool = True,
) -> Tensor:
    """``L_rank = 1/|A| Σ_{a∈A} KL(p_a ‖ q_a)`` over a pool ``P`` of corpus items.

    ``p_a(j) = softmax_{j∈P∖{a}}(z(⟨t_a, t_j⟩) / τ)`` is how the frozen space ranks the pool
    around anchor ``a`` and ``q_a(j) = softmax_{j∈P∖{a}}(z(⟨s_a, s_j⟩) / τ)`` how the compressed
    space does, where ``z`` standardises an anchor's similarities over its pool (subtract their
    mean, divide by their standard deviation; the identity with ``standardize=False``). With the
    pool made of the anchors plus each anchor's nearest frozen-space neighbours, the loss asks the
    compressed space to keep *which* documents are near each document, the nearest weighted most.
    Unlike a loss on cosine values (geometry distillation, Matryoshka-Adaptor's ``L_topk``) it is
    invariant to shifting and, standardised, to scaling an anchor's similarities, so ``τ`` means
    the same for a model whose cosines spread over [0, 1] and one whose cosines all sit near 0.8
    (an anisotropic embedding space).

    Args:
        student_anchors: ``s_a``, (n_anchors, k), unit-norm compressed anchors.
        student_pool: ``s_j``, (n_pool, k), unit-norm compressed pool items.
        teacher_anchors: ``t_a``, (n_anchors, d), unit-norm frozen anchors (no gradient).
        teacher_pool: ``t_j``, (n_pool, d), unit-norm frozen pool items (no gradient).
        anchor_slots: (n_anchors,) int64, the row of each anchor in the pool (excluded from its
            own softmax); -1 when an anchor is not in the pool.
        temperature: ``τ``, shared by both distributions (in standard deviations when standardised).
        standardize: standardise each anchor's similarities over its pool before the softmax.

    Returns:
        A scalar tensor, the mean over anchors of the KL divergence (0 when they match).
    """
    if student_anchors.ndim != 2 or student_pool.ndim != 2 or student_anchors.shape[1] != student_pool.shape[1]:
        raise ValueError(f"student anchors (n, k) and pool (m, k) must share k; got {tuple(student_anchors.shape)} and {tuple(student_pool.shape)}.")
    if len(teacher_anchors) != len(student_anchors) or len(teacher_pool) != len(student_pool) or len(anchor_slots) != len(student_anchors):
        raise ValueError("teacher and student anchors, pools and anchor_slots must have matching lengths.")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}.")
    if len(student_anchors) == 0 or len(student_pool) < 2:
        return student_pool.sum() * 0.0
    rows = torch.arange(len(anchor_slots), device=anchor_slots.device)
    own = torch.zeros(len(student_anchors), len(student_pool), dtype=torch.bool, device=student_pool.device)
    inside = anchor_slots >= 0
    own[rows[inside], anchor_slots[inside]] = True
    teacher_logits = (_standardized(teacher_anchors @ teacher_pool.T, own) if standardize else teacher_anchors @ teacher_pool.T)
    student_logits = (_standardized(student_anchors @ student_pool.T, own) if standardize else student_anchors @ student_pool.T)
    teacher_logits = (teacher_logits / temperature).masked_fill(own, -torch.inf)
    student_logits = (student_logits / temperature).masked_fill(own, -torch.inf)
    teacher_log_p = F.log_softmax(teacher_logits, dim=-1)
    student_log_q = F.log_softmax(student_logits, dim=-1)
    # p log(p / q), with 0 for the masked entries (p = 0 there; -inf - -inf would be NaN).
    pointwise = teacher_log_p.exp() * (teacher_log_p - student_log_q)
    return pointwise.masked_fill(own, 0.0).sum(dim=-1).mean()


def _standardized(scores: Tensor, own: Tensor) -> Tensor:
    """Each row's scores minus their mean, over their standard deviation; the ``own`` entries left out of both."""
    keep = (~own).to(scores.dtype)
    count = keep.sum(dim=-1, keepdim=True).clamp_min(1.0)
    mean = (scores * keep).sum(dim=-1, keepdim=True) / count
    # The floor goes on the variance, before the square root: sqrt's gradient at 0 is infinite, and a row of equal
    # scores (identical documents) would then turn every weight into NaN. The value is the same (a spread of at least 1e-6).
    spread = (((scores - mean) ** 2) * keep).sum(dim=-1, keepdim=True).div(count).clamp_min(1e-12).sqrt()
    return (scores - mean) / spread


class NeighborRankDistillationLoss(nn.Module):
    def __init__(self, model: nn.Module, temperature: float = 0.5, standardize: bool = True) -> None:
        """Neighbour-rank distillation: for every anchor document, the softmax over a pool of
        documents (the anchors and their nearest frozen-space neighbours) of the compressed
        head-1 similarities follows the softmax of the frozen similarities (KL divergence, shared
        temperature τ), each anchor's similarities standardised over its pool first. It needs no
        queries and no labels: DIVE's unsupervised mode trains on it together with geometry
        distillation.

        Args:
            model: a module mapping (batch, d) embeddings to unit-norm heads of shape (batch, H, k).
            temperature: τ of both softmaxes, in standard deviations of an anchor's similarities.
            standardize: standardise each anchor's similarities over its pool (False: raw cosines / τ).

        References:
            - Zhao, "DIVE: Embedding Compression via Self-Limiting Gradient Updates",
              arXiv:2605.20689 (geometry distillation, §3.2, which this loss complements).
            - G. Hinton, O. Vinyals, J. Dean. "Distilling the knowledge in a neural network".
              arXiv:1503.02531, 2015 (softened-distribution distillation).

        Requirements:
            1. Frozen corpus embeddings; each anchor's nearest neighbours in the frozen space.

        Inputs:
            +-------------------------------------------------+--------+
            | Inputs                                          | Labels |
            +=================================================+========+
            | dict with "pool" (m, d) and "anchor_slots" (n,) | none   |
            | (the anchors' rows in the pool)                 |        |
            +-------------------------------------------------+--------+

        Example:
            ::

                import torch
                from embedtune.compress.dive import DIVEAdapter
                from embedtune.compress.losses import NeighborRankDistillationLoss

                adapter = DIVEAdapter(input_dim=64, dim=16, heads=2, hidden_dim=32)
                loss_fn = NeighborRankDistillationLoss(adapter)
                batch = {"pool": torch.randn(40, 64), "anchor_slots": torch.arange(8)}
                loss = loss_fn(batch)
                loss.backward()
        """
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0; got {temperature}.")
        self.model = model
        self.temperature = float(temperature)
        self.standardize = bool(standardize)

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> Tensor:
        pool, slots = features["pool"], features["anchor_slots"]
        student = self.model(pool)[:, 0]  # (m, k)
        teacher = F.normalize(pool.detach(), p=2, dim=-1)
        return neighbor_rank_distillation_loss(student[slots], student, teacher[slots], teacher, slots, self.temperature,
                                               self.standardize)

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "standardize": self.standardize}

    @property
    def citation(self) -> str:
        return DIVE_CITATION
