"""Precision: how each stored (compressed) vector is encoded, what it costs in bytes, and how it is searched.

A compressor decides the dimension ``k``; a precision decides the bytes per dimension. Users pay
for bytes of RAM per vector, so every quality figure of a deployed setting is a pair
(compressor, precision). The precisions:

================  ======================  ==================  ===============================================
name              bytes in RAM / vector   bytes on disk       search
================  ======================  ==================  ===============================================
float32           ``4k``                  ``4k``              exact inner product
float16           ``2k``                  ``2k``              FAISS ``SQfp16`` (query float32, docs fp16)
int8              ``k``                   ``k``               FAISS ``SQ8`` with per-dimension ranges
                                                              calibrated on the corpus (:class:`Calibration`,
                                                              saved as safetensors), float query (asymmetric)
binary            ``ceil(k / 8)``         ``ceil(k / 8)``     sign bits, Hamming distance
binary-asym       ``ceil(k / 8)``         ``ceil(k / 8)``     Hamming top ``candidates``, rescored as float
                                                              query · ±1 sign vector
binary-rescore    ``ceil(k / 8)``         ``ceil(k/8) + 4k``  Hamming top ``candidates``, rescored against the
                                                              float32 vectors memory-mapped from disk
faiss:FACTORY     the code size (+ 8 for  same                any FAISS ``index_factory`` string, e.g.
                  IVF list ids)                               ``faiss:OPQ16,PQ16`` or ``faiss:PQ32x4fs``
================  ======================  ==================  ===============================================

Fixed costs that do not grow with the corpus (int8 ranges: ``8k`` bytes; PQ codebooks; the
compressor's weights) are reported separately by :meth:`QuantizedIndex.fixed_bytes`.

Every search returns ``(D, I)`` with ``D`` higher-is-better and ties broken by ascending row, so
results are deterministic whatever the backend.

>>> from embedtune.compress.precision import Precision, QuantizedIndex
>>> index = QuantizedIndex.build(doc_vectors, Precision("int8"))          # doctest: +SKIP
>>> D, I = index.search(query_vectors, k=10)                              # doctest: +SKIP
>>> Precision("binary-asym").ram_bytes(128), Precision("binary-rescore").disk_bytes(128)
(16, 528)
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.evaluate.search import as_rows, break_ties, exact_search, rescore
from embedtune.io import atomic_write_json, load_weights, save_weights
from embedtune.runtime import native_chatter_filtered

__all__ = [
    "PRECISIONS",
    "Precision",
    "Calibration",
    "QuantizedIndex",
    "factory_code_bytes",
    "binary_codes",
    "sign_vectors",
    "CALIBRATION_FILE",
]

PRECISIONS = ("float32", "float16", "int8", "binary", "binary-asym", "binary-rescore")
"""The built-in precisions; ``faiss:<index_factory string>`` names any FAISS index as well."""
CALIBRATION_FILE = "calibration.safetensors"
_FACTORY_PREFIX = "faiss:"
_PQ = re.compile(r"^(?:PQ|RQ|LSQ)(\d+)(?:x(\d+))?(fs|np)?$")
# Bytes per dimension of FAISS scalar quantisers.
_SQ_BYTES = {"SQ8": 1.0, "SQ4": 0.5, "SQ6": 0.75, "SQfp16": 2.0, "SQbf16": 2.0, "Flat": 4.0}


def factory_code_bytes(factory: str, dim: int) -> int:
    """Bytes per vector an ``index_factory`` string keeps in RAM (FAISS's code size, + 8 ids for IVF).

    Understands ``[OPQ.../PCA... ,][IVFn,](PQm[xb][fs] | SQ8 | SQ4 | SQfp16 | Flat)``; the
    pre-transforms store nothing per vector, an inverted file stores an 8-byte id per vector.

    >>> factory_code_bytes("OPQ16,PQ16", 384), factory_code_bytes("IVF64,PQ32x4fs", 384)
    (16, 24)
    """
    parts = [p.strip() for p in factory.split(",") if p.strip()]
    if not parts:
        raise ValueError("empty FAISS factory string; give e.g. 'PQ16' or 'OPQ16,PQ16'.")
    ivf = any(p.startswith("IVF") for p in parts)
    last = parts[-1]
    out_dim = dim
    for part in parts[:-1]:
        match = re.match(r"^(?:OPQ\d+|PCAR?|PCAW?R?)_?(\d+)$", part)
        if match:
            out_dim = int(match.group(1))
    match = _PQ.match(last)
    if match:
        m, bits = int(match.group(1)), int(match.group(2) or 8)
        code = (m * bits + 7) // 8
    elif last in _SQ_BYTES:
        code = int(np.ceil(out_dim * _SQ_BYTES[last]))
    else:
        raise ValueError(f"cannot tell the code size of FAISS factory {factory!r}; use PQ, SQ or Flat codes.")
    return code + (8 if ivf else 0)


@dataclass(frozen=True)
class Precision:
    """How vectors are stored and searched (see the module table).

    Args:
        name: one of :data:`PRECISIONS`, or ``"faiss:<index_factory string>"``.
        candidates: binary with rescoring: how many Hamming candidates are rescored.
        nprobe: ``faiss:IVF...``: inverted lists visited per query (default: a quarter of them).
    """

    name: str
    candidates: int = 100
    nprobe: int | None = None

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS and not self.name.startswith(_FACTORY_PREFIX):
            raise ValueError(f"unknown precision {self.name!r}; valid: {', '.join(PRECISIONS)}, or faiss:<index_factory string>.")
        if self.is_faiss:
            factory_code_bytes(self.factory, 64 * 12)  # fail fast on a string we cannot account for
        if isinstance(self.candidates, bool) or not isinstance(self.candidates, int) or self.candidates < 1:
            raise ValueError(f"candidates must be a positive integer; got {self.candidates!r}.")

    @property
    def is_faiss(self) -> bool:
        return self.name.startswith(_FACTORY_PREFIX)

    @property
    def is_binary(self) -> bool:
        return self.name.startswith("binary")

    @property
    def factory(self) -> str:
        """The FAISS ``index_factory`` string that stores vectors at this precision (binary: ``BFlat``)."""
        if self.is_faiss:
            return self.name[len(_FACTORY_PREFIX):]
        return {"float32": "Flat", "float16": "SQfp16", "int8": "SQ8"}.get(self.name, "BFlat")

    def ram_bytes(self, dim: int) -> int:
        """Bytes per vector held in memory to search (binary-rescore: the bits only)."""
        if self.is_faiss:
            return factory_code_bytes(self.factory, dim)
        if self.is_binary:
            return (dim + 7) // 8
        return {"float32": 4, "float16": 2, "int8": 1}[self.name] * dim

    def disk_bytes(self, dim: int) -> int:
        """Bytes per vector on disk (binary-rescore also keeps the float32 vectors there)."""
        return self.ram_bytes(dim) + (4 * dim if self.name == "binary-rescore" else 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Precision":
        known = {"name", "candidates", "nprobe"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"precision: unknown fields {unknown}; valid: {sorted(known)}.")
        return cls(**values)


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
    def fit_blocks(cls, blocks) -> "Calibration":
        """The same over an iterable of ``(start, block)`` pieces (one streaming pass)."""
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
        return (self.vmin + (codes.astype(np.float32) + 0.5) / 255 * (self.vmax - self.vmin)).astype(np.float32)

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


def binary_codes(x: np.ndarray) -> np.ndarray:
    """Sign bits ``x > 0`` packed 8 per byte: ``(n, ceil(d / 8))`` uint8 (trailing bits zero)."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"binary_codes: expected (n, d) vectors; got shape {x.shape}.")
    return np.packbits(x > 0, axis=1)


def sign_vectors(codes: np.ndarray, dim: int) -> np.ndarray:
    """Unpack ``(n, ceil(d/8))`` sign bits into ``(n, d)`` float32 ±1 vectors."""
    return np.unpackbits(codes, axis=1)[:, :dim].astype(np.float32) * 2 - 1


class QuantizedIndex:
    """Vectors stored at one :class:`Precision`, searched exhaustively (or by the FAISS index given).

    Build with :meth:`build`; ``search`` takes float32 queries in the same space.

    Attributes:
        precision: the :class:`Precision`.
        dim: the vectors' dimension.
        ntotal: the number of stored vectors.
        calibration: the int8 ranges, or None.
    """

    def __init__(self, precision: Precision, dim: int, backend: Any, ntotal: int, calibration: Calibration | None = None,
                 float_vectors: np.ndarray | None = None, codes: np.ndarray | None = None) -> None:
        self.precision, self.dim, self.backend, self.ntotal = precision, dim, backend, ntotal
        self.calibration, self.float_vectors, self.codes = calibration, float_vectors, codes

    @classmethod
    def build(cls, xb: np.ndarray, precision: Precision | str, calibration: Calibration | None = None,
              float_vectors: np.ndarray | None = None, train: np.ndarray | None = None) -> "QuantizedIndex":
        """Encode ``xb`` at ``precision``.

        Args:
            xb: ``(n, d)`` float vectors (the compressed corpus).
            precision: a :class:`Precision` or its name.
            calibration: int8 ranges to use (default: fitted on ``xb``).
            float_vectors: binary-rescore: the float32 vectors to rescore against (default: ``xb``;
                pass a memory map of the file on disk to keep them out of RAM).
            train: ``faiss:`` indexes that need training are trained on these rows (default: ``xb``).
        """
        import faiss

        precision = Precision(precision) if isinstance(precision, str) else precision
        xb = as_rows(xb, "xb")
        n, d = xb.shape
        if precision.name == "float32":
            return cls(precision, d, None, n, float_vectors=np.ascontiguousarray(xb, dtype=np.float32))
        if precision.is_binary:
            codes = np.ascontiguousarray(binary_codes(xb))
            index = faiss.IndexBinaryFlat(codes.shape[1] * 8)
            index.add(codes)
            rescore_with = (float_vectors if float_vectors is not None else xb) if precision.name == "binary-rescore" else None
            return cls(precision, d, index, n, float_vectors=rescore_with, codes=codes)
        if precision.name == "float16":
            index = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
            index.add(xb)
            return cls(precision, d, index, n)
        if precision.name == "int8":
            calibration = calibration if calibration is not None else Calibration.fit(xb)
            if calibration.dim != d:
                raise ValueError(f"the int8 calibration has {calibration.dim} dims but the vectors have {d}; calibrate on these vectors.")
            index = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
            table = np.concatenate([calibration.vmin, calibration.vmax - calibration.vmin]).astype(np.float32)
            faiss.copy_array_to_vector(table, index.sq.trained)
            index.is_trained = True
            index.add(xb)
            return cls(precision, d, index, n, calibration=calibration)
        index = faiss.index_factory(d, precision.factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            with native_chatter_filtered():  # FAISS's "WARNING clustering" lines (one per sub-quantiser), unless -v
                index.train(as_rows(train, "train") if train is not None else xb)
        index.add(xb)
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.nprobe = precision.nprobe or max(1, ivf.nlist // 4)
        return cls(precision, d, index, n)

    def ram_bytes(self) -> int:
        """Bytes per vector held in RAM to search (see :meth:`Precision.ram_bytes`)."""
        return self.precision.ram_bytes(self.dim)

    def disk_bytes(self) -> int:
        return self.precision.disk_bytes(self.dim)

    def fixed_bytes(self) -> int:
        """Bytes that do not grow with the corpus: int8 ranges, or a FAISS index's tables (codebooks, rotations)."""
        if self.calibration is not None:
            return 8 * self.dim
        if self.precision.is_faiss:
            import faiss

            serialized = faiss.serialize_index(self.backend).size
            return max(0, int(serialized) - self.ntotal * self.precision.ram_bytes(self.dim))
        return 0

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(D, I)`` of the top ``k`` rows for each float query, ``D`` descending, ties by row."""
        xq = as_rows(xq, "xq")
        if xq.shape[1] != self.dim:
            raise ValueError(f"queries are {xq.shape[1]}-d but the index holds {self.dim}-d vectors.")
        k = min(int(k), self.ntotal)
        name = self.precision.name
        if name == "float32":
            return exact_search(xq, self.float_vectors, k)
        if not self.precision.is_binary:
            D, I = self.backend.search(xq, k)
            return break_ties(D, I.astype(np.int64))
        qcodes = np.ascontiguousarray(binary_codes(xq))
        fetch = k if name == "binary" else min(self.ntotal, max(k, self.precision.candidates))
        distances, I = self.backend.search(qcodes, fetch)
        D, I = break_ties(-distances.astype(np.float32), I.astype(np.int64))
        if name == "binary":
            return D, I
        if name == "binary-rescore":
            D = rescore(xq, self.float_vectors, I)
        else:  # binary-asym: float query · ±1 signs of each candidate
            signs = sign_vectors(self.codes[I.ravel()], self.dim).reshape(len(xq), -1, self.dim)
            D = np.einsum("qd,qmd->qm", xq.astype(np.float64), signs.astype(np.float64)).astype(np.float32)
        D, I = break_ties(D, I)
        return D[:, :k], I[:, :k]

    def save_precision(self, directory: str | Path) -> Path:
        """Write ``precision.json`` (and the int8 ``calibration.safetensors`` + ``.json``) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_json(directory / "precision.json", {**self.precision.to_dict(), "dim": self.dim, "factory": self.precision.factory})
        if self.calibration is not None:
            self.calibration.save(directory / CALIBRATION_FILE)
            self.calibration.to_json(directory / "calibration.json")
        return directory


def load_precision(directory: str | Path) -> tuple[Precision, Calibration | None]:
    """Read what :meth:`QuantizedIndex.save_precision` wrote."""
    directory = Path(directory)
    path = directory / "precision.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no precision.json; write it with QuantizedIndex.save_precision or `compress plan`.")
    values = json.loads(path.read_text(encoding="utf-8"))
    precision = Precision.from_dict({k: v for k, v in values.items() if k in ("name", "candidates", "nprobe")})
    calibration = Calibration.load(directory / CALIBRATION_FILE) if (directory / CALIBRATION_FILE).is_file() else None
    if precision.name == "int8" and calibration is None:
        raise FileNotFoundError(f"{directory}: precision int8 needs {CALIBRATION_FILE} (its per-dimension ranges).")
    return precision, calibration


__all__.append("load_precision")
