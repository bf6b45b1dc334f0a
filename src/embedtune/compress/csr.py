"""CSR (Wen et al. 2025): a top-k sparse autoencoder over frozen embeddings, as a learned peer at equal bytes.

Contrastive Sparse Representation encodes a unit embedding ``x ∈ R^d`` into ``m`` latents and
keeps the ``k`` largest,

    z = ReLU(TopK_k(W (x − b_pre) + b_lat)) ∈ R^m,     x̂_k = Wᵀ z + b_pre ,

with the decoder tied to the encoder. The code is ``z / ‖z‖₂``: at most ``k`` nonzeros of ``m``
(exactly ``k`` unless a top-k pre-activation is ≤ 0, which the ReLU zeroes), searched by the dot
product of the sparse vectors. It is trained with CSR's reconstruction terms on the corpus
(label-free, the default):

    L_rec = ‖x − x̂_k‖² + ‖x − x̂_4k‖² / 8 + β · L_aux ,

where ``x̂_4k`` keeps the top ``4k`` latents and ``L_aux`` (Gao et al. 2024) makes the top
``k_aux`` dead latents reconstruct the residual. With ``contrastive_weight`` γ > 0 and training
triplets it adds γ times InfoNCE over the sparse codes of (query, positive, negative) columns,
CSR's full loss. Module and losses are sentence-transformers' own (``SparseAutoEncoder``,
``CSRReconstructionLoss``, ``CSRLoss``; see :mod:`embedtune.compress.csr_module`), run on the
precomputed embeddings; the loop is the shared AdamW loop of :mod:`embedtune.compress.training`.

Bytes: a stored code is ``k`` (index, value) pairs, ``k × (index bytes + value bytes)`` per vector
(:func:`sparse_code_bytes`; indices are the smallest unsigned integer that holds ``m − 1``:
2 bytes for ``m ≤ 65536``; values fp16 by default), e.g. 32 B for ``k = 8`` of ``m = 1536``.

References:
    - T. Wen, Y. Wang, Z. Zeng, Z. Peng, Y. Su, X. Liu, B. Chen, H. Liu, S. Jegelka, C. You.
      "Beyond Matryoshka: Revisiting Sparse Coding for Adaptive Representation". ICML 2025,
      arXiv:2503.01776.
    - L. Gao et al. "Scaling and evaluating sparse autoencoders". arXiv:2406.04093, 2024.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from embedtune.constraints import Constraint, Interval, Options
from embedtune.compress.base import Compressor, TrainingData
from embedtune.compress.presets import presets_from_config
from embedtune.compress.registry import register
from embedtune.compress.training import TrainedCompressorConfig, resolve_device, run_epochs, seeded, unit_rows

logger = logging.getLogger(__name__)

__all__ = ["CSRConfig", "CSRCompressor", "sparse_code_bytes", "index_bytes"]

#: The stored value widths ``value_bytes`` may name: fp16 and fp32.
VALUE_BYTES = (2, 4)
# s-t's SparseAutoEncoder defaults (k = 8, k_aux = 512).
_DEFAULT_ACTIVE, _DEFAULT_K_AUX = 8, 512
_TRANSFORM_BATCH = 8192


def index_bytes(latent_dim: int) -> int:
    """Bytes of one latent index: the smallest unsigned integer holding ``latent_dim − 1`` (uint8, uint16, uint32)."""
    if latent_dim < 1:
        raise ValueError(f"latent_dim must be positive; got {latent_dim!r}.")
    return 1 if latent_dim <= 1 << 8 else 2 if latent_dim <= 1 << 16 else 4


def sparse_code_bytes(active: int, latent_dim: int, value_bytes: int = 2) -> int:
    """Bytes per vector of a ``active``-sparse code of ``latent_dim`` latents: ``active × (index bytes + value bytes)``."""
    if value_bytes not in VALUE_BYTES:
        raise ValueError(f"value_bytes must be one of {VALUE_BYTES} (fp16, fp32); got {value_bytes!r}.")
    return active * (index_bytes(latent_dim) + value_bytes)


@dataclass
class CSRConfig(TrainedCompressorConfig):
    """CSR settings: the latent width ``dim`` (m), the active latents ``active`` (k), and CSR's loss weights.

    ``hidden_dim`` and ``activation`` (shared with the MLP baselines) are not used: the encoder is one linear map.
    """

    dim: int = field(default=1536, metadata={"help": "Latent width m, the sparse code's dimension (CSR's hidden_dim; 4 × 384 for MiniLM)."})
    active: int | None = field(default=None, metadata={
        "help": "Active latents k per vector (the bytes: k × (index + value bytes)); None: s-t's 8, at most dim // 4."})
    k_aux: int | None = field(default=None, metadata={"help": "Dead latents the auxiliary loss uses; None: s-t's 512, at most dim."})
    aux_weight: float = field(default=0.1, metadata={"help": "β, the weight of the auxiliary loss L_aux (CSRLoss's default)."})
    contrastive_weight: float = field(default=0.0, metadata={
        "help": "γ, the weight of InfoNCE on training triplets (CSRLoss's is 1.0); 0: label-free, reconstruction only."})
    normalize: bool = field(default=False, metadata={"help": "s-t's option: layer-normalise the input before encoding."})
    dead_threshold: int = field(default=30, metadata={"help": "Steps without firing after which a latent counts as dead (s-t's default)."})
    value_bytes: int = field(default=2, metadata={"help": "Bytes of each stored value: 2 (fp16) or 4 (fp32); indices are counted too."})
    learning_rate: float = field(default=1e-3, metadata={"help": "AdamW learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay (0: top-k autoencoders train without it)."})

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "active": [Interval(int, 1, None), None], "k_aux": [Interval(int, 1, None), None], "dead_threshold": [Interval(int, 1, None)],
        "aux_weight": [Interval(float, 0, None)], "contrastive_weight": [Interval(float, 0, None)],
        "value_bytes": [Options(VALUE_BYTES)],  # 2: fp16, 4: fp32
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dim < 4:
            raise ValueError(f"dim (the latent width m) must be at least 4, for CSR's top-4k term; got {self.dim!r}.")
        if self.active is not None and 4 * self.active > self.dim:
            raise ValueError(f"active={self.active} needs dim >= 4 × active = {4 * self.active}: CSR's L(4k) term keeps the top "
                             f"4k of the dim={self.dim} latents. Lower active or widen dim.")
        if self.k_aux is not None and self.k_aux > self.dim:
            raise ValueError(f"k_aux={self.k_aux} exceeds the latent width dim={self.dim}; choose k_aux <= dim or None.")

    @property
    def active_latents(self) -> int:
        """k: ``active``, or s-t's default 8 capped at ``dim // 4``."""
        return self.active if self.active is not None else min(_DEFAULT_ACTIVE, self.dim // 4)

    @property
    def aux_latents(self) -> int:
        return self.k_aux if self.k_aux is not None else min(_DEFAULT_K_AUX, self.dim)


@register
class CSRCompressor(Compressor):
    """CSR's sparse autoencoder on frozen embeddings; ``transform`` gives unit k-sparse codes of width ``dim``.

    Label-free by default (``contrastive_weight = 0``). With ``contrastive_weight > 0`` it needs
    training triplets, which only a direct ``fit(TrainingData(triplets=...))`` passes: the
    workflows hand triplets to supervised methods only, and CSR is registered as unsupervised.

    Attributes:
        model_ : s-t's ``SparseAutoEncoder`` (``pre_bias`` (d,), ``encoder.weight`` (m, d),
            ``latent_bias`` (m,)), in eval mode.
        history_ : list of dict, one per epoch: ``{"stage", "epoch", "loss", <CSR's terms>}``.
        dead_latents_ : int, latents that fire for no training document.
    """

    method = "csr"
    config_class = CSRConfig
    supervised = False
    supports_unsupervised = True
    help = "CSR: sentence-transformers' top-k sparse autoencoder; k of dim latents active, k × (index + value) bytes"
    presets = presets_from_config(CSRConfig)

    def __init__(self, config: CSRConfig | None = None) -> None:
        super().__init__(config)
        self.model_: nn.Module | None = None
        self.dead_latents_: int | None = None

    @classmethod
    def unsupervised_config(cls, config: CSRConfig) -> CSRConfig:  # type: ignore[override]
        """``config`` without the contrastive term (γ = 0)."""
        if config.contrastive_weight == 0:
            return config
        return CSRConfig(**{**config.to_dict(), "contrastive_weight": 0.0})

    @property
    def is_unsupervised(self) -> bool:
        return self.config.contrastive_weight == 0  # type: ignore[attr-defined]

    @property
    def code_bytes(self) -> int:
        """Bytes per stored vector: ``k × (index bytes + value bytes)`` (:func:`sparse_code_bytes`)."""
        config: CSRConfig = self.config  # type: ignore[assignment]
        return sparse_code_bytes(config.active_latents, config.dim, config.value_bytes)

    def _build(self, input_dim: int) -> nn.Module:
        # sentence-transformers takes seconds to import: only a CSR that fits or loads pays for it.
        from embedtune.compress.csr_module import build_sparse_autoencoder

        config: CSRConfig = self.config  # type: ignore[assignment]
        with seeded(config.seed):
            return build_sparse_autoencoder(input_dim, config.dim, config.active_latents, config.aux_latents, config.normalize,
                                            config.dead_threshold)

    def _fit(self, train: TrainingData, val: TrainingData | None) -> None:
        from embedtune.compress.csr_module import csr_terms, reconstruction_terms

        config: CSRConfig = self.config  # type: ignore[assignment]
        device = resolve_device(config.device)
        model = self._build(train.dim).to(device)
        corpus = unit_rows(train.doc_embeddings)
        if config.contrastive_weight > 0:
            triplets = torch.as_tensor(train.require_triplets(f"{self.method} with contrastive_weight > 0"))
            queries = unit_rows(train.query_embeddings)

            def step(batch: torch.Tensor, epoch: int) -> dict[str, torch.Tensor]:
                rows = triplets[batch]  # (batch, 3): query, positive, negative rows
                columns = [queries[rows[:, 0]].to(device), corpus[rows[:, 1]].to(device), corpus[rows[:, 2]].to(device)]
                return _summed(csr_terms(model, columns, config.aux_weight, config.contrastive_weight))

            n_items, stage = len(triplets), "csr"
        else:
            def step(batch: torch.Tensor, epoch: int) -> dict[str, torch.Tensor]:
                return _summed(reconstruction_terms(model, corpus[batch].to(device), config.aux_weight))

            n_items, stage = len(corpus), "csr-reconstruction"
        model.train()
        self.history_ = run_epochs(model.parameters(), step, n_items, config, stage=stage)
        self.model_ = model.eval()
        fired = np.zeros(config.dim, dtype=bool)
        for start in range(0, len(corpus), _TRANSFORM_BATCH):
            fired |= self._codes(corpus[start : start + _TRANSFORM_BATCH]).any(axis=0)
        self.dead_latents_ = int((~fired).sum())

    def _codes(self, rows: torch.Tensor) -> np.ndarray:
        from embedtune.compress.csr_module import sparse_codes

        assert self.model_ is not None
        device = next(self.model_.parameters()).device
        return sparse_codes(self.model_, rows.to(device)).float().cpu().numpy()

    def _transform(self, X: np.ndarray) -> np.ndarray:
        parts = [self._codes(unit_rows(X[start : start + _TRANSFORM_BATCH])) for start in range(0, len(X), _TRANSFORM_BATCH)]
        if not parts:
            return np.zeros((0, self.config.dim), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)

    def fit_details(self) -> dict[str, Any]:
        config: CSRConfig = self.config  # type: ignore[assignment]
        return {"active": config.active_latents, "latent_dim": config.dim, "code_bytes": self.code_bytes,
                "dead_latents": self.dead_latents_}

    # The decoder is tied: its weight is the encoder's, so only the encoder's copy is stored.
    _TIED: ClassVar[str] = "decoder."

    def _state_dict(self) -> dict[str, np.ndarray]:
        assert self.model_ is not None
        return {f"csr.{name}": value.detach().cpu().numpy() for name, value in self.model_.state_dict().items()
                if not name.startswith(self._TIED)}

    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        assert self.input_dim_ is not None
        model = self._build(self.input_dim_)
        own = {name: torch.from_numpy(np.array(state[f"csr.{name}"])) for name in model.state_dict() if not name.startswith(self._TIED)}
        missing, unexpected = model.load_state_dict(own, strict=False)
        if unexpected or any(not name.startswith(self._TIED) for name in missing):
            raise KeyError(f"CSR weights: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        self.model_ = model.to(resolve_device(self.config.device)).eval()  # type: ignore[attr-defined]
        self.dead_latents_ = None


def _summed(terms: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CSR's named terms plus ``loss``, their sum (s-t's trainer sums a loss dict the same way)."""
    return {**terms, "loss": torch.stack([torch.as_tensor(value).reshape(()) for value in terms.values()]).sum()}
