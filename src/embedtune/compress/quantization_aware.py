"""Quantisation-aware training for post-hoc adapters: train head 1 for the precision it is deployed at.

DIVE's hinge ranks the positive above the negative by the cosine of float head-1 vectors, but a
deployment at ``binary`` precision ranks by the sign bits (Hamming) and by a float query against
the ±1 document signs (asymmetric rescoring); at ``int8`` by a float query against decoded
codes. :func:`quantization_aware_triplet_loss` puts that quantiser inside the hinge:

- ``"binary"``: a straight-through sign on head 1, ``b = h + (sign(h)/√k − h).detach()``: the
  forward pass sees the unit ±1 vector, the gradient passes to ``h`` unchanged. The hinge is the
  mean of the asymmetric term (float query, binary documents) and the symmetric one (both
  binary, the Hamming order).
- ``"int8"``: straight-through fake quantisation of the documents to 256 levels per dimension,
  with the ranges of the current batch (detached), as FAISS ``SQ8`` stores them; the query
  stays float.
- ``None``: the plain hinge (:func:`~embedtune.compress.losses.self_limiting_triplet_loss`).

The geometry and view terms stay on the float heads, and :func:`deployed_view` lets epoch
selection score what is deployed (binary: float queries against sign documents; int8: decoded
codes, corpus-calibrated).

This module holds only the training-time simulation of the deployed codes: the codecs that are
deployed live in :mod:`embedtune.index.codecs`, a layer above (an index applies a fitted
compressor), and ``tests/test_quantization_aware.py`` checks that both give the same SQ8 codes.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from embedtune.compress.choices import QUANTIZATION_AWARE, check_quantization_aware  # noqa: F401 (re-exported)
from embedtune.compress.losses import self_limiting_triplet_loss

__all__ = [
    "QUANTIZATION_AWARE",
    "check_quantization_aware",
    "straight_through_sign",
    "straight_through_int8",
    "quantization_aware_triplet_loss",
    "deployed_view",
]



def straight_through_sign(x: Tensor) -> Tensor:
    """Forward ``sign(x) · ‖x‖ / √k`` per row (a ±1 vector with ``x``'s norm), backward the identity."""
    k = x.shape[-1]
    binary = torch.where(x > 0, 1.0, -1.0).to(x.dtype) * (x.norm(dim=-1, keepdim=True) / math.sqrt(k))
    return x + (binary - x).detach()


def straight_through_int8(x: Tensor, vmin: Tensor | None = None, vmax: Tensor | None = None) -> Tensor:
    """Forward FAISS ``SQ8`` encode + decode with per-dimension ranges (default: the batch's), backward the identity."""
    with torch.no_grad():
        lo = x.min(dim=0).values if vmin is None else vmin
        hi = x.max(dim=0).values if vmax is None else vmax
        diff = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
        codes = torch.floor(255 * ((x - lo) / diff).clamp(0, 1))
        decoded = lo + (codes + 0.5) / 255 * diff
    return x + (decoded - x).detach()


def quantization_aware_triplet_loss(
    mode: Literal["binary", "int8"] | None,
    query: Tensor,
    positive: Tensor,
    negative: Tensor,
    margin: float,
    kind: Literal["hinge", "softplus"] = "hinge",
) -> tuple[Tensor, Tensor]:
    """The self-limiting hinge on head 1 as deployed at precision ``mode``: ``(loss, active_ratio)``.

    ``active_ratio`` is the float hinge's for ``None``; for ``binary`` and ``int8`` it counts the
    triplets active in the term the query sees as deployed (asymmetric).
    """
    check_quantization_aware(mode)
    if mode is None:
        return self_limiting_triplet_loss(query, positive, negative, margin, kind)
    if mode == "binary":
        positive_b, negative_b = straight_through_sign(positive), straight_through_sign(negative)
        asymmetric, active_ratio = self_limiting_triplet_loss(query, positive_b, negative_b, margin, kind)
        symmetric, _ = self_limiting_triplet_loss(straight_through_sign(query), positive_b, negative_b, margin, kind)
        return 0.5 * (asymmetric + symmetric), active_ratio
    docs = straight_through_int8(torch.cat([positive, negative]))
    return self_limiting_triplet_loss(query, *docs.split(len(positive)), margin, kind)


def deployed_view(mode: Literal["binary", "int8"] | None, queries: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(queries, docs)`` whose inner products rank as the deployment at ``mode`` does (numpy, float32).

    ``binary``: float queries, ±1 documents (asymmetric rescoring's order); ``int8``: float
    queries, documents decoded from SQ8 codes calibrated on ``docs``; ``None``: unchanged.
    """
    check_quantization_aware(mode)
    if mode is None:
        return queries, docs
    docs = np.asarray(docs, dtype=np.float32)
    if mode == "binary":
        return queries, np.where(docs > 0, 1.0, -1.0).astype(np.float32)
    lo, hi = docs.min(axis=0), docs.max(axis=0)
    diff = np.where(hi > lo, hi - lo, 1.0).astype(np.float32)
    codes = np.floor(255 * np.clip((docs - lo) / diff, 0, 1))
    return queries, (lo + (codes + 0.5) / 255 * diff).astype(np.float32)
