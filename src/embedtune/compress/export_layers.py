"""A compressor's fitted map as plain layers: what sentence-transformers' built-in modules can run.

Every registered compressor describes its ``transform`` as a short list of two layer kinds
(:meth:`embedtune.compress.base.Compressor.export_layers`):

- :class:`NormalizeLayer`: ``x / ‖x‖₂`` (sentence-transformers' ``Normalize``);
- :class:`DenseLayer`: ``σ(W x + b) + P x`` (sentence-transformers' ``Dense`` with
  ``activation_function=σ`` and, with a residual projection ``P``, ``use_residual=True``).

:func:`embedtune.compress.st_export.export_sentence_transformer` turns them into those modules,
so an exported model loads with plain ``SentenceTransformer(path)``: no ``trust_remote_code``
and no embedtune. This module needs numpy only; :func:`apply_layers` runs a list on arrays (the
reference the export is tested against).

The constructions:

- PCA ``W (x − μ)``: one ``Dense`` with weight ``W`` and bias ``−W μ`` (zero bias uncentred);
- truncation ``x[:k]``: one bias-free ``Dense`` whose weight is the first ``k`` rows of ``I_d``;
- the autoencoder's encoder: its two ``Linear`` layers as two ``Dense``;
- a residual adapter read at columns ``c`` (DIVE, Matryoshka-Adaptor, Search-Adaptor, SMEC),
  ``y = (z + W2 σ(W1 z + b1) + b2)[c]`` with ``z = R x`` (``R`` an optional input rotation, the
  identity otherwise): see :func:`residual_adapter_layers`.

Each list ends with :class:`NormalizeLayer`, as ``transform`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "NormalizeLayer", "DenseLayer", "ExportLayer", "apply_layers", "linear_layers", "residual_adapter_layers", "residual_mlp_layers",
]

_ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))),
    "relu": lambda x: np.maximum(x, 0.0),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
}


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    return np.vectorize(erf, otypes=[np.float64])(x)


@dataclass(frozen=True)
class NormalizeLayer:
    """``x / ‖x‖₂`` row-wise. A leading one is dropped when the base model already ends with ``Normalize``."""

    def apply(self, x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@dataclass(frozen=True)
class DenseLayer:
    """``σ(W x + b) + P x``.

    Attributes:
        weight: ``W``, shape (out, in).
        bias: ``b``, shape (out,), or None for no bias.
        activation: ``σ``, a key of :data:`embedtune.compress.residual_mlp.ACTIVATIONS`, or None
            (the identity).
        residual: ``P``, shape (out, in), or None (no residual term). sentence-transformers adds
            the input unprojected when ``in == out``, so a residual needs ``in != out``.
    """

    weight: np.ndarray
    bias: np.ndarray | None = None
    activation: str | None = None
    residual: np.ndarray | None = None

    def __post_init__(self) -> None:
        out_features, in_features = np.shape(self.weight)
        if self.bias is not None and np.shape(self.bias) != (out_features,):
            raise ValueError(f"DenseLayer: bias has shape {np.shape(self.bias)}; expected ({out_features},).")
        if self.activation is not None and self.activation not in _ACTIVATIONS:
            raise ValueError(f"DenseLayer: activation must be one of {sorted(_ACTIVATIONS)} or None; got {self.activation!r}.")
        if self.residual is not None:
            if np.shape(self.residual) != (out_features, in_features):
                raise ValueError(f"DenseLayer: residual has shape {np.shape(self.residual)}; expected {(out_features, in_features)}.")
            if out_features == in_features:
                raise ValueError("DenseLayer: a residual projection needs in != out (sentence-transformers adds the input "
                                 "itself when they are equal); pad the output with a zero row.")

    @property
    def in_features(self) -> int:
        return int(np.shape(self.weight)[1])

    @property
    def out_features(self) -> int:
        return int(np.shape(self.weight)[0])

    def apply(self, x: np.ndarray) -> np.ndarray:
        out = x @ np.asarray(self.weight, dtype=np.float64).T
        if self.bias is not None:
            out = out + np.asarray(self.bias, dtype=np.float64)
        if self.activation is not None:
            out = _ACTIVATIONS[self.activation](out)
        if self.residual is not None:
            out = out + x @ np.asarray(self.residual, dtype=np.float64).T
        return out


ExportLayer = NormalizeLayer | DenseLayer


def apply_layers(layers: Sequence[ExportLayer], X: np.ndarray) -> np.ndarray:
    """Run ``layers`` on the rows of ``X`` in float64 (a reference for tests), float32 out."""
    out = np.asarray(X, dtype=np.float64)
    for layer in layers:
        out = layer.apply(out)
    return out.astype(np.float32)


def linear_layers(weight: np.ndarray, bias: np.ndarray | None = None, normalize_input: bool = False) -> list[ExportLayer]:
    """``[Normalize], Dense(W, b), Normalize``: a linear map whose output is L2-normalised."""
    head: list[ExportLayer] = [NormalizeLayer()] if normalize_input else []
    return [*head, DenseLayer(_f32(weight), None if bias is None else _f32(bias)), NormalizeLayer()]


def residual_adapter_layers(
    up_weight: np.ndarray,
    up_bias: np.ndarray,
    down_weight: np.ndarray,
    down_bias: np.ndarray,
    activation: str,
    columns: np.ndarray,
    rotation: np.ndarray | None = None,
    normalize_input: bool = True,
    offset: np.ndarray | None = None,
) -> list[ExportLayer]:
    """``y = (z + W2 σ(W1 z + b1) + b2)[c]``, ``z = xR + o``, normalised, as two ``Dense`` layers (DIVE's construction).

    - ``[Normalize]`` when the adapter normalises its input;
    - ``Dense(d → r + k, σ, residual)`` with weight ``[W1 Rᵀ; 0]``, bias ``[b1; 0]`` and residual
      projection ``[0; (Rᵀ)[c]]``: it outputs ``[σ(W1 z + b1); z[c]]`` exactly, since ``σ(0) = 0``
      for every supported activation (the rotation is folded into both weights);
    - ``Dense(r + k → k)`` with weight ``[W2[c], I_k]`` and bias ``b2[c]``: ``z[c] + (W2 σ(·) + b2)[c]``;
    - ``Normalize``.

    When ``r + k == d`` one zero row is appended to the first layer's output, because
    sentence-transformers adds the input itself (not a projection) when in == out.

    Args:
        up_weight, up_bias: ``W1`` (r, d) and ``b1`` (r,).
        down_weight, down_bias: ``W2`` (d, r) and ``b2`` (d,).
        activation: ``σ``, a key of :data:`embedtune.compress.residual_mlp.ACTIVATIONS`.
        columns: the output coordinates read, ``c`` (k,) (``arange(k)`` for a prefix).
        rotation: ``R`` (d, d) applied as ``x @ R`` before the adapter, or None.
        normalize_input: whether the adapter L2-normalises ``x`` first.
        offset: ``o`` (d,), the centred start's shift after the rotation, or None. It folds into
            the biases: ``W1 o`` into the first layer's, ``o[c]`` into the second's.
    """
    up_weight, down_weight = _f32(up_weight), _f32(down_weight)
    r, d = up_weight.shape
    columns = np.asarray(columns, dtype=np.int64)
    k = len(columns)
    pad = 1 if r + k == d else 0
    # z = R^T x as a column: the rows of the pass-through are (R^T)[c], and W1 z = (W1 R^T) x.
    to_z = np.eye(d, dtype=np.float64) if rotation is None else np.asarray(rotation, dtype=np.float64).T
    shift = np.zeros(d) if offset is None else np.asarray(offset, dtype=np.float64)
    expand = DenseLayer(
        weight=_f32(np.concatenate([up_weight.astype(np.float64) @ to_z, np.zeros((k + pad, d))])),
        bias=_f32(np.concatenate([np.asarray(up_bias, dtype=np.float64) + up_weight.astype(np.float64) @ shift, np.zeros(k + pad)])),
        activation=activation,
        residual=_f32(np.concatenate([np.zeros((r, d)), to_z[columns], np.zeros((pad, d))])),
    )
    head = DenseLayer(
        weight=_f32(np.concatenate([down_weight[columns], np.eye(k), np.zeros((k, pad))], axis=1)),
        bias=_f32(np.asarray(down_bias, dtype=np.float64)[columns] + shift[columns]),
    )
    return [*([NormalizeLayer()] if normalize_input else []), expand, head, NormalizeLayer()]


def residual_mlp_layers(mlp: Any, activation: str, columns: np.ndarray, rotation: Any = None, normalize_input: bool = True,
                        offset: Any = None) -> list[ExportLayer]:
    """:func:`residual_adapter_layers` of a :class:`~embedtune.compress.residual_mlp.ResidualMLP` (its ``up`` and ``down``)."""
    state = {name: _numpy(value) for name, value in mlp.state_dict().items()}
    return residual_adapter_layers(
        state["up.weight"], state["up.bias"], state["down.weight"], state["down.bias"], activation, columns,
        None if rotation is None else _numpy(rotation), normalize_input, None if offset is None else _numpy(offset),
    )


def _numpy(value: Any) -> np.ndarray:
    """A torch tensor (any device) or array as a float32 numpy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float32)


def _f32(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(array), dtype=np.float32)
