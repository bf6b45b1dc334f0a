"""The self-limiting (hinge) triplet loss of DIVE (§3.2)."""

from __future__ import annotations

from typing import Any, Literal

import torch.nn.functional as F
from torch import Tensor, nn

from embedtune.compress.choices import TRIPLET_KINDS  # noqa: F401 (re-exported)

__all__ = ["SelfLimitingTripletLoss", "self_limiting_triplet_loss", "TRIPLET_KINDS", "DIVE_CITATION"]


def self_limiting_triplet_loss(
    query: Tensor, positive: Tensor, negative: Tensor, margin: float = 0.7, kind: Literal["hinge", "softplus"] = "hinge"
) -> tuple[Tensor, Tensor]:
    """Mean hinge ``max(0, m - Δ_i)`` with ``Δ_i = cos(q_i, p_i) - cos(q_i, n_i)``, and the active ratio.

    Args:
        query, positive, negative: tensors of shape (batch, k), head-1 embeddings (any norm).
        margin: ``m``.
        kind: ``"hinge"`` (DIVE) or ``"softplus"`` (``softplus(m - Δ)``, the paper's
            "w/o self-limiting" ablation, whose gradient never vanishes).

    Returns:
        ``(loss, active_ratio)``: scalar tensors; ``active_ratio = mean_i 1[Δ_i < m]`` (ρ(t),
        detached). With ``"hinge"`` a triplet with ``Δ_i >= m`` gets exactly zero gradient.
    """
    if kind not in TRIPLET_KINDS:
        raise ValueError(f"kind must be one of {TRIPLET_KINDS}; got {kind!r}.")
    if not (query.shape == positive.shape == negative.shape) or query.ndim != 2:
        raise ValueError(f"query, positive and negative must share one (batch, k) shape; got {query.shape}, {positive.shape}, {negative.shape}.")
    query, positive, negative = (F.normalize(x, p=2, dim=-1) for x in (query, positive, negative))
    delta = (query * positive).sum(-1) - (query * negative).sum(-1)  # (batch,)
    slack = margin - delta
    # relu (not clamp) so that Δ == m, counted inactive by ρ, also gets a zero gradient.
    per_triplet = F.relu(slack) if kind == "hinge" else F.softplus(slack)
    active_ratio = (delta.detach() < margin).float().mean()
    return per_triplet.mean(), active_ratio


class SelfLimitingTripletLoss(nn.Module):
    def __init__(self, model: nn.Module, margin: float = 0.7, kind: Literal["hinge", "softplus"] = "hinge") -> None:
        """Self-limiting triplet loss on head 1: ``L = 1/B Σ_i max(0, m - Δ_i)`` with
        ``Δ_i = cos(q_i^[1], p_i^[1]) - cos(q_i^[1], n_i^[1])``.

        A triplet that already satisfies the margin (``Δ_i >= m``) contributes exactly zero
        gradient, so label-driven updates switch themselves off; the active ratio
        ``ρ(t) = 1/B Σ_i 1[Δ_i < m]`` measures how much supervision remains (Fig. 5).

        Args:
            model: a module mapping (batch, d) embeddings to unit-norm heads of shape
                (batch, H, k), e.g. :class:`embedtune.compress.dive.DIVEAdapter`.
            margin: the margin ``m`` (paper: 0.7).
            kind: ``"hinge"`` (DIVE) or ``"softplus"`` (the "w/o self-limiting" ablation, §4.4).

        References:
            - Zhao, "DIVE: Embedding Compression via Self-Limiting Gradient Updates",
              arXiv:2605.20689, §3.2 and Appendix A.1.

        Requirements:
            1. (query, positive, negative) triplets of frozen embeddings.

        Inputs:
            +------------------------------------------------+--------+
            | Inputs                                         | Labels |
            +================================================+========+
            | dict with "query", "positive", "negative"      | none   |
            | tensors, each of shape (batch, d)              |        |
            +------------------------------------------------+--------+

        Example:
            ::

                import torch
                from embedtune.compress.dive import DIVEAdapter
                from embedtune.compress.losses import SelfLimitingTripletLoss

                adapter = DIVEAdapter(input_dim=64, dim=16, heads=2, hidden_dim=32)
                loss_fn = SelfLimitingTripletLoss(adapter, margin=0.7)
                batch = {name: torch.randn(8, 64) for name in ("query", "positive", "negative")}
                loss, active_ratio = loss_fn(batch)
                loss.backward()
        """
        super().__init__()
        if kind not in TRIPLET_KINDS:
            raise ValueError(f"kind must be one of {TRIPLET_KINDS}; got {kind!r}.")
        self.model = model
        self.margin = float(margin)
        self.kind = kind

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> tuple[Tensor, Tensor]:
        heads = [self.model(features[name]) for name in ("query", "positive", "negative")]  # each (batch, H, k)
        return self.compute_loss_from_embeddings(*(h[:, 0] for h in heads))

    def compute_loss_from_embeddings(self, query: Tensor, positive: Tensor, negative: Tensor) -> tuple[Tensor, Tensor]:
        """Loss and active ratio from head-1 embeddings of shape (batch, k)."""
        return self_limiting_triplet_loss(query, positive, negative, self.margin, self.kind)

    def get_config_dict(self) -> dict[str, Any]:
        return {"margin": self.margin, "kind": self.kind}

    @property
    def citation(self) -> str:
        return DIVE_CITATION


DIVE_CITATION = """
@misc{zhao2026dive,
    title={DIVE: Embedding Compression via Self-Limiting Gradient Updates},
    author={Dongfang Zhao},
    year={2026},
    eprint={2605.20689},
    archivePrefix={arXiv}
}
"""
