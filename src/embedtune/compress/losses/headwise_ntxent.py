"""Head-wise NT-Xent over implicit coordinate views (DIVE §3.2)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from embedtune.compress.losses.self_limiting_triplet import DIVE_CITATION

__all__ = ["HeadwiseNTXentLoss", "headwise_ntxent_loss"]


def headwise_ntxent_loss(heads: Tensor, temperature: float = 0.1) -> Tensor:
    """``L_contrast``: NT-Xent where the ``H`` heads of one item are positives of each other.

    For the anchor view ``(i, h)``, the positives are ``(i, h')`` with ``h' != h`` and the
    denominator runs over every other view ``(j, g) != (i, h)`` of the batch::

        ℓ_{i,h} = -1/(H-1) Σ_{h'≠h} log[ exp(z_i^h·z_i^h'/τ) / Σ_{(j,g)≠(i,h)} exp(z_i^h·z_j^g/τ) ]
        L_contrast = 1/(B·H) Σ_{i,h} ℓ_{i,h}

    Args:
        heads: tensor of shape (batch, H, k) of unit-norm heads, ``H >= 2``.
        temperature: ``τ`` (paper: 0.1).

    Returns:
        A scalar tensor.
    """
    if heads.ndim != 3:
        raise ValueError(f"heads must have shape (batch, H, k); got {tuple(heads.shape)}.")
    batch, n_heads, _ = heads.shape
    if n_heads < 2:
        raise ValueError(f"head-wise NT-Xent needs at least 2 heads (views) per item; got H={n_heads}.")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}.")
    views = heads.reshape(batch * n_heads, -1)  # (B·H, k), row i·H + h is view (i, h)
    logits = views @ views.T / temperature  # (B·H, B·H)
    self_mask = torch.eye(batch * n_heads, dtype=torch.bool, device=heads.device)
    log_denominator = torch.logsumexp(logits.masked_fill(self_mask, float("-inf")), dim=1)  # (B·H,)
    # Same-item blocks: (B, H, H); their off-diagonal entries are the positives.
    same_item = torch.einsum("ihk,igk->ihg", heads, heads) / temperature
    positive_sum = same_item.sum(-1) - torch.diagonal(same_item, dim1=1, dim2=2)  # (B, H)
    per_view = log_denominator.reshape(batch, n_heads) - positive_sum / (n_heads - 1)  # (B, H) = ℓ_{i,h}
    return per_view.mean()


class HeadwiseNTXentLoss(nn.Module):
    def __init__(self, model: nn.Module, temperature: float = 0.1) -> None:
        """Head-wise NT-Xent ``L_view``: the coordinate blocks (heads) of one adapted embedding are
        treated as views of that item (SimCLR-style, without text augmentation). ``L_contrast``
        (see :func:`headwise_ntxent_loss`) is applied separately to the queries, the positives and
        the negatives of a batch, and ``L_view = (L_contrast(q) + L_contrast(p) + L_contrast(n)) / 3``.

        The objective is dense: it gives gradient whether or not a triplet satisfies its margin,
        with ``H(H-1)`` positive pairs per item.

        Args:
            model: a module mapping (batch, d) embeddings to unit-norm heads of shape (batch, H, k).
            temperature: ``τ`` (paper: 0.1).

        References:
            - Zhao, "DIVE: Embedding Compression via Self-Limiting Gradient Updates",
              arXiv:2605.20689, §3.1-3.2 and Appendix A.3.
            - Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations",
              ICML 2020 (NT-Xent).

        Requirements:
            1. A model with at least 2 heads.

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
                from embedtune.compress.losses import HeadwiseNTXentLoss

                adapter = DIVEAdapter(input_dim=64, dim=16, heads=4, hidden_dim=32)
                loss_fn = HeadwiseNTXentLoss(adapter, temperature=0.1)
                batch = {name: torch.randn(8, 64) for name in ("query", "positive", "negative")}
                loss = loss_fn(batch)
                loss.backward()
        """
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0; got {temperature}.")
        self.model = model
        self.temperature = float(temperature)

    def forward(self, features: dict[str, Tensor], labels: Tensor | None = None) -> Tensor:
        return self.compute_loss_from_embeddings(*(self.model(group) for group in features.values()))

    def compute_loss_from_embeddings(self, *groups: Tensor) -> Tensor:
        """Mean of ``L_contrast`` over groups, each of shape (batch, H, k)."""
        if not groups:
            raise ValueError("pass at least one group of heads.")
        return torch.stack([headwise_ntxent_loss(heads, self.temperature) for heads in groups]).mean()

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    @property
    def citation(self) -> str:
        return DIVE_CITATION
