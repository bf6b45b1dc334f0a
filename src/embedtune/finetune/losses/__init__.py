"""PACE's training objective, one loss per file (sentence-transformers style)."""

from embedtune.finetune.losses.cached_focal_embedding import DEEPSPEED_GRADCACHE_MESSAGE, CachedFocalEmbeddingLoss
from embedtune.finetune.losses.focal_embedding import (
    FocalEmbeddingLoss,
    FocalLossOutput,
    focal_embedding_loss,
    focal_weights,
    per_query_contrastive_loss,
    similarity_matrix,
)

__all__ = [
    "CachedFocalEmbeddingLoss",
    "DEEPSPEED_GRADCACHE_MESSAGE",
    "FocalEmbeddingLoss",
    "FocalLossOutput",
    "focal_embedding_loss",
    "focal_weights",
    "per_query_contrastive_loss",
    "similarity_matrix",
]
