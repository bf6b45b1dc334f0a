"""The uncompressed reference: the frozen backbone embedding, L2-normalised.

``frozen(x) = x / ‖x‖₂`` with output dimension ``d`` (the input's). The DIVE paper (§4.1)
reports it as "the uncompressed frozen representation"; it bounds what a compressor can keep.
The config's ``dim`` is ignored; :attr:`FrozenCompressor.output_dim` is the input dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embedtune.compress.base import Compressor, CompressorConfig, TrainingData
from embedtune.compress.export_layers import ExportLayer, NormalizeLayer
from embedtune.compress.registry import register

__all__ = ["FrozenConfig", "FrozenCompressor"]


@dataclass
class FrozenConfig(CompressorConfig):
    """No settings: the output is the normalised input. ``dim`` is ignored."""

    def __post_init__(self) -> None:
        super().__post_init__()


@register
class FrozenCompressor(Compressor):
    """Identity map; ``transform`` returns the unit-normalised (n, d) input."""

    method = "frozen"
    non_finite_input_reaches_output = True
    config_class = FrozenConfig
    supervised = False
    supports_unsupervised = True
    seed_dependent = False
    help = "the uncompressed frozen embedding (full d), the reference"

    @property
    def output_dim(self) -> int:
        """The input dimension ``d``, known after ``fit``."""
        self._check_fitted()
        assert self.input_dim_ is not None
        return self.input_dim_

    def _fit(self, train: TrainingData, val: TrainingData | None) -> None:
        """Nothing to learn; ``dim`` is ignored so that one ``--dim`` can be passed to every method."""

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return X

    def export_layers(self) -> list[ExportLayer]:
        """``[Normalize]`` (nothing at all after a base model that already normalises)."""
        self._check_fitted()
        return [NormalizeLayer()]

    def _state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if state:
            raise ValueError(f"frozen has no weights; found {sorted(state)}.")
