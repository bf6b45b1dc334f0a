"""Encoders: sentence-transformers models by alias or path, precomputed vectors, and the cache."""

from embedtune.encoders.bundled import BUNDLED_MODELS, resolve_model_path
from embedtune.encoders.cache import EmbeddingCache
from embedtune.encoders.dataset import DatasetEmbeddings, embed_dataset
from embedtune.encoders.precomputed import load_embeddings
from embedtune.encoders.sentence_transformer import SentenceEncoder

__all__ = [
    "BUNDLED_MODELS",
    "DatasetEmbeddings",
    "EmbeddingCache",
    "SentenceEncoder",
    "embed_dataset",
    "load_embeddings",
    "resolve_model_path",
]
