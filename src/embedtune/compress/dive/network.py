"""DIVE's network: the multi-head residual adapter, its inference-only encoder, the corpus PCA
rotation of ``init="pca"``, and the small numeric helpers of the training algorithms.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embedtune.compress.pca import fit_sample_rows, principal_axes
from embedtune.compress.residual_mlp import ResidualMLP
from embedtune.evaluate.search import exact_search

# unit_float32, corpus_mean, centred_start_bias and nearest_neighbors serve the training algorithms of this package.
__all__ = ["DIVEAdapter", "DIVEEncoder", "corpus_pca_rotation", "pca_start_rows"]


class DIVEAdapter(nn.Module):
    """The residual adapter and its multi-head view (§3.1).

    ``forward(x)`` returns the unit-norm heads, shape (batch, H, k); ``head_one(x)`` is the
    deployed output, shape (batch, k).
    """

    def __init__(
        self,
        input_dim: int,
        dim: int,
        heads: int,
        hidden_dim: int,
        activation: Literal["gelu", "relu", "silu", "tanh"] = "gelu",
        normalize_input: bool = True,
    ) -> None:
        super().__init__()
        if dim * heads > input_dim:
            raise ValueError(f"dim * heads = {dim * heads} exceeds the input dimension {input_dim}.")
        self.input_dim, self.dim, self.heads, self.normalize_input = input_dim, dim, heads, normalize_input
        self.mlp = ResidualMLP(input_dim, hidden_dim, activation)
        self.rotation: torch.Tensor | None
        self.register_buffer("rotation", None)

    def set_rotation(self, rotation: torch.Tensor | np.ndarray | None) -> None:
        """Rotate inputs by ``rotation`` (d, d), orthogonal, before the MLP; None removes it."""
        if rotation is None:
            self.rotation = None
            return
        rotation = torch.as_tensor(np.asarray(rotation, dtype=np.float32))
        if rotation.shape != (self.input_dim, self.input_dim):
            raise ValueError(f"rotation must have shape ({self.input_dim}, {self.input_dim}); got {tuple(rotation.shape)}.")
        self.rotation = rotation.to(self.mlp.up.weight.device)

    def adapt(self, x: torch.Tensor) -> torch.Tensor:
        """``z' = z + W2 σ(W1 z + b1) + b2`` with ``z`` the (rotated) input, shape (batch, d)."""
        if self.normalize_input:
            x = F.normalize(x, p=2, dim=-1)
        if self.rotation is not None:
            x = x @ self.rotation
        return self.mlp(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        adapted = self.adapt(x)[:, : self.dim * self.heads]
        heads = adapted.reshape(len(x), self.heads, self.dim)  # (batch, H, k)
        return F.normalize(heads, p=2, dim=-1)

    def head_one(self, x: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """Head 1, shape (batch, k); ``normalize=False`` returns it before the L2 normalisation."""
        head = self.adapt(x)[:, : self.dim]
        return F.normalize(head, p=2, dim=-1) if normalize else head


class DIVEEncoder(nn.Module):
    """Inference-only DIVE: ``(batch, d)`` frozen embeddings to ``(batch, k)`` head 1.

    Head 1 has unit norm, or the input's norm with ``scale_by_input_norm`` (``output_norm='input'``).
    """

    def __init__(self, adapter: DIVEAdapter, scale_by_input_norm: bool = False) -> None:
        super().__init__()
        self.adapter = adapter
        self.scale_by_input_norm = scale_by_input_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = self.adapter.head_one(x)
        return head * x.norm(dim=-1, keepdim=True) if self.scale_by_input_norm else head


def pca_start_rows(doc_embeddings: np.ndarray, seed: int) -> np.ndarray:
    """The corpus rows DIVE's PCA start (``init='pca'``) is estimated from: the rotation and the centred start's mean.

    The ``pca`` baseline's sample (:func:`embedtune.compress.pca.fit_sample_rows`, ``'auto'``:
    ``min(N, max(65536, 100·d))`` rows), drawn with ``seed`` as that baseline draws it, so the
    centred start is still the ``pca`` baseline of the same seed. A corpus no larger than the sample
    is returned itself (no copy); a larger one, memory-mapped or not, has only the sampled rows read,
    in file order.
    """
    n, d = doc_embeddings.shape
    m = fit_sample_rows(n, d)
    if m >= n:
        return doc_embeddings
    picked = np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False))
    return np.asarray(doc_embeddings[picked])


def corpus_pca_rotation(doc_embeddings: np.ndarray, normalize_input: bool = True) -> np.ndarray:
    """The orthogonal PCA basis of the corpus, shape (d, d), columns by decreasing variance.

    Estimated on centred rows (normalised first when the adapter normalises its input), with
    the sign convention of :func:`embedtune.compress.pca.flip_signs`; applied as ``x @ R``
    without centring, so inner products between rotated rows equal the originals.
    """
    rows = doc_embeddings
    if normalize_input:
        rows = doc_embeddings / np.maximum(np.linalg.norm(doc_embeddings, axis=1, keepdims=True), 1e-12)
    _, components, _ = principal_axes(np.ascontiguousarray(rows, dtype=np.float32), doc_embeddings.shape[1], complete_basis=True)
    return np.ascontiguousarray(components.T, dtype=np.float32)


def unit_float32(X: np.ndarray) -> np.ndarray:
    """The unit rows of ``X`` as a C-contiguous float32 array."""
    X = np.asarray(X, dtype=np.float32)
    return np.ascontiguousarray(X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12), dtype=np.float32)


def corpus_mean(X: np.ndarray, normalize: bool, block: int = 16384) -> np.ndarray:
    """The mean row of ``X`` (of its unit rows with ``normalize``) in float64, block by block."""
    total = np.zeros(X.shape[1], dtype=np.float64)
    for lo in range(0, len(X), block):
        rows = np.asarray(X[lo : lo + block], dtype=np.float64)
        if normalize:
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        total += rows.sum(axis=0)
    return total / max(len(X), 1)


def centred_start_bias(doc_embeddings: np.ndarray, rotation: np.ndarray, normalize: bool) -> np.ndarray:
    """The adapter output bias ``−μR`` that turns the uncentred PCA start into the centred one (the ``pca`` baseline).

    ``μ`` is the mean (unit, with ``normalize``) row of the whole corpus, as the baseline's; float32, shape (d,).
    """
    return (-(corpus_mean(doc_embeddings, normalize) @ rotation.astype(np.float64))).astype(np.float32)


def nearest_neighbors(unit_rows: np.ndarray, k: int, queries: np.ndarray | None = None) -> np.ndarray:
    """Each query row's ``k`` nearest other rows of ``unit_rows`` by cosine (exact), shape (n_queries, min(k, n − 1)).

    ``queries`` are row indices into ``unit_rows`` (None: every row). The row itself is dropped.
    """
    queries = np.arange(len(unit_rows)) if queries is None else np.asarray(queries)
    k = min(k, len(unit_rows) - 1)
    _, found = exact_search(unit_rows[queries], unit_rows, k=k + 1)
    is_self = found == queries[:, None]
    order = np.argsort(is_self, axis=1, kind="stable")  # the row itself (if found) goes last
    return np.ascontiguousarray(np.take_along_axis(found, order, axis=1)[:, :k], dtype=np.int64)
