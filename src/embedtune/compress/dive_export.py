"""DIVE as built-in sentence-transformers modules, so an exported model loads without embedtune.

- ``Normalize`` (only when ``normalize_input`` and the base does not already end with one);
- ``Dense(d -> d, bias=False)`` with weight ``R^T`` (only with ``init="pca"``);
- ``Dense(d -> r + k, σ, use_residual=True)`` with weight ``[W1; 0]``, bias ``[b1; 0]`` and
  residual projection ``[0; I_k 0]``, which outputs ``[σ(W1 z + b1); z[:k]]`` exactly, since
  ``σ(0) = 0`` for every supported activation;
- ``Dense(r + k -> k, identity)`` with weight ``[W2[:k], I_k]`` and bias ``b2[:k]``, which
  gives head 1 of ``z + W2 σ(W1 z + b1) + b2``;
- ``Normalize``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from sentence_transformers.sentence_transformer.modules import Dense, Normalize

from embedtune.compress.residual_mlp import ACTIVATIONS

if TYPE_CHECKING:
    from embedtune.compress.dive import DIVECompressor

__all__ = ["dive_builtin_modules"]


def dive_builtin_modules(compressor: "DIVECompressor", input_is_normalized: bool) -> list[torch.nn.Module]:
    """``[Normalize], [rotation Dense], expand Dense, head Dense, Normalize`` equal to ``compressor.transform``."""
    adapter = compressor.adapter_
    mlp = adapter.mlp
    k, d, r = adapter.dim, adapter.input_dim, mlp.up.out_features
    # Dense adds its input unprojected when in == out; one zero row keeps the projection.
    pad = 1 if r + k == d else 0
    width = r + k + pad
    with torch.no_grad():
        up_weight, up_bias = mlp.up.weight.detach().cpu(), mlp.up.bias.detach().cpu()
        down_weight, down_bias = mlp.down.weight.detach().cpu(), mlp.down.bias.detach().cpu()
        expand = Dense(d, width, activation_function=ACTIVATIONS[compressor.config.activation](), use_residual=True)
        expand.linear.weight.copy_(torch.cat([up_weight, torch.zeros(k + pad, d)]))  # (width, d)
        expand.linear.bias.copy_(torch.cat([up_bias, torch.zeros(k + pad)]))
        expand.residual.weight.copy_(torch.cat([torch.zeros(r, d), torch.eye(k, d), torch.zeros(pad, d)]))  # passes z[:k] through
        head = Dense(width, k, activation_function=None)
        head.linear.weight.copy_(torch.cat([down_weight[:k], torch.eye(k), torch.zeros(k, pad)], dim=1))  # (k, width)
        head.linear.bias.copy_(down_bias[:k])
    modules: list[torch.nn.Module] = []
    if adapter.normalize_input and not input_is_normalized:
        modules.append(Normalize())
    if adapter.rotation is not None:
        # init="pca": z ↦ zR is a bias-free Dense with weight Rᵀ.
        rotate = Dense(d, d, bias=False, activation_function=None)
        with torch.no_grad():
            rotate.linear.weight.copy_(adapter.rotation.detach().cpu().T)
        modules.append(rotate)
    return [*modules, expand, head, Normalize()]
