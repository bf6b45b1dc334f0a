"""DIVE as built-in sentence-transformers modules, so an exported model loads without embedtune.

DIVE's head 1, ``normalize((z + W2 σ(W1 z + b1) + b2)[:k])`` with ``z = xR`` (``R`` the PCA
rotation with ``init="pca"``, the identity otherwise), is written as:

- ``Normalize`` (only when ``normalize_input`` and the base does not already end with one);
- ``Dense(d -> r + k, σ, use_residual=True)`` with weight ``[W1 Rᵀ; 0]``, bias ``[b1; 0]`` and
  residual projection ``[0; (Rᵀ)[:k]]``, which outputs ``[σ(W1 z + b1); z[:k]]`` exactly, since
  ``σ(0) = 0`` for every supported activation;
- ``Dense(r + k -> k, identity)`` with weight ``[W2[:k], I_k]`` and bias ``b2[:k]``, which
  gives head 1 of ``z + W2 σ(W1 z + b1) + b2``;
- ``Normalize``.

The same construction exports every residual adapter (Matryoshka-Adaptor, Search-Adaptor, SMEC
at its selected coordinates): :func:`embedtune.compress.export_layers.residual_adapter_layers`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from embedtune.compress.st_export import builtin_modules

if TYPE_CHECKING:
    import torch

    from embedtune.compress.dive import DIVECompressor

__all__ = ["dive_builtin_modules"]


def dive_builtin_modules(compressor: "DIVECompressor", input_is_normalized: bool) -> "list[torch.nn.Module]":
    """``[Normalize], expand Dense, head Dense, Normalize`` equal to ``compressor.transform``."""
    layers = compressor.export_layers()
    if layers is None:
        raise ValueError("DIVE with output_norm='input' has no built-in sentence-transformers form (it scales by the input norm).")
    return builtin_modules(layers, input_is_normalized)
