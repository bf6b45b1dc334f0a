"""DIVE: a multi-head residual adapter trained with self-limiting updates (Zhao, arXiv:2605.20689).

The adapter is the identity-initialised residual MLP ``z' = z + W2 σ(W1 z + b1) + b2`` (§3.1).
Its first ``k·H`` coordinates are cut into ``H`` heads of ``k`` coordinates, each L2-normalised.
Training uses every head::

    L = L_triplet + λ·L_view + γ·L_geo            (§3.2)

with the self-limiting hinge on head 1, head-wise NT-Xent across heads, and geometry
distillation from the frozen space. Inference keeps head 1 only, so a fitted DIVE stores one
``k``-dimensional vector per item, and at initialisation ``transform(X) == normalize(X[:, :k])``
(with ``normalize_input`` the input is normalised first, which changes the result only by float
rounding).

Options beyond the paper (all off by default, so the defaults stay the paper's recipe):

- ``init="pca"``: rotate the (normalised) input by the orthogonal PCA basis ``R`` of the training
  corpus before the adapter, ``z' = zR + W2 σ(W1 zR + b1) + b2``. ``R`` is estimated on centred
  corpus embeddings and applied without centring, so every full-dimensional inner product is
  unchanged, and at initialisation head 1 is the projection on the top-``k`` principal
  directions instead of an arbitrary ``k`` coordinates.
- ``epoch_selection="best"``: score validation nDCG@10 before training (epoch 0) and after every
  epoch, and keep the best weights. Without a validation set, ``selection_fraction`` of the
  training queries are held out for it (query-disjoint, by a seeded hash). With ``init="pca"``
  the epoch-0 candidate is the uncentred PCA projection, so the result is never worse than it
  on the selection queries.
- ``output_norm="input"``: scale the unit head 1 by the input's norm, for dot-product models
  (PACE Stage II) whose embedding norms carry meaning.

**Unsupervised mode** (``mode="unsupervised"``, :meth:`DIVECompressor.fit_unsupervised`, the
``unsupervised`` preset): corpus embeddings only, no queries and no labels. The triplet term,
which needs labels, is replaced by neighbour-rank distillation on the corpus
(:mod:`embedtune.compress.losses.neighbor_rank_distillation`)::

    L = L_rank + λ·L_view + γ·L_geo

For each batch of anchor documents, the pool is the anchors plus each one's ``neighbors``
nearest frozen-space neighbours; ``L_rank`` makes head 1 rank each anchor's pool as the frozen
space does (softmax KL of the standardised similarities at temperature ``neighbor_temperature``,
so the same τ suits isotropic and anisotropic embedding spaces), and geometry distillation and
the view loss are DIVE's, on the anchors. Both PCA projections are candidate starts (the
uncentred one of ``init="pca"``, and the centred one, i.e. the ``pca`` baseline, obtained by
setting the adapter's output bias to ``−μR``); the one that scores better on held-out documents
is trained. Selection (``epoch_selection="best"``) holds out ``holdout_docs`` documents (at most
a tenth of the corpus) that are never trained on, and keeps the start or epoch with the lowest
held-out rank KL: ``L_rank`` of each held-out document against the whole corpus, i.e. how far
the compressed ranking of the corpus around it is from the frozen one. It is a corpus-only
signal, so the result is never below the better PCA projection on it; with ``patience`` training stops
once the signal has not improved for that many epochs. (Held-out neighbour
recall@10 is logged too; it flattens after a few epochs while the ranking keeps improving, so it
is not selected on.) Corpora above ``max_train_docs`` train on a seeded sample.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embedtune.compress.base import Compressor, CompressorConfig, TrainingData
from embedtune.compress.export_layers import ExportLayer, residual_mlp_layers
from embedtune.compress.losses import geometry_distillation_loss, headwise_ntxent_loss, neighbor_rank_distillation_loss
from embedtune.compress.losses.self_limiting_triplet import TRIPLET_KINDS
from embedtune.compress.pca import principal_axes
from embedtune.compress.quantization_aware import check_quantization_aware, deployed_view, quantization_aware_triplet_loss
from embedtune.compress.presets import MiningOptions, Preset
from embedtune.compress.registry import register
from embedtune.compress.residual_mlp import ACTIVATIONS, ResidualMLP
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.evaluate.search import exact_search
from embedtune.io import atomic_write_bytes
from embedtune.runtime import progress_bar

logger = logging.getLogger(__name__)

__all__ = ["DIVEConfig", "DIVECompressor", "DIVEAdapter", "DIVEEncoder", "resolve_heads", "TRAINING_LOG_NAME", "ROBUST"]

TRAINING_LOG_NAME = "training_log.jsonl"
# The label of each training phase's progress bar.
_PHASE_LABELS = {"train": "DIVE epochs", "select": "DIVE epoch selection", "refit": "DIVE refit"}
INIT_KINDS = ("identity", "pca")
EPOCH_SELECTIONS = ("last", "best", "val")
OUTPUT_NORMS = ("unit", "input")
MODES = ("supervised", "unsupervised")
# The unsupervised mode's held-out signals: neighbour recall@10, and the rank KL in chunks of held-out rows.
_RECALL_AT = 10
_KL_CHUNK = 256
# Rows per forward pass in transform(); bounds the activation memory, not the result.
_TRANSFORM_BATCH = 8192


@dataclass
class DIVEConfig(CompressorConfig):
    """DIVE hyperparameters; the defaults are the paper's single global configuration (Table 2, §4.1)."""

    dim: int = field(default=128, metadata={"help": "Output dimension k: the size of each head and of the stored vector."})
    seed: int = field(default=2027, metadata={"help": "Seed for the adapter initialisation and the triplet order."})
    heads: int | str = field(
        default="auto",
        metadata={"help": "Number of heads H (implicit views), or 'auto' (default) for the largest H <= min(max_heads, d // k): the paper's H=4 wherever k*4 <= d. A fixed H needs dim*heads <= input dim."},
    )
    max_heads: int = field(default=4, metadata={"help": "Upper bound on H when heads='auto'."})
    margin: float = field(default=0.7, metadata={"help": "Hinge margin m: a triplet with Δ >= m stops producing gradient."})
    view_weight: float = field(default=0.01, metadata={"help": "λ, weight of the head-wise NT-Xent view loss (0 disables it)."})
    geometry_weight: float = field(default=10.0, metadata={"help": "γ, weight of the geometry distillation loss (0 disables it)."})
    temperature: float = field(default=0.1, metadata={"help": "τ, NT-Xent temperature."})
    learning_rate: float = field(default=2e-4, metadata={"help": "AdamW learning rate."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (torch's default)."})
    batch_size: int = field(default=128, metadata={"help": "Triplets per optimisation step."})
    epochs: int = field(default=50, metadata={"help": "Passes over the training triplets (0 keeps the identity adapter)."})
    hidden_dim: int | None = field(default=None, metadata={"help": "Residual MLP hidden width r; None means d // 2, as in the paper."})
    activation: str = field(default="gelu", metadata={"help": f"Residual MLP activation σ, one of {sorted(ACTIVATIONS)}."})
    normalize_input: bool = field(default=True, metadata={"help": "L2-normalise the frozen embedding before the adapter."})
    triplet_loss: str = field(
        default="hinge",
        metadata={"help": "'hinge' (self-limiting, DIVE) or 'softplus' (the 'w/o self-limiting' ablation, §4.4)."},
    )
    init: str = field(
        default="identity",
        metadata={"help": "'identity' (the paper: head 1 starts as the first k input coordinates) or 'pca' (rotate the input by the corpus PCA basis first)."},
    )
    epoch_selection: str = field(
        default="last",
        metadata={"help": "'last' (the paper: keep the final epoch), 'best' (keep the epoch, 0 included, with the best nDCG@10 on "
                  "held-out training queries, then refit on all), or 'val' (select on the val queries given to fit; no refit)."},
    )
    selection_fraction: float = field(
        default=0.2,
        metadata={"help": "With epoch_selection='best' and no validation set: fraction of training queries held out to select on."},
    )
    output_norm: str = field(
        default="unit",
        metadata={"help": "'unit' (L2-normalised head 1, cosine) or 'input' (head 1 scaled by the input's norm, for dot-product models)."},
    )
    quantization_aware: str | None = field(
        default=None,
        metadata={"help": "Train head 1 for the precision it is deployed at: None (float), 'binary' (straight-through sign) or "
                  "'int8' (fake quantisation); epoch selection then scores that precision (compress/quantization_aware.py)."},
    )
    mode: str = field(
        default="supervised",
        metadata={"help": "'supervised' (the paper: triplets from labels) or 'unsupervised' (corpus embeddings only: "
                  "neighbour-rank distillation replaces the triplet term; epochs are passes over the corpus)."},
    )
    neighbors: int = field(default=20, metadata={"help": "Unsupervised mode: frozen-space nearest neighbours of each anchor in its pool."})
    neighbor_temperature: float = field(
        default=0.5,
        metadata={"help": "Unsupervised mode: temperature τ of the neighbour-rank softmaxes, in standard deviations of each "
                  "anchor's similarities over its pool."},
    )
    holdout_docs: int = field(
        default=1000,
        metadata={"help": "Unsupervised mode with epoch_selection='best': documents held out (at most a tenth of the corpus) "
                  "to select the start and the epoch on (their rank KL against the corpus)."},
    )
    max_train_docs: int | None = field(
        default=50000, metadata={"help": "Unsupervised mode: train on a seeded sample of this many documents (None: all)."}
    )
    patience: int | None = field(
        default=None,
        metadata={"help": "Unsupervised mode with a selection signal: stop once it has not improved for this many epochs "
                  "(None: run every epoch). `epochs` is then the cap."},
    )
    device: str = field(default="auto", metadata={"help": "Torch device for training and transform: 'auto' (CUDA when available), 'cpu', 'cuda', ..."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar over epochs."})

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        # The paper's single global configuration (Table 2, §4.1): the dataclass defaults.
        "paper": {},
        # Selected on validation queries only (benchmarks/dive_beyond.toml: 10 candidates over init,
        # objective and margin, SciFact + ArguAna, MiniLM), then scored once on held-out test;
        # see benchmarks/RESULTS.md, "Beyond the paper".
        "best": {"init": "pca", "margin": 0.4},
        # "best" plus the safety net of issue 9 §6: keep the best epoch (0 = the PCA projection)
        # on half of the training queries, then refit. With ROBUST's false-negative filter and
        # triplet cap it does not collapse where the paper recipe does, and it costs nothing
        # significant on SciFact/ArguAna held-out test. The default (see ROBUST below).
        "robust": {"init": "pca", "margin": 0.4, "epoch_selection": "best", "selection_fraction": 0.5},
        # No labels: neighbour-rank distillation on the corpus from the better PCA start, the
        # epoch (0 included) selected on held-out documents (benchmarks/RESULTS.md, "Unsupervised
        # compression (issue 18)"). At most 50 corpus passes at lr 1e-3, batch 256 anchors,
        # stopping 5 epochs after the last improvement of the held-out signal.
        "unsupervised": {"mode": "unsupervised", "init": "pca", "epoch_selection": "best", "learning_rate": 1e-3,
                         "epochs": 50, "patience": 5, "batch_size": 256},
    }

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "DIVEConfig":
        """A config from a named preset (see ``DIVEConfig.PRESETS``) plus field overrides."""
        if name not in cls.PRESETS:
            raise ValueError(f"DIVEConfig: unknown preset {name!r}; choose one of: {', '.join(sorted(cls.PRESETS))}.")
        return cls(**{**cls.PRESETS[name], **overrides})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init not in INIT_KINDS:
            raise ValueError(f"init must be one of {list(INIT_KINDS)}; got {self.init!r}.")
        if self.epoch_selection not in EPOCH_SELECTIONS:
            raise ValueError(f"epoch_selection must be one of {list(EPOCH_SELECTIONS)}; got {self.epoch_selection!r}.")
        if not isinstance(self.selection_fraction, (int, float)) or not 0 < self.selection_fraction < 1:
            raise ValueError(f"selection_fraction must be a number in (0, 1); got {self.selection_fraction!r}.")
        if self.output_norm not in OUTPUT_NORMS:
            raise ValueError(f"output_norm must be one of {list(OUTPUT_NORMS)}; got {self.output_norm!r}.")
        check_quantization_aware(self.quantization_aware)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}; got {self.mode!r}.")
        for name in ("neighbors", "holdout_docs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}.")
        if self.patience is not None and (isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1):
            raise ValueError(f"patience must be a positive integer or None; got {self.patience!r}.")
        if self.max_train_docs is not None and (isinstance(self.max_train_docs, bool) or not isinstance(self.max_train_docs, int) or self.max_train_docs < 2):
            raise ValueError(f"max_train_docs must be an integer >= 2 or None; got {self.max_train_docs!r}.")
        if not isinstance(self.neighbor_temperature, (int, float)) or not math.isfinite(self.neighbor_temperature) or self.neighbor_temperature <= 0:
            raise ValueError(f"neighbor_temperature must be a finite number > 0; got {self.neighbor_temperature!r}.")
        if self.heads != "auto" and (isinstance(self.heads, bool) or not isinstance(self.heads, int) or self.heads < 1):
            raise ValueError(f"heads must be a positive integer or 'auto'; got {self.heads!r}.")
        if isinstance(self.max_heads, bool) or not isinstance(self.max_heads, int) or self.max_heads < 1:
            raise ValueError(f"max_heads must be a positive integer; got {self.max_heads!r}.")
        for name in ("view_weight", "geometry_weight", "weight_decay"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0; got {value!r}.")
        for name in ("temperature", "learning_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0; got {value!r}.")
        if not isinstance(self.margin, (int, float)) or not math.isfinite(self.margin):
            raise ValueError(f"margin must be a finite number; got {self.margin!r}.")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer; got {self.batch_size!r}.")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 0:
            raise ValueError(f"epochs must be an integer >= 0; got {self.epochs!r}.")
        if self.hidden_dim is not None and (isinstance(self.hidden_dim, bool) or not isinstance(self.hidden_dim, int) or self.hidden_dim < 1):
            raise ValueError(f"hidden_dim must be a positive integer or None; got {self.hidden_dim!r}.")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}; got {self.activation!r}.")
        if self.triplet_loss not in TRIPLET_KINDS:
            raise ValueError(f"triplet_loss must be one of {list(TRIPLET_KINDS)}; got {self.triplet_loss!r}.")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be a torch device string such as 'cpu', 'cuda' or 'auto'; got {self.device!r}.")
        # The view loss needs two views of each item (Appendix A.3: H = 1 has no positive pair).
        if self.view_weight > 0 and (self.heads == 1 or (self.heads == "auto" and self.max_heads < 2)):
            raise ValueError(
                "the view loss (view_weight > 0) needs at least 2 heads; set heads >= 2 (or max_heads >= 2 with "
                "heads='auto'), or set view_weight=0 to train without it."
            )
        if self.heads != "auto" and self.max_heads != 4:
            warnings.warn(f"DIVEConfig: max_heads={self.max_heads} is ignored because heads={self.heads} is fixed.")
        if not -2.0 < self.margin <= 2.0:
            # Δ is a difference of cosines, so it lies in [-2, 2].
            warnings.warn(f"DIVEConfig: margin={self.margin} is outside (-2, 2]; the hinge is then always or never active.")
        if self.triplet_loss == "softplus":
            warnings.warn("DIVEConfig: triplet_loss='softplus' is the 'w/o self-limiting' ablation; satisfied triplets keep producing gradient.")


def resolve_heads(heads: int | str, max_heads: int, dim: int, input_dim: int, view_weight: float) -> int:
    """The number of heads H for a ``input_dim``-d input; raises if ``dim * H`` cannot fit."""
    if dim > input_dim:
        raise ValueError(f"DIVE cannot compress {input_dim}-d input to dim={dim}: lower dim to at most {input_dim}.")
    if heads == "auto":
        resolved = min(max_heads, input_dim // dim)
        if resolved < 2 and view_weight > 0:
            raise ValueError(
                f"heads='auto' resolves to H={resolved} for {input_dim}-d input and dim={dim} "
                f"(H <= min(max_heads={max_heads}, {input_dim} // {dim})), but the view loss needs H >= 2. "
                f"Lower dim to at most {input_dim // 2}, or set view_weight=0."
            )
        return resolved
    heads = int(heads)
    if dim * heads > input_dim:
        raise ValueError(
            f"DIVE needs dim * heads <= input dim, but dim={dim} * heads={heads} = {dim * heads} > {input_dim}. "
            f"Lower heads to at most {input_dim // dim} (or use heads='auto'), or lower dim to at most {input_dim // heads}."
        )
    return heads


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


def holdout_split(train: TrainingData, fraction: float, seed: int) -> tuple[TrainingData, TrainingData]:
    """Split ``train`` by query into (fit part, held-out part) for epoch selection.

    Queries that have triplets are ranked by ``sha256(f"{seed}:{query_id}")`` and the first
    ``ceil(fraction · n)`` are held out, so the split depends on ids and seed only. Both parts
    keep the whole corpus; the fit part keeps the triplets of the other queries.
    """
    triplets = train.require_triplets("dive")
    rows = np.unique(triplets[:, 0])
    ids = [train.query_ids[row] for row in rows]
    if len(ids) < 2:
        raise ValueError(
            f"DIVE epoch_selection='best' holds out a fraction of the training queries, but only {len(ids)} "
            "query has triplets; add training queries or use epoch_selection='last'."
        )
    ranked = sorted(ids, key=lambda query_id: hashlib.sha256(f"{seed}:{query_id}".encode()).hexdigest())
    n_holdout = min(len(ids) - 1, max(1, math.ceil(fraction * len(ids))))
    held = set(ranked[:n_holdout])
    held_rows = np.array([row for row, query_id in zip(rows, ids) if query_id in held], dtype=np.int64)
    fit_triplets = triplets[~np.isin(triplets[:, 0], held_rows)]
    fit_part = TrainingData(train.query_ids, train.query_embeddings, train.doc_ids, train.doc_embeddings, train.qrels, fit_triplets)
    held_ids = [train.query_ids[row] for row in held_rows]
    holdout = TrainingData(
        held_ids, train.query_embeddings[held_rows], train.doc_ids, train.doc_embeddings,
        {query_id: train.qrels.get(query_id, {}) for query_id in held_ids},
    )
    return fit_part, holdout


def _unit(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float32)
    return np.ascontiguousarray(X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12), dtype=np.float32)


def _corpus_mean(X: np.ndarray, normalize: bool, block: int = 16384) -> np.ndarray:
    """The mean row of ``X`` (of its unit rows with ``normalize``) in float64, block by block."""
    total = np.zeros(X.shape[1], dtype=np.float64)
    for lo in range(0, len(X), block):
        rows = np.asarray(X[lo : lo + block], dtype=np.float64)
        if normalize:
            rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        total += rows.sum(axis=0)
    return total / max(len(X), 1)


def _nearest_neighbors(unit_rows: np.ndarray, k: int, queries: np.ndarray | None = None) -> np.ndarray:
    """Each query row's ``k`` nearest other rows of ``unit_rows`` by cosine (exact), shape (n_queries, min(k, n − 1)).

    ``queries`` are row indices into ``unit_rows`` (None: every row). The row itself is dropped.
    """
    queries = np.arange(len(unit_rows)) if queries is None else np.asarray(queries)
    k = min(k, len(unit_rows) - 1)
    _, found = exact_search(unit_rows[queries], unit_rows, k=k + 1)
    is_self = found == queries[:, None]
    order = np.argsort(is_self, axis=1, kind="stable")  # the row itself (if found) goes last
    return np.ascontiguousarray(np.take_along_axis(found, order, axis=1)[:, :k], dtype=np.int64)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# The default recipe of `compress train`, `pipeline` and fit_compressor: DIVEConfig.PRESETS["robust"]
# plus triplets without likely false negatives (score above the query's lowest positive - 0.05)
# and at most 32 per query (benchmarks/RESULTS.md, issue 9 §6).
ROBUST = Preset(
    "robust",
    DIVEConfig.PRESETS["robust"],
    MiningOptions(false_negative_margin=0.05, false_negative_reference="query-min", max_triplets_per_query=32),
    help="'best' plus best-epoch selection and false-negative-filtered, capped triplets (the default)",
)
PRESETS = {
    "paper": Preset("paper", DIVEConfig.PRESETS["paper"], help="the DIVE paper's settings (Table 2, §4.1)"),
    "best": Preset("best", DIVEConfig.PRESETS["best"], help="PCA-rotated init and margin 0.4, selected on validation queries"),
    "robust": ROBUST,
    "unsupervised": Preset("unsupervised", DIVEConfig.PRESETS["unsupervised"],
                           help="no labels: neighbour-rank distillation on the corpus, selected on held-out documents"),
}


@register
class DIVECompressor(Compressor):
    """DIVE compressor: ``fit`` on triplets, ``transform`` with head 1 only.

    Attributes:
        adapter_ : DIVEAdapter, the trained residual adapter (weights ``up`` of shape (r, d),
            ``down`` of shape (d, r)).
        heads_ : int, the resolved number of heads H.
        history_ : list of dict, one diagnostics row per epoch (active ratio ρ(t), each loss
            term unweighted and weighted, total, ``val_ndcg@10`` when validating, seconds).
    """

    method = "dive"
    non_finite_input_reaches_output = True
    config_class = DIVEConfig
    supervised = True
    supports_unsupervised = True
    unsupervised_preset = "unsupervised"
    help = "DIVE: multi-head residual adapter with self-limiting updates (the default)"
    presets = PRESETS
    default_preset = "robust"
    config: DIVEConfig

    def __init__(self, config: DIVEConfig | None = None) -> None:
        super().__init__(config)
        self.adapter_: DIVEAdapter | None = None
        self.heads_: int | None = None
        self.selected_epoch_: int | None = None
        self.history_: list[dict[str, Any]] = []
        self._log_path: Path | None = None

    # -- public API -------------------------------------------------------------------------
    def fit(self, train: TrainingData, val: TrainingData | None = None, log_path: str | Path | None = None) -> "DIVECompressor":
        """Train on ``train.triplets`` and return ``self``.

        Args:
            train: embeddings and triplets (see :func:`embedtune.data.triplets.mine_triplets`).
            val: when given, its queries and whole corpus are transformed after every epoch and
                ``val_ndcg@10`` is recorded; on a large corpus this dominates the epoch time.
            log_path: when given, each epoch's diagnostics row is appended to this JSONL file.
        """
        self.input_dim_, self.adapter_, self.heads_, self.history_, self.selected_epoch_ = None, None, None, [], None
        self._log_path = Path(log_path) if log_path is not None else None
        try:
            return super().fit(train, val)
        except BaseException:
            self.input_dim_ = None  # a failed fit must not look fitted
            raise
        finally:
            self._log_path = None

    def torch_module(self) -> DIVEEncoder:
        """A CPU copy of the inference path as an ``nn.Module`` (for export), in eval mode."""
        self._check_fitted()
        return DIVEEncoder(copy.deepcopy(self.adapter_).cpu(), self.config.output_norm == "input").eval()

    def export_layers(self) -> list[ExportLayer] | None:
        """Head 1 as ``[Normalize]``, two ``Dense`` and ``Normalize`` (see :mod:`embedtune.compress.dive_export`).

        None with ``output_norm='input'``: scaling by the input norm has no built-in module.
        """
        self._check_fitted()
        if self.config.output_norm != "unit":
            return None
        adapter = self.adapter_
        return residual_mlp_layers(adapter.mlp, self.config.activation, np.arange(adapter.dim), adapter.rotation, adapter.normalize_input)

    def fit_details(self) -> dict[str, Any]:
        """The resolved head count H (with heads='auto' it depends on the input dimension); the unsupervised mode's start."""
        details: dict[str, Any] = {"heads": int(self.heads_)} if self.heads_ is not None else {}
        start = next((row["start"] for row in self.history_ if row.get("epoch") == 0 and "start" in row), None)
        if start is not None:
            details["start"] = f"{start} PCA"
        return details

    def save(self, directory: str | Path) -> Path:
        directory = super().save(directory)
        log = directory / TRAINING_LOG_NAME
        if self.history_:
            text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in self.history_)
            atomic_write_bytes(log, text.encode("utf-8"))
        else:
            log.unlink(missing_ok=True)  # a log from an earlier save would describe other weights
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "DIVECompressor":
        estimator = super().load(directory)
        log = Path(directory) / TRAINING_LOG_NAME
        if log.is_file():
            estimator.history_ = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        return estimator

    # -- hooks ------------------------------------------------------------------------------
    @classmethod
    def unsupervised_config(cls, config: DIVEConfig) -> DIVEConfig:  # type: ignore[override]
        """``config`` in the unsupervised mode: PCA start and selection on held-out documents.

        Other settings (learning rate, epochs, the loss weights) are kept; the ``unsupervised``
        preset sets those too. For another start or selection, build
        ``DIVEConfig(mode="unsupervised", ...)`` and call :meth:`fit` on corpus-only data.
        """
        return dataclasses.replace(config, mode="unsupervised", init="pca", epoch_selection="best")

    @property
    def is_unsupervised(self) -> bool:
        """True in the unsupervised mode (``mode='unsupervised'``): the fit reads corpus embeddings only."""
        return self.config.mode == "unsupervised"

    def _fit(self, train: TrainingData, val: TrainingData | None) -> None:
        config = self.config
        heads = resolve_heads(config.heads, config.max_heads, config.dim, train.dim, config.view_weight)
        if config.mode == "supervised":
            train.require_triplets(self.method)
        hidden_dim = config.hidden_dim or max(1, train.dim // 2)
        device = _resolve_device(config.device)
        rotation = corpus_pca_rotation(train.doc_embeddings, config.normalize_input) if config.init == "pca" else None
        self.heads_ = heads
        self.selected_epoch_ = None
        if config.mode == "unsupervised":
            self.selected_epoch_ = self._fit_corpus(train, val, heads, hidden_dim, rotation, device)
            return
        if config.epoch_selection == "last":
            self._train(train, val, heads, hidden_dim, rotation, device, config.epochs, holdout=None, phase="train")
            return
        if config.epoch_selection == "val":
            # The val queries select the epoch (0 included) and are never trained on: no refit.
            if val is None or not val.query_ids:
                raise ValueError("DIVE epoch_selection='val' selects on the val queries given to fit(train, val); none were given.")
            self.selected_epoch_ = self._train(train, None, heads, hidden_dim, rotation, device, config.epochs, holdout=val, phase="select")
            return
        # Select the epoch count on held-out training queries (epoch 0 included), then refit on
        # every training query for that many epochs, so the selection costs no training data.
        fit_part, holdout = holdout_split(train, config.selection_fraction, config.seed)
        logger.debug("DIVE: selecting the epoch on %d held-out training queries", len(holdout.query_ids))
        best_epoch = self._train(fit_part, val, heads, hidden_dim, rotation, device, config.epochs, holdout=holdout, phase="select")
        self.selected_epoch_ = best_epoch
        logger.info("DIVE: best epoch %d of %d; refitting on all %d training queries", best_epoch, config.epochs, len(train.query_ids))
        self._train(train, val, heads, hidden_dim, rotation, device, best_epoch, holdout=None, phase="refit")

    def _train(
        self,
        train: TrainingData,
        val: TrainingData | None,
        heads: int,
        hidden_dim: int,
        rotation: np.ndarray | None,
        device: torch.device,
        epochs: int,
        holdout: TrainingData | None,
        phase: str,
    ) -> int:
        """Train a fresh adapter for ``epochs`` epochs into ``self.adapter_``.

        With ``holdout``, its nDCG@10 is scored before training and after every epoch, the best
        weights are kept, and their epoch (0 = the initialisation) is returned; otherwise the
        last epoch is kept and returned.
        """
        config = self.config
        triplets = train.require_triplets(self.method)
        # Seed only the initialisation, without touching the caller's global RNG state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            adapter = DIVEAdapter(train.dim, config.dim, heads, hidden_dim, config.activation, config.normalize_input)
        adapter.to(device)
        adapter.set_rotation(rotation)
        self.adapter_ = adapter
        logger.debug(
            "DIVE (%s): %d triplets, %d-d -> %d-d, H=%d, r=%d, init=%s, %d parameters, device %s",
            phase, len(triplets), train.dim, config.dim, heads, hidden_dim, config.init, adapter.mlp.num_parameters(), device,
        )

        # Only the rows the triplets use go to the device: a large corpus need not fit there.
        query_rows, query_index = np.unique(triplets[:, 0], return_inverse=True)
        doc_rows, doc_index = np.unique(triplets[:, 1:], return_inverse=True)
        queries = torch.from_numpy(train.query_embeddings[query_rows]).to(device)
        docs = torch.from_numpy(train.doc_embeddings[doc_rows]).to(device)
        local = torch.from_numpy(np.column_stack([query_index.reshape(-1), doc_index.reshape(-1, 2)])).to(device)

        best_epoch, best_score, best_state = epochs, -math.inf, None
        if holdout is not None:
            best_epoch, best_score = 0, self._validate(holdout)
            best_state = copy.deepcopy(adapter.state_dict())
            logger.debug("DIVE epoch 0 (initialisation): holdout nDCG@10 %.4f", best_score)
        optimizer = torch.optim.AdamW(adapter.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        generator = torch.Generator().manual_seed(config.seed)
        progress = progress_bar(epochs, _PHASE_LABELS.get(phase, f"DIVE {phase}"), unit="epoch", enabled=config.progress)
        for epoch in range(1, epochs + 1):
            start = time.perf_counter()
            row = self._train_epoch(adapter, optimizer, queries, docs, local, generator)
            if val is not None:
                row["val_ndcg@10"] = self._validate(val)
            if holdout is not None:
                score = row["holdout_ndcg@10"] = self._validate(holdout)
                if score > best_score:  # strict: ties keep the earlier (simpler) adapter
                    best_epoch, best_score, best_state = epoch, score, copy.deepcopy(adapter.state_dict())
            row = {"epoch": epoch, **row, "seconds": time.perf_counter() - start}
            if phase != "train":
                row["phase"] = phase
            self.history_.append(row)
            self._append_log(row)
            logger.debug(
                "DIVE epoch %d/%d: rho=%.3f triplet=%.4f view=%.4f geo=%.5f total=%.4f%s (%.1fs)",
                epoch, epochs, row["active_ratio"], row["loss_triplet"], row["loss_view"], row["loss_geometry"],
                row["loss_total"], f" val_ndcg@10={row['val_ndcg@10']:.4f}" if val is not None else "", row["seconds"],
            )
            postfix = {"rho": f"{row['active_ratio']:.3f}", "loss": f"{row['loss_total']:.4f}"}
            if holdout is not None:
                postfix["holdout_ndcg@10"] = f"{row['holdout_ndcg@10']:.4f}"
            progress.set_postfix(postfix, refresh=False)
            progress.update(1)
        progress.close()
        if best_state is not None:
            adapter.load_state_dict(best_state)
        adapter.eval()
        return best_epoch

    def _fit_corpus(
        self,
        train: TrainingData,
        val: TrainingData | None,
        heads: int,
        hidden_dim: int,
        rotation: np.ndarray | None,
        device: torch.device,
    ) -> int | None:
        """The unsupervised mode: train on corpus embeddings only; returns the selected epoch (None: 'last')."""
        config = self.config
        n_docs = len(train.doc_embeddings)
        if n_docs < 3:
            raise ValueError(f"DIVE mode='unsupervised' needs at least 3 documents to learn neighbourhoods from; got {n_docs}.")
        rng = np.random.default_rng(config.seed)
        order = rng.permutation(n_docs)
        n_holdout = min(config.holdout_docs, n_docs // 10) if config.epoch_selection == "best" else 0
        if config.epoch_selection == "best" and n_holdout == 0:
            raise ValueError(
                f"DIVE mode='unsupervised' with epoch_selection='best' holds out a tenth of the corpus (at most holdout_docs) "
                f"to select on, but {n_docs} documents leave none; give at least 10 documents or use epoch_selection='last'."
            )
        held = np.sort(order[:n_holdout])
        fit_rows = order[n_holdout:]
        if config.max_train_docs is not None and len(fit_rows) > config.max_train_docs:
            fit_rows = fit_rows[: config.max_train_docs]  # a seeded sample: the permutation is random
        fit_rows = np.sort(fit_rows)
        # Only the sampled and the held-out documents are copied (a large corpus is not); rows below are local to them.
        universe = np.sort(np.concatenate([fit_rows, held]))
        fit_local, held_local = np.searchsorted(universe, fit_rows), np.searchsorted(universe, held)
        # The frozen space's cosine geometry (what retrieval with the frozen model ranks by) is the teacher.
        frozen = _unit(train.doc_embeddings[universe])
        adapter_input = frozen if config.normalize_input else np.ascontiguousarray(train.doc_embeddings[universe], dtype=np.float32)
        neighbors = _nearest_neighbors(frozen[fit_local], config.neighbors)  # rows of fit_local

        # measure() -> the row's selection metrics; the first is the one selected on, `sign` says which way is better.
        measure: Callable[[], dict[str, float]] | None = None
        sign = 1.0
        if config.epoch_selection == "val":
            if val is None or not val.query_ids:
                raise ValueError("DIVE epoch_selection='val' selects on the val queries given to fit(train, val); none were given.")
            measure = lambda: {"val_ndcg@10": self._validate(val)}  # noqa: E731
        elif n_holdout:
            # Held-out documents stand in for queries; the candidates are the sampled and the held-out documents.
            truth = _nearest_neighbors(frozen, _RECALL_AT, queries=held_local)
            measure = lambda: self._holdout_metrics(adapter_input, frozen, held_local, truth)  # noqa: E731
            sign = -1.0  # the held-out rank KL: lower is better
        score_name = ""

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            adapter = DIVEAdapter(train.dim, config.dim, heads, hidden_dim, config.activation, config.normalize_input)
        adapter.to(device)
        adapter.set_rotation(rotation)
        self.adapter_ = adapter
        start_row: dict[str, Any] = {"epoch": 0, "phase": "unsupervised"}
        best_epoch, best_score, best_state = config.epochs, -math.inf, None
        if measure is not None:
            starts = {"uncentred": measure()}
            score_name = next(iter(starts["uncentred"]))
            if rotation is not None:
                # Two candidate starts: the uncentred PCA projection (bias 0) and the centred one (bias −μR),
                # which is the pca baseline.
                mean = _corpus_mean(train.doc_embeddings, config.normalize_input)  # the whole corpus's, as the pca baseline's
                centring = torch.from_numpy((-(mean @ rotation.astype(np.float64))).astype(np.float32)).to(device)
                with torch.no_grad():
                    adapter.mlp.down.bias.copy_(centring)
                starts["centred"] = measure()
            chosen = max(starts, key=lambda name: (sign * starts[name][score_name], name == "uncentred"))  # ties: uncentred
            if chosen == "uncentred":
                with torch.no_grad():
                    adapter.mlp.down.bias.zero_()
            for name, metrics in starts.items():
                start_row.update({f"{key}_{name}_start": value for key, value in metrics.items()})
            if rotation is not None:
                start_row["start"] = chosen
                logger.info("DIVE (unsupervised): %s PCA start (%s: %s)", chosen, score_name,
                            ", ".join(f"{name} {metrics[score_name]:.4f}" for name, metrics in starts.items()))
            best_epoch, best_score, best_state = 0, sign * starts[chosen][score_name], copy.deepcopy(adapter.state_dict())
        self.history_.append(start_row)
        self._append_log(start_row)

        docs = torch.from_numpy(adapter_input[fit_local])
        teacher = torch.from_numpy(frozen[fit_local])
        neighbor_rows = torch.from_numpy(neighbors)
        optimizer = torch.optim.AdamW(adapter.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        generator = torch.Generator().manual_seed(config.seed)
        logger.debug("DIVE (unsupervised): %d training documents, %d held out, %d neighbours each, H=%d, device %s",
                     len(fit_rows), n_holdout, neighbors.shape[1], heads, device)
        progress = progress_bar(config.epochs, "DIVE unsupervised epochs", unit="epoch", enabled=config.progress)
        for epoch in range(1, config.epochs + 1):
            start = time.perf_counter()
            row = self._corpus_epoch(adapter, optimizer, docs, teacher, neighbor_rows, generator, device)
            if measure is not None:
                row.update(measure())
                value = sign * row[score_name]
                if value > best_score:  # strict: ties keep the earlier (simpler) adapter
                    best_epoch, best_score, best_state = epoch, value, copy.deepcopy(adapter.state_dict())
            row = {"epoch": epoch, "phase": "unsupervised", **row, "seconds": time.perf_counter() - start}
            self.history_.append(row)
            self._append_log(row)
            postfix = {"loss": f"{row['loss_total']:.4f}"}
            if measure is not None:
                postfix[score_name] = f"{row[score_name]:.4f}"
            progress.set_postfix(postfix, refresh=False)
            progress.update(1)
            if measure is not None and config.patience is not None and epoch - best_epoch >= config.patience:
                logger.info("DIVE (unsupervised): %s has not improved for %d epochs; stopping at epoch %d", score_name, config.patience, epoch)
                break
        progress.close()
        if best_state is not None:
            adapter.load_state_dict(best_state)
            logger.info("DIVE (unsupervised): kept epoch %d of %d (%s %.4f)%s", best_epoch, len(self.history_) - 1, score_name,
                        sign * best_score, "; training did not beat the PCA start" if best_epoch == 0 else "")
        adapter.eval()
        return best_epoch if measure is not None else None

    def _corpus_epoch(
        self,
        adapter: DIVEAdapter,
        optimizer: torch.optim.Optimizer,
        docs: torch.Tensor,
        teacher: torch.Tensor,
        neighbor_rows: torch.Tensor,
        generator: torch.Generator,
        device: torch.device,
    ) -> dict[str, float]:
        """One pass over the training documents as anchors; mean loss terms."""
        config = self.config
        adapter.train()
        order = torch.randperm(len(docs), generator=generator)
        totals = {"loss_rank": 0.0, "loss_view": 0.0, "loss_geometry": 0.0}
        for lo in range(0, len(docs), config.batch_size):
            anchors = order[lo : lo + config.batch_size]
            pool = torch.unique(torch.cat([anchors, neighbor_rows[anchors].reshape(-1)]))  # sorted
            slots = torch.searchsorted(pool, anchors).to(device)
            heads = adapter(docs[pool].to(device))  # (m, H, k)
            student, frozen = heads[:, 0], teacher[pool].to(device)
            loss_rank = neighbor_rank_distillation_loss(student[slots], student, frozen[slots], frozen, slots, config.neighbor_temperature)
            with torch.set_grad_enabled(config.view_weight > 0):
                loss_view = headwise_ntxent_loss(heads[slots], config.temperature) if adapter.heads >= 2 else heads.new_zeros(())
            with torch.set_grad_enabled(config.geometry_weight > 0):
                loss_geometry = geometry_distillation_loss(student[slots], frozen[slots])
            loss = loss_rank + config.view_weight * loss_view + config.geometry_weight * loss_geometry
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            for name, value in (("loss_rank", loss_rank), ("loss_view", loss_view), ("loss_geometry", loss_geometry)):
                totals[name] += float(value.detach()) * len(anchors)
        means = {name: value / len(docs) for name, value in totals.items()}
        means["loss_total"] = means["loss_rank"] + config.view_weight * means["loss_view"] + config.geometry_weight * means["loss_geometry"]
        return means

    def _holdout_metrics(self, candidates: np.ndarray, teacher: np.ndarray, queries: np.ndarray, truth: np.ndarray) -> dict[str, float]:
        """The unsupervised mode's selection signal on held-out documents, over the whole candidate set.

        ``holdout_rank_kl`` (selected on, lower is better): the neighbour-rank distillation loss of
        each held-out document against every candidate document, i.e. how far the compressed
        space's softmax ranking of the corpus around it is from the frozen space's. It is the
        training objective on documents never trained on. ``holdout_neighbor_recall@10``
        (reported): the share of each held-out document's 10 nearest frozen-space neighbours that
        the compressed space also ranks in its top 10.

        Args:
            candidates: (n, d) adapter inputs of the candidate documents.
            teacher: (n, d) their unit-norm frozen embeddings.
            queries: rows of ``candidates`` that are held out.
            truth: (n_queries, 10) each held-out row's frozen-space top 10 (rows of ``candidates``).
        """
        compressed = self.transform(candidates)
        student_all, teacher_all = torch.from_numpy(compressed), torch.from_numpy(np.ascontiguousarray(teacher))
        total = 0.0
        with torch.no_grad():
            for lo in range(0, len(queries), _KL_CHUNK):
                rows = torch.from_numpy(np.asarray(queries[lo : lo + _KL_CHUNK], dtype=np.int64))
                loss = neighbor_rank_distillation_loss(student_all[rows], student_all, teacher_all[rows], teacher_all, rows,
                                                       self.config.neighbor_temperature)
                total += float(loss) * len(rows)
        _, found = exact_search(compressed[queries], compressed, k=min(_RECALL_AT + 1, len(candidates)))
        hits = 0
        for row, query in enumerate(queries):
            top = [j for j in found[row] if j != query][: truth.shape[1]]
            hits += len(set(top) & set(truth[row].tolist()))
        return {"holdout_rank_kl": total / len(queries), "holdout_neighbor_recall@10": hits / max(truth.size, 1)}

    def _train_epoch(
        self,
        adapter: DIVEAdapter,
        optimizer: torch.optim.Optimizer,
        queries: torch.Tensor,
        docs: torch.Tensor,
        local: torch.Tensor,
        generator: torch.Generator,
    ) -> dict[str, float]:
        config = self.config
        adapter.train()
        order = torch.randperm(len(local), generator=generator).to(local.device)
        totals = {"active_ratio": 0.0, "loss_triplet": 0.0, "loss_view": 0.0, "loss_geometry": 0.0}
        for lo in range(0, len(local), config.batch_size):
            batch = local[order[lo : lo + config.batch_size]]  # (b, 3) rows into queries / docs
            size = len(batch)
            inputs = torch.cat([queries[batch[:, 0]], docs[batch[:, 1]], docs[batch[:, 2]]])  # (3b, d)
            heads = adapter(inputs)  # (3b, H, k)
            query_heads, positive_heads, negative_heads = heads.split(size)
            loss_triplet, active_ratio = quantization_aware_triplet_loss(
                config.quantization_aware, query_heads[:, 0], positive_heads[:, 0], negative_heads[:, 0], config.margin, config.triplet_loss
            )
            # A zero-weighted term is still reported, but kept out of the graph.
            with torch.set_grad_enabled(config.view_weight > 0):
                if adapter.heads >= 2:
                    loss_view = torch.stack([headwise_ntxent_loss(group, config.temperature) for group in (query_heads, positive_heads, negative_heads)]).mean()
                else:
                    loss_view = heads.new_zeros(())
            with torch.set_grad_enabled(config.geometry_weight > 0):
                teacher = F.normalize(inputs, p=2, dim=-1)  # T: the frozen inputs, no parameters involved
                loss_geometry = geometry_distillation_loss(heads[:, 0], teacher)
            loss = loss_triplet + config.view_weight * loss_view + config.geometry_weight * loss_geometry
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            for name, value in (("active_ratio", active_ratio), ("loss_triplet", loss_triplet), ("loss_view", loss_view), ("loss_geometry", loss_geometry)):
                totals[name] += float(value.detach()) * size
        means = {name: value / len(local) for name, value in totals.items()}
        means["weighted_triplet"] = means["loss_triplet"]
        means["weighted_view"] = config.view_weight * means["loss_view"]
        means["weighted_geometry"] = config.geometry_weight * means["loss_geometry"]
        means["loss_total"] = means["weighted_triplet"] + means["weighted_view"] + means["weighted_geometry"]
        return means

    def _validate(self, val: TrainingData) -> float:
        # Score what is deployed: with quantization_aware, the documents at that precision.
        queries, docs = deployed_view(self.config.quantization_aware, self.transform(val.query_embeddings), self.transform(val.doc_embeddings))
        metrics = evaluate_embeddings(val.query_ids, queries, val.doc_ids, docs, val.qrels)
        return float(metrics.aggregate["ndcg@10"])

    def _append_log(self, row: dict[str, Any]) -> None:
        if self._log_path is None:
            return
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._log_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, sort_keys=True) + "\n")

    def _transform(self, X: np.ndarray) -> np.ndarray:
        adapter = self.adapter_
        device = next(adapter.parameters()).device
        was_training = adapter.training
        adapter.eval()
        parts = []
        with torch.no_grad():
            for lo in range(0, len(X), _TRANSFORM_BATCH):
                # np.require copies read-only blocks (e.g. from a memory map), which torch cannot wrap safely.
                batch = torch.from_numpy(np.require(X[lo : lo + _TRANSFORM_BATCH], requirements="W")).to(device)
                # The base class L2-normalises once, so an identity adapter returns normalize(X[:, :k]) bit for bit.
                parts.append(adapter.head_one(batch, normalize=False).cpu().numpy())
        adapter.train(was_training)
        return np.concatenate(parts) if parts else np.zeros((0, self.config.dim), np.float32)

    def transform_validated(self, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Head 1 of ``X``: unit rows, or with ``output_norm='input'`` rows of the input's norm."""
        result = super().transform_validated(X, out=out)
        if self.config.output_norm == "input":
            norms = np.linalg.norm(X, axis=1, keepdims=True)
            np.multiply(result, norms, out=result)
        return result

    def _state_dict(self) -> dict[str, np.ndarray]:
        state = {f"adapter.{name}": tensor.detach().cpu().numpy() for name, tensor in self.adapter_.state_dict().items()}
        state["heads_"] = np.array([self.heads_], dtype=np.int64)
        if self.selected_epoch_ is not None:
            state["selected_epoch_"] = np.array([self.selected_epoch_], dtype=np.int64)
        return state

    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        required = {"heads_", "adapter.mlp.up.weight", "adapter.mlp.up.bias", "adapter.mlp.down.weight", "adapter.mlp.down.bias"}
        optional = {"adapter.rotation", "selected_epoch_"}
        if not required <= set(state) or set(state) - required - optional:
            raise KeyError(f"expected tensors {sorted(required)} (optionally {sorted(optional)}), found {sorted(state)}")
        if ("adapter.rotation" in state) != (self.config.init == "pca"):
            raise KeyError(f"config.json says init={self.config.init!r} but the weights {'have' if 'adapter.rotation' in state else 'lack'} a rotation")
        heads = int(np.asarray(state["heads_"]).reshape(-1)[0])
        hidden_dim, input_dim = state["adapter.mlp.up.weight"].shape
        if input_dim != self.input_dim_:
            raise ValueError(f"the adapter takes {input_dim}-d input but config.json says input_dim={self.input_dim_}")
        if heads < 1 or self.config.dim * heads > input_dim:
            raise ValueError(f"heads_={heads} does not fit dim={self.config.dim} in {input_dim}-d input")
        adapter = DIVEAdapter(input_dim, self.config.dim, heads, hidden_dim, self.config.activation, self.config.normalize_input)
        if "adapter.rotation" in state:
            adapter.set_rotation(state["adapter.rotation"])
        adapter.load_state_dict(
            {name.removeprefix("adapter."): torch.from_numpy(np.array(value)) for name, value in state.items() if name.startswith("adapter.")}
        )
        self.adapter_ = adapter.to(_resolve_device(self.config.device)).eval()
        self.heads_ = heads
        self.selected_epoch_ = int(np.asarray(state["selected_epoch_"]).reshape(-1)[0]) if "selected_epoch_" in state else None

    def _check_fitted(self) -> None:
        super()._check_fitted()
        if self.adapter_ is None:
            raise RuntimeError("This DIVECompressor is not fitted yet; call fit(train) first.")
