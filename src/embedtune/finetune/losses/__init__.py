"""PACE's training objective, one loss per file (sentence-transformers style).

``FocalEmbeddingLoss`` needs only torch; ``CachedFocalEmbeddingLoss`` (GradCache) is imported on
first use because it builds on sentence-transformers' ``CachedLossMixin``.
"""

from __future__ import annotations

import importlib
from typing import Any

from embedtune.finetune.losses.focal_embedding import (
    FocalEmbeddingLoss,
    FocalLossOutput,
    focal_embedding_loss,
    focal_weights,
    per_query_contrastive_loss,
    similarity_matrix,
)

_CACHED = {"CachedFocalEmbeddingLoss", "DEEPSPEED_GRADCACHE_MESSAGE"}

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


def __getattr__(name: str) -> Any:
    if name in _CACHED:
        return getattr(importlib.import_module("embedtune.finetune.losses.cached_focal_embedding"), name)
    raise AttributeError(f"module 'embedtune.finetune.losses' has no attribute {name!r}")
