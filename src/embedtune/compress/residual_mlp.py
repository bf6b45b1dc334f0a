"""The identity-initialised residual MLP shared by DIVE and the supervised baselines.

``z' = z + W2 σ(W1 z + b1) + b2`` (DIVE paper, §3.1). ``W2`` and ``b2`` start at zero, so the
module is exactly the identity at step 0. The baselines use the same shape so that every
supervised method has the same parameter count (``2·d·r + r + d``).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ResidualMLP", "ACTIVATIONS"]

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}  # keys: choices.ACTIVATION_NAMES


class ResidualMLP(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, activation: Literal["gelu", "relu", "silu", "tanh"] = "gelu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}; got {activation!r}.")
        self.up = nn.Linear(dim, hidden_dim)
        self.act = ACTIVATIONS[activation]()
        self.down = nn.Linear(hidden_dim, dim)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)

    def residual(self, z: torch.Tensor) -> torch.Tensor:
        """The learned correction ``f(z)``; the output is ``z + f(z)``."""
        return self.down(self.act(self.up(z)))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + self.residual(z)

    def forward_columns(self, z: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
        """``forward(z)[:, columns]``, computing only those output columns (all when None).

        Methods that read a subset of the output (SMEC's later stages) skip the rest of the
        down-projection; the unread rows of ``W2`` get zero gradient either way.
        """
        if columns is None:
            return self.forward(z)
        hidden = self.act(self.up(z))
        return z[:, columns] + F.linear(hidden, self.down.weight[columns], self.down.bias[columns])

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
