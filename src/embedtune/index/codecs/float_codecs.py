"""float32 and float16: the vectors themselves, searched exactly (float32) or by FAISS ``SQfp16`` (float16)."""

from __future__ import annotations

from typing import Any

import numpy as np

from embedtune.evaluate.search import exact_search
from embedtune.index.codecs.precision_registry import Encoded, PrecisionCodec, StoredIndex, register_precision

__all__ = ["Float32", "Float16"]


@register_precision
class Float32(PrecisionCodec):
    precision_name = "float32"
    summary = "the float32 vectors, exact inner product"
    predates_digests = True
    factory = "Flat"
    index_kind = "flat"
    store_kind = "float32"

    def ram_bytes(self, dim: int) -> int:
        return 4 * dim

    def build(self, xb: np.ndarray, precision: Any, calibration: Any = None, float_vectors: np.ndarray | None = None,
              train: np.ndarray | None = None, trained_index: Any = None) -> Encoded:
        return Encoded(None, float_vectors=np.ascontiguousarray(xb, dtype=np.float32))

    def encode(self, x: np.ndarray, calibration: Any = None, trained_index: Any = None) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=np.float32)

    def search(self, index: StoredIndex, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return exact_search(xq, index.float_vectors, k)

    def reconstruct(self, index: StoredIndex, x: np.ndarray) -> np.ndarray | None:
        return x

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        return {"exact": True, "note": "exact scan of the float32 vectors, as the plan's flat index"}


@register_precision
class Float16(PrecisionCodec):
    precision_name = "float16"
    summary = "FAISS SQfp16: float16 documents, float32 query"
    predates_digests = True
    factory = "SQfp16"
    store_kind = "float16"
    fits_nothing = True

    def ram_bytes(self, dim: int) -> int:
        return 2 * dim

    def build(self, xb: np.ndarray, precision: Any, calibration: Any = None, float_vectors: np.ndarray | None = None,
              train: np.ndarray | None = None, trained_index: Any = None) -> Encoded:
        import faiss

        index = faiss.IndexScalarQuantizer(xb.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
        index.add(xb)
        return Encoded(index)

    def encode(self, x: np.ndarray, calibration: Any = None, trained_index: Any = None) -> np.ndarray:
        return np.asarray(x, dtype=np.float32).astype(np.float16)

    def reconstruct(self, index: StoredIndex, x: np.ndarray) -> np.ndarray | None:
        return x.astype(np.float16).astype(np.float32)

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        return {"vector_type": f"float16 x {dim}", "note": "float16 storage as FAISS SQfp16; LanceDB may compute the dot product in float16"}
