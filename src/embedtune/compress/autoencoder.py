"""A standard autoencoder (Hinton & Salakhutdinov 2006) trained to reconstruct corpus embeddings.

Encoder ``e: d → r → k`` and decoder ``g: k → r → d`` (``r = d/2``, GELU), trained on the unit-
normalised frozen corpus embeddings ``c`` with the mean squared reconstruction error

    L_rec = 1/(N·d) Σ_n ‖g(e(c_n)) − c_n‖²₂ ,

by AdamW (batch 128, 50 epochs, lr 1e-3). The compressed embedding is ``e(x) / ‖e(x)‖₂``;
the decoder is only needed for training. This is the unsupervised "Autoencoder" row of the
DIVE paper's Table 4 (§4.8), which leaves the architecture to "a standard autoencoder"; the
widths and activation above are our choice, matched to the adapters' hidden width ``d/2``.
``history_`` records the mean reconstruction loss of every epoch.

References:
    - G. E. Hinton, R. R. Salakhutdinov. "Reducing the dimensionality of data with neural
      networks". Science 313 (5786), 2006.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embedtune.compress.base import Compressor, TrainingData
from embedtune.compress.export_layers import DenseLayer, ExportLayer, NormalizeLayer
from embedtune.compress.presets import presets_from_config
from embedtune.compress.registry import register
from embedtune.compress.residual_mlp import ACTIVATIONS
from embedtune.compress.training import (
    TrainedCompressorConfig,
    check_output_dim,
    load_module_state,
    module_state,
    resolve_device,
    run_epochs,
    seeded,
    transform_in_batches,
    unit_rows,
)

__all__ = ["AutoencoderConfig", "AutoencoderCompressor", "Autoencoder"]


@dataclass
class AutoencoderConfig(TrainedCompressorConfig):
    """Autoencoder settings; defaults are the DIVE paper's (§4.1: AdamW, batch 128, 50 epochs)."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "dive-paper": {"epochs": 50, "batch_size": 128, "learning_rate": 1e-3},
    }

    learning_rate: float = field(default=1e-3, metadata={"help": "AdamW learning rate."})


class Autoencoder(nn.Module):
    """``d → r → k`` encoder and ``k → r → d`` decoder."""

    def __init__(self, dim: int, hidden_dim: int, code_dim: int, activation: str = "gelu") -> None:
        super().__init__()
        act = ACTIVATIONS[activation]
        self.encoder = nn.Sequential(nn.Linear(dim, hidden_dim), act(), nn.Linear(hidden_dim, code_dim))
        self.decoder = nn.Sequential(nn.Linear(code_dim, hidden_dim), act(), nn.Linear(hidden_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


@register
class AutoencoderCompressor(Compressor):
    """Unsupervised autoencoder compressor.

    Attributes:
        model_ : :class:`Autoencoder`, the trained encoder and decoder.
        history_ : list of dict, one per epoch: ``{"stage", "epoch", "loss"}`` (mean MSE).
    """

    method = "autoencoder"
    non_finite_input_reaches_output = True
    config_class = AutoencoderConfig
    supervised = False
    supports_unsupervised = True
    help = "an MLP autoencoder trained to reconstruct the corpus"
    presets = presets_from_config(AutoencoderConfig)

    def __init__(self, config: AutoencoderConfig | None = None) -> None:
        super().__init__(config)
        self.model_: Autoencoder | None = None
        self.history_: list[dict[str, Any]] = []

    def _build(self, input_dim: int) -> Autoencoder:
        config: AutoencoderConfig = self.config  # type: ignore[assignment]
        with seeded(config.seed):
            return Autoencoder(input_dim, config.hidden_width(input_dim), config.dim, config.activation)

    def _fit(self, train: TrainingData, val: TrainingData | None) -> None:
        config: AutoencoderConfig = self.config  # type: ignore[assignment]
        check_output_dim(self.method, config.dim, train.dim)
        device = resolve_device(config.device)
        model = self._build(train.dim).to(device)
        corpus = unit_rows(train.doc_embeddings)

        def step(batch: torch.Tensor, epoch: int) -> dict[str, torch.Tensor]:
            x = corpus[batch].to(device)
            return {"loss": F.mse_loss(model(x), x)}

        model.train()
        self.history_ = run_epochs(model.parameters(), step, len(corpus), config, stage="reconstruction")
        self.model_ = model.eval()

    def _transform(self, X: np.ndarray) -> np.ndarray:
        assert self.model_ is not None
        device = next(self.model_.parameters()).device
        return transform_in_batches(self.model_.encoder, X, device)

    def export_layers(self) -> list[ExportLayer]:
        """The encoder: ``Normalize``, ``Dense(d → r, σ)``, ``Dense(r → k)``, ``Normalize``."""
        self._check_fitted()
        assert self.model_ is not None
        first, _, second = self.model_.encoder
        state = {name: value.detach().cpu().numpy() for name, value in self.model_.encoder.state_dict().items()}
        assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
        return [
            NormalizeLayer(),
            DenseLayer(state["0.weight"], state["0.bias"], activation=self.config.activation),  # type: ignore[attr-defined]
            DenseLayer(state["2.weight"], state["2.bias"]),
            NormalizeLayer(),
        ]

    def _state_dict(self) -> dict[str, np.ndarray]:
        assert self.model_ is not None
        return module_state("autoencoder", self.model_)

    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        assert self.input_dim_ is not None
        model = self._build(self.input_dim_)
        load_module_state("autoencoder", model, state)
        self.model_ = model.to(resolve_device(self.config.device)).eval()  # type: ignore[attr-defined]
