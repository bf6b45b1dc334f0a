"""int8 codes: FAISS ``SQ8`` with per-dimension ranges calibrated once (:class:`Calibration`), and sentence-transformers' symmetric int8.

* ``SQ8`` (the ``int8`` precision, the ``sq8`` index kind): one byte per dimension,
  ``code = floor(255 · clip((x - vmin) / (vmax - vmin), 0, 1))``, decoded as
  ``vmin + (code + 0.5) / 255 · (vmax - vmin)``; the query stays float32 and is scored against the
  decoded codes (asymmetric). The ranges are fitted on the corpus once and saved with it, so a
  deployment encodes every later batch with the same ranges.
* sentence-transformers ``quantize_embeddings(precision="int8")`` with ranges calibrated on the
  corpus: queries and documents are both int8 and scored by their integer dot product (symmetric).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.evaluate.search import as_rows, break_ties, exact_search
from embedtune.index.codecs.faiss_scan import faiss_index_search
from embedtune.index.codecs.precision_registry import Encoded, PrecisionCodec, StoredIndex, register_precision
from embedtune.io import atomic_write_json, load_weights, save_weights

__all__ = ["Calibration", "Int8", "sq8_index", "sq8_search", "int8_ranges", "int8_quantize", "int8_search"]


@dataclass
class Calibration:
    """Per-dimension ``[vmin, vmax]`` ranges of int8 codes, fitted on the corpus and saved with it.

    The codes are FAISS ``SQ8``'s: ``code = floor(255 · clip((x - vmin) / (vmax - vmin), 0, 1))``,
    decoded as ``vmin + (code + 0.5) / 255 · (vmax - vmin)``.
    """

    vmin: np.ndarray
    vmax: np.ndarray

    def __post_init__(self) -> None:
        self.vmin = np.ascontiguousarray(self.vmin, dtype=np.float32).reshape(-1)
        self.vmax = np.ascontiguousarray(self.vmax, dtype=np.float32).reshape(-1)
        if self.vmin.shape != self.vmax.shape:
            raise ValueError(f"calibration: vmin has {self.vmin.shape[0]} dims but vmax {self.vmax.shape[0]}.")
        if not (np.isfinite(self.vmin).all() and np.isfinite(self.vmax).all()) or (self.vmax < self.vmin).any():
            raise ValueError("calibration: ranges must be finite with vmax >= vmin in every dimension.")

    @property
    def dim(self) -> int:
        return int(self.vmin.shape[0])

    @classmethod
    def fit(cls, x: np.ndarray) -> "Calibration":
        """Min and max of every dimension over ``x`` (``(n, d)``, e.g. the compressed corpus)."""
        x = as_rows(x, "calibration vectors")
        if len(x) == 0:
            raise ValueError("calibration: no vectors to calibrate on.")
        return cls(x.min(axis=0), x.max(axis=0))

    @classmethod
    def fit_blocks(cls, blocks: Iterable[tuple[int, np.ndarray]]) -> "Calibration":
        """The same over an iterable of ``(start, block)`` pieces (one streaming pass over a file too large to load)."""
        vmin = vmax = None
        for _, block in blocks:
            if len(block) == 0:
                continue
            lo, hi = block.min(axis=0), block.max(axis=0)
            vmin = lo if vmin is None else np.minimum(vmin, lo)
            vmax = hi if vmax is None else np.maximum(vmax, hi)
        if vmin is None:
            raise ValueError("calibration: no vectors to calibrate on.")
        return cls(vmin, vmax)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """``(n, d)`` uint8 codes, FAISS SQ8's."""
        diff = self.vmax - self.vmin
        scaled = np.where(diff > 0, (np.asarray(x, np.float32) - self.vmin) / np.where(diff > 0, diff, 1), 0)
        return np.floor(255 * np.clip(scaled, 0, 1)).astype(np.uint8)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """``(n, d)`` float32 vectors the codes stand for (what an asymmetric search scores the query against)."""
        return (self.vmin + (codes.astype(np.float32) + 0.5) / 255 * (self.vmax - self.vmin)).astype(np.float32)

    def faiss_table(self) -> np.ndarray:
        """``[vmin, vmax - vmin]``: the ``sq.trained`` table FAISS ``SQ8`` learns from the same data."""
        return np.concatenate([self.vmin, self.vmax - self.vmin]).astype(np.float32)

    def save(self, path: str | Path) -> Path:
        """``path`` (``.safetensors``) with tensors ``vmin`` and ``vmax``, written atomically."""
        return save_weights(path, {"vmin": self.vmin, "vmax": self.vmax}, {"format": "embedtune-int8-calibration", "codes": "faiss-sq8"})

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        tensors = load_weights(path)
        if set(tensors) != {"vmin", "vmax"}:
            raise ValueError(f"{path}: expected tensors 'vmin' and 'vmax', found {sorted(tensors)}; re-create it with Calibration.save.")
        return cls(tensors["vmin"].numpy(), tensors["vmax"].numpy())

    def to_json(self, path: str | Path) -> Path:
        """The same ranges as readable JSON (for tools that do not read safetensors)."""
        return atomic_write_json(path, {"vmin": self.vmin.tolist(), "vmax": self.vmax.tolist(), "codes": "faiss-sq8"})


def sq8_index(d: int, ranges: Calibration | tuple[np.ndarray, np.ndarray] | None = None, xb: np.ndarray | None = None) -> Any:
    """An empty, trained ``IndexScalarQuantizer(d, QT_8bit, METRIC_INNER_PRODUCT)``.

    Trained by FAISS on ``xb`` (its default min/max range statistic), or from precomputed
    per-dimension ``ranges`` (a :class:`Calibration`, e.g. :meth:`Calibration.fit_blocks` over a
    file too large to load, or ``(vmin, vmax)``): the same table FAISS would learn from all of the data.
    """
    import faiss

    index = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    if ranges is not None:
        calibration = ranges if isinstance(ranges, Calibration) else Calibration(*ranges)
        if calibration.dim != d:
            raise ValueError(f"the int8 calibration has {calibration.dim} dims but the vectors have {d}; calibrate on these vectors.")
        faiss.copy_array_to_vector(calibration.faiss_table(), index.sq.trained)
        index.is_trained = True
    elif xb is not None:
        index.train(as_rows(xb, "xb"))
    else:
        raise ValueError("sq8_index needs ranges or xb to train on.")
    return index


def sq8_search(index: Any, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Search a (SQ8 or any FAISS float) index, with ties by ascending row (:func:`~embedtune.index.codecs.faiss_scan.faiss_index_search`)."""
    xq = as_rows(xq, "xq")
    k = min(k, index.ntotal)
    D, I = faiss_index_search(index, xq, k)
    return break_ties(D, I)


@register_precision
class Int8(PrecisionCodec):
    """The ``int8`` precision: FAISS ``SQ8`` with the per-dimension ranges of a :class:`Calibration` fitted on the corpus."""

    precision_name = "int8"
    summary = "FAISS SQ8 with per-dimension ranges calibrated on the corpus, float query"
    calibrated = True
    predates_digests = True
    factory = "SQ8"
    index_kind = "sq8"
    store_kind = "int8"

    def ram_bytes(self, dim: int) -> int:
        return dim

    def fixed_bytes(self, index: StoredIndex) -> int:
        return 8 * index.dim  # vmin and vmax, float32 each

    def build(self, xb: np.ndarray, precision: Any, calibration: Any = None, float_vectors: np.ndarray | None = None,
              train: np.ndarray | None = None, trained_index: Any = None) -> Encoded:
        calibration = calibration if calibration is not None else Calibration.fit(xb)
        index = sq8_index(xb.shape[1], calibration)
        index.add(xb)
        return Encoded(index, calibration=calibration)

    def encode(self, x: np.ndarray, calibration: Any = None, trained_index: Any = None) -> np.ndarray:
        if calibration is None:
            raise ValueError("precision int8 needs its calibration (the per-dimension ranges fitted on the corpus).")
        return calibration.encode(x)

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        return {"index": {"index_type": "IVF_SQ", "distance_type": "dot"},
                "note": "LanceDB has no user-calibrated int8 column: IVF_SQ trains its own 8-bit ranges, not the plan's"}


# -- int8: sentence-transformers (symmetric) -------------------------------------------------
def int8_ranges(xb: np.ndarray) -> np.ndarray:
    """``(2, d)`` per-dimension min/max, the calibration sentence-transformers uses."""
    xb = as_rows(xb, "xb")
    return np.stack([xb.min(axis=0), xb.max(axis=0)]).astype(np.float32)


def int8_quantize(x: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """sentence-transformers ``quantize_embeddings(x, "int8", ranges=ranges)``: ``(n, d)`` int8."""
    from sentence_transformers.util.quantization import quantize_embeddings

    return quantize_embeddings(as_rows(x, "x"), precision="int8", ranges=ranges)


def int8_search(codes_q: np.ndarray, codes_b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` by the integer dot product of int8 codes (exact in float32 for d <= 1024)."""
    assert codes_q.dtype == np.int8 and codes_b.dtype == np.int8, (codes_q.dtype, codes_b.dtype)
    if codes_q.shape[1] > 1024:
        raise ValueError("int8_search: d > 1024 could round the integer dot products in float32.")
    # |sum| <= 128 * 128 * 1024 = 2^24: every partial sum is an exactly representable float32.
    return exact_search(codes_q.astype(np.float32), codes_b.astype(np.float32), k)
