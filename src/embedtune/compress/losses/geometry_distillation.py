"""Geometry distillation from the frozen embedding space (DIVE §3.2)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embedtune.compress.losses.self_limiting_triplet import DIVE_CITATION

__all__ = ["GeometryDistillationLoss", "geometry_distillation_loss"]


def geometry_distillation_loss(student: Tensor, teacher: Tensor, beta: float = 1.0) -> Tensor:
    """``L_geo = 1/|Ω| Σ_{(i,j)∈Ω} SmoothL1((S Sᵀ)_ij, (T Tᵀ)_ij)`` over off-diagonal pairs Ω.

    Args:
        student: ``S``, tensor of shape (n, k), the unit-norm head-1 outputs.
        teacher: ``T``, tensor of shape (n, d), the frozen inputs, already L2-normalised (the
            caller decides; DIVE normalises them) and without gradient.
        beta: SmoothL1 threshold (torch's default 1.0).

    Returns:
        A scalar tensor; zero when ``n < 2`` (no pair).
    """
    if student.ndim != 2 or teacher.ndim != 2 or len(student) != len(teacher):
        raise ValueError(f"student (n, k) and teacher (n, d) must have the same n; got {tuple(student.shape)} and {tuple(teacher.shape)}.")
    n = len(student)
    if n < 2:
        return student.sum() * 0.0
    student_gram = student @ student.T  # (n, n)
    teacher_gram = teacher @ teacher.T  # (n, n)
    # The diagonal is 1 == 1 for unit vectors and would only dilute the mean. Zeroing it (rather
    # than gathering the off-diagonal entries with a boolean mask) keeps the step free of
    # nonzero/index kernels, which cost more than the Gram matrices themselves.
    off_diagonal = 1.0 - torch.eye(n, dtype=student_gram.dtype, device=student.device)
    pointwise = F.smooth_l1_loss(student_gram, teacher_gram, reduction="none", beta=beta)
    return (pointwise * off_diagonal).sum() / (n * (n - 1))


class GeometryDistillationLoss(nn.Module):
    def __init__(self, model: nn.Module, beta: float = 1.0) -> None:
        """Geometry distillation: the pairwise cosine similarities of head 1 (``S Sᵀ``) follow
        those of the frozen, L2-normalised inputs (``T Tᵀ``) under SmoothL1, over every
        off-diagonal pair of the batch (queries, positives and negatives stacked). It anchors the
        compressed space to the pretrained geometry while the hinge term goes quiet.

        Args:
            model: a module mapping (batch, d) embeddings to unit-norm heads of shape (batch, H, k).
            beta: SmoothL1 threshold (torch's default 1.0).

        References:
            - Zhao, "DIVE: Embedding Compression via Self-Limiting Gradient Updates",
              arXiv:2605.20689, §3.2.

        Requirements:
            1. Frozen embeddings of the batch items; no labels.

        Inputs:
            +------------------------------------------------+--------+
            | Inputs                                         | Labels |
            +================================================+========+
            | dict of groups, e.g. "query", "positive",      | none   |
            | "negative", each of shape (batch, d)           |        |
            +------------------------------------------------+--------+

        Example:
            ::

                import torch
                from embedtune.compress.dive import DIVEAdapter
                from embedtune.compress.losses import GeometryDistillationLoss

                adapter = DIVEAdapter(input_dim=64, dim=16, heads=2, hidden_dim=32)
                loss_fn = GeometryDistillationLoss(adapter)
                batch = {name: torch.randn(8, 64) for name in ("query", "positive", "negative")}
                loss = loss_fn(batch)
                loss.backward()
        """
        super().__init__()
        if beta <= 0:
            raise ValueError(f"beta must be > 0; got {beta}.")
        self.model = model
        self.beta = float(beta)

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> Tensor:
        inputs = torch.cat(list(features.values()))  # (n_groups·batch, d)
        student = self.model(inputs)[:, 0]  # (n, k)
        return self.compute_loss_from_embeddings(student, F.normalize(inputs.detach(), p=2, dim=-1))

    def compute_loss_from_embeddings(self, student: Tensor, teacher: Tensor) -> Tensor:
        """Loss from head-1 outputs (n, k) and normalised frozen inputs (n, d)."""
        return geometry_distillation_loss(student, teacher, self.beta)

    def get_config_dict(self) -> dict[str, Any]:
        return {"beta": self.beta}

    @property
    def citation(self) -> str:
        return DIVE_CITATION
