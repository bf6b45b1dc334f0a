"""Retrieval indexes: the codecs (:mod:`embedtune.index.codecs`), the plan folder's format, building/loading an index folder, approximate search."""

from embedtune.index.ann import build_factory_index, evaluate_ann, recall_at_k
from embedtune.index.codecs import (
    binary_codes,
    binary_index,
    binary_search,
    bytes_per_vector,
    hamming_search,
    int8_quantize,
    int8_ranges,
    int8_search,
    sq8_index,
    sq8_search,
)
from embedtune.index.store import INDEX_KINDS, Index, build_index, load_index

__all__ = [
    "INDEX_KINDS",
    "Index",
    "binary_codes",
    "binary_index",
    "binary_search",
    "build_factory_index",
    "build_index",
    "bytes_per_vector",
    "evaluate_ann",
    "hamming_search",
    "int8_quantize",
    "int8_ranges",
    "int8_search",
    "load_index",
    "recall_at_k",
    "sq8_index",
    "sq8_search",
]
