"""sentence-transformers' CSR pieces, applied to precomputed embeddings (imported only when a CSR fits or loads).

:class:`~sentence_transformers.sparse_encoder.modules.SparseAutoEncoder` is a torch module that
reads ``features["sentence_embedding"]``, so it runs on frozen vectors as they are: no encoder,
no tokenizer. Its losses are s-t's own: :class:`CSRReconstructionLoss` (``L(k) + L(4k)/8 +
β·L_aux``) on the module's outputs and, with training triplets, :class:`CSRLoss`, which adds
``γ`` times s-t's sparse InfoNCE over (query, positive, negative) columns, the module standing in
for the model that embeds each column. Nothing here reimplements their maths.

sentence-transformers takes seconds to import, so :mod:`embedtune.compress.csr` imports this
module inside the functions that need it (``tests/test_layering.py``, ``FUNCTION_BODY_ALLOWED``).
"""

from __future__ import annotations

import torch
from sentence_transformers.sparse_encoder.losses.csr import CSRLoss, CSRReconstructionLoss
from sentence_transformers.sparse_encoder.modules.sparse_auto_encoder import SparseAutoEncoder

__all__ = ["SparseAutoEncoder", "build_sparse_autoencoder", "reconstruction_terms", "csr_terms", "sparse_codes"]


def build_sparse_autoencoder(input_dim: int, latent_dim: int, active: int, k_aux: int, normalize: bool,
                             dead_threshold: int) -> SparseAutoEncoder:
    """s-t's module: ``input_dim`` → ``latent_dim`` latents, top ``active`` kept (its ``hidden_dim`` and ``k``)."""
    return SparseAutoEncoder(input_dim, hidden_dim=latent_dim, k=active, k_aux=k_aux, normalize=normalize,
                             dead_threshold=dead_threshold)


def reconstruction_terms(module: SparseAutoEncoder, x: torch.Tensor, aux_weight: float) -> dict[str, torch.Tensor]:
    """CSR's reconstruction terms of a batch of embeddings ``x`` (batch, d), as :class:`CSRLoss` weighs them."""
    loss = CSRReconstructionLoss(model=None, beta=aux_weight)  # type: ignore[arg-type]  # the model only embeds; x is embedded
    return loss.compute_loss_from_embeddings([module({"sentence_embedding": x})])


def csr_terms(module: SparseAutoEncoder, columns: list[torch.Tensor], aux_weight: float,
              contrastive_weight: float) -> dict[str, torch.Tensor]:
    """:class:`CSRLoss` of (query, positive[, negative]) embedding columns, each (batch, d): reconstruction + γ·InfoNCE."""
    loss = CSRLoss(module, beta=aux_weight, gamma=contrastive_weight)  # type: ignore[arg-type]  # module(features) embeds
    return loss([{"sentence_embedding": column} for column in columns])


@torch.inference_mode()
def sparse_codes(module: SparseAutoEncoder, x: torch.Tensor) -> torch.Tensor:
    """The top-k codes (batch, latent_dim): s-t's inference path (no 4k, auxiliary or decoder pass)."""
    return module({"sentence_embedding": x})["sentence_embedding"]
