"""What the baselines built on a rotated residual adapter share: their map and its export.

Matryoshka-Adaptor, Search-Adaptor and SMEC all embed ``adapter(rotation(x))`` and keep some of its
output coordinates: the first ``k`` (the first two) or the ``k`` that SMEC's importance scores
selected. The map, its sentence-transformers export and the saved selected epoch are the same code
for all three, so they live here once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from embedtune.compress.export_layers import ExportLayer, residual_mlp_layers
from embedtune.compress.training import transform_in_batches


def selected_epoch_state(epoch: int | None) -> dict[str, np.ndarray]:
    """The saved form of a best-epoch selection (nothing when selection did not run)."""
    return {} if epoch is None else {"selected_epoch": np.array([epoch], dtype=np.int64)}


def selected_epoch_from_state(state: dict[str, np.ndarray]) -> int | None:
    return int(state["selected_epoch"][0]) if "selected_epoch" in state else None


class RotatedAdapterMixin:
    """``transform``, ``export_layers`` and ``fit_details`` of a method embedding ``adapter(rotation(x))[:, kept]``.

    The class provides ``adapter_`` (a :class:`embedtune.compress.residual_mlp.ResidualMLP`),
    ``rotation_`` (an :class:`embedtune.compress.selection.InputRotation`), ``selected_epoch_`` and a
    ``config`` with ``dim`` and ``activation``; it overrides :meth:`_kept_columns` when it keeps other
    coordinates than the first ``dim``.
    """

    adapter_: Any
    rotation_: Any
    selected_epoch_: int | None
    config: Any

    def _kept_columns(self) -> np.ndarray:
        return np.arange(self.config.dim)

    def fit_details(self) -> dict[str, Any]:
        details: dict[str, Any] = {"selected_epoch": self.selected_epoch_} if self.selected_epoch_ is not None else {}
        if getattr(self.rotation_, "matrix", None) is not None:
            details["start"] = f"{'centred' if self.rotation_.offset is not None else 'uncentred'} PCA"
        return details

    def _transform(self, X: np.ndarray) -> np.ndarray:
        assert self.adapter_ is not None
        device = next(self.adapter_.parameters()).device
        kept = torch.from_numpy(np.ascontiguousarray(self._kept_columns(), dtype=np.int64)).to(device)
        return transform_in_batches(lambda x: self.adapter_(self.rotation_(x))[:, kept], X, device)

    def export_layers(self) -> list[ExportLayer]:
        """``Normalize``, the adapter read at its kept outputs as two ``Dense`` (the input rotation
        folded in), ``Normalize``: see :func:`embedtune.compress.export_layers.residual_mlp_layers`."""
        self._check_fitted()  # type: ignore[attr-defined]
        assert self.adapter_ is not None
        return residual_mlp_layers(self.adapter_, self.config.activation, self._kept_columns(), self.rotation_.matrix,
                                   offset=self.rotation_.offset)
