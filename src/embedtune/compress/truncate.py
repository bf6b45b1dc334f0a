"""Prefix truncation: keep the first ``k`` coordinates and renormalise.

``truncate(x) = x[:k] / ‖x[:k]‖₂``. This is how a Matryoshka embedding (Kusupati et al. 2022)
is shortened, and how the DIVE paper evaluates adapters trained at full width
(Search-Adaptor). Without Matryoshka training it is the naive compression floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embedtune.compress.base import Compressor, CompressorConfig, TrainingData, check_output_dim
from embedtune.compress.export_layers import ExportLayer, linear_layers
from embedtune.compress.registry import register

__all__ = ["TruncateConfig", "TruncateCompressor"]


@dataclass
class TruncateConfig(CompressorConfig):
    """Only ``dim`` (the prefix length ``k``)."""

    def __post_init__(self) -> None:
        super().__post_init__()


@register
class TruncateCompressor(Compressor):
    """``x[:, :k]``, renormalised. Nothing is learned; ``fit`` only checks ``k <= d``."""

    method = "truncate"
    config_class = TruncateConfig
    supervised = False
    supports_unsupervised = True
    seed_dependent = False
    help = "the first k coordinates, renormalised"

    def _fit(self, train: TrainingData, val: TrainingData | None) -> None:
        check_output_dim(self.method, self.config.dim, train.dim)

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return X[:, : self.config.dim]

    def export_layers(self) -> list[ExportLayer]:
        """``Dense`` with the first ``k`` rows of ``I_d`` (no bias), then ``Normalize``."""
        self._check_fitted()
        assert self.input_dim_ is not None
        return linear_layers(np.eye(self.config.dim, self.input_dim_, dtype=np.float32))

    def transform_bytes(self) -> int:
        """0: keeping the first ``k`` coordinates needs no weights (its export's identity rows are a format's detail)."""
        self._check_fitted()
        return 0

    def _state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if state:
            raise ValueError(f"truncate has no weights; found {sorted(state)}.")
