"""Retrieval indexes: the codecs (:mod:`embedtune.index.codecs`), the plan folder's format, building/loading an index folder, approximate search."""

# Imported on first use, not here: `index build` of a flat index and `search` must not load every codec.
_LAZY = {
    "build_factory_index": "embedtune.index.ann",
    "evaluate_ann": "embedtune.index.ann",
    "recall_at_k": "embedtune.index.ann",
    **{name: "embedtune.index.codecs" for name in (
        "binary_codes", "binary_index", "binary_search", "bytes_per_vector", "hamming_search", "int8_quantize", "int8_ranges",
        "int8_search", "sq8_index", "sq8_search")},
    **{name: "embedtune.index.store" for name in ("INDEX_KINDS", "Index", "build_index", "load_index")},
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
