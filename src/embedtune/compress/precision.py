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
int4              ``ceil(k / 2)``         ``ceil(k / 2)``     FAISS ``SQ4``: 4 bits per dimension, per-dimension
                                                              ranges trained on the corpus, float query
rabitq1           ``ceil(k/8) + 8``       same                FAISS ``RaBitQ`` (Gao & Long 2024): sign bits of
                                                              the vector minus the corpus centroid, plus two
                                                              float32 factors per vector; 4-bit query
rabitq1-rescore   ``ceil(k/8) + 8``       ``+ 4k``            RaBitQ top ``candidates``, rescored against the
                                                              float32 vectors memory-mapped from disk
rabitq4           ``ceil(k/8) + 8 +``     same                FAISS ``RaBitQ4`` (extended RaBitQ): the sign bit
                  ``ceil(3k/8) + 12``                         plus 3 more bits per dimension, and three more
                                                              float32 factors per vector
turboquant1       ``ceil(k / 8)``         same                FAISS ``SQtqmse1`` (TurboQuant, Zandieh et al.
                                                              2025): Lloyd-Max codes for unit vectors, 1 bit
                                                              per dimension, no training, float query
turboquant4       ``ceil(k / 2)``         same                FAISS ``SQtqmse4``: the same at 4 bits
faiss:FACTORY     the code size (+ 8 for  same                any FAISS ``index_factory`` string, e.g.
                  IVF list ids)                               ``faiss:OPQ16,PQ16``, ``faiss:PQ32x4fs`` or
                                                              ``faiss:RR,SQtqmse4`` (randomly rotated first)
================  ======================  ==================  ===============================================

The RaBitQ and TurboQuant precisions are FAISS's own index types (``RaBitQ``, ``RaBitQ4``,
``SQtqmse1``, ``SQtqmse4``), with their defaults: FAISS applies no random rotation before either
(prefix ``RR,`` through ``faiss:`` for one). Their bytes are the code FAISS stores per vector,
factors included (:func:`factory_code_bytes`, checked against ``sa_code_size`` and the serialized
index in the tests). They need faiss-cpu >= 1.11.0 (RaBitQ), 1.13.1 (multi-bit RaBitQ) and 1.14.2
(TurboQuant); an older FAISS is an error naming the release (:func:`check_faiss_supports`).

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

from embedtune.errors import EmbedtuneError
from embedtune.evaluate.search import as_rows, break_ties, exact_search, rescore
from embedtune.io import atomic_write_json, load_weights, save_weights
from embedtune.runtime import native_chatter_filtered

__all__ = [
    "PRECISIONS",
    "Precision",
    "Calibration",
    "QuantizedIndex",
    "factory_code_bytes",
    "FAISS_PRECISIONS",
    "FLOAT_RESCORED",
    "check_faiss_supports",
    "faiss_release_needed",
    "faiss_version_error",
    "binary_codes",
    "sign_vectors",
    "CALIBRATION_FILE",
]

#: The built-in precisions that are FAISS index types: name -> its ``index_factory`` string.
FAISS_PRECISIONS = {
    "int4": "SQ4",
    "rabitq1": "RaBitQ",
    "rabitq1-rescore": "RaBitQ",
    "rabitq4": "RaBitQ4",
    "turboquant1": "SQtqmse1",
    "turboquant4": "SQtqmse4",
}
PRECISIONS = ("float32", "float16", "int8", "binary", "binary-asym", "binary-rescore", *FAISS_PRECISIONS)
"""The built-in precisions; ``faiss:<index_factory string>`` names any FAISS index as well."""
#: Precisions that rescore their candidates against the float32 vectors kept on disk.
FLOAT_RESCORED = ("binary-rescore", "rabitq1-rescore")
CALIBRATION_FILE = "calibration.safetensors"
_FACTORY_PREFIX = "faiss:"
_PQ = re.compile(r"^(?:PQ|RQ|LSQ)(\d+)(?:x(\d+))?(fs|np)?$")
# RaBitQ (1 bit, or 2-9 bits: the sign bit plus extra bits), plain or fast-scan (fs).
_RABITQ = re.compile(r"^RaBitQ(fs)?(\d*)(?:_\d+)?$")
# TurboQuant scalar quantisers: MSE codes (SQtqmse<b>) or with the 1-bit QJL residual (SQtq<b>).
_TURBOQUANT = re.compile(r"^SQtq(mse)?(\d+)$")
# Pre-transforms that store nothing per vector and keep the dimension: random / Hadamard rotations.
_ROTATION = re.compile(r"^(?:RR|HR)(\d*)$")
# Per-vector float factors FAISS stores beside the codes (bytes): RaBitQ's sign-bit factors
# (two float32), its extra-bit factors (three float32), and TurboQuant's QJL factors (two float32).
RABITQ_SIGN_FACTORS, RABITQ_EXTRA_FACTORS, TURBOQUANT_QJL_FACTORS = 8, 12, 8
# Bytes per dimension of FAISS scalar quantisers.
_SQ_BYTES = {"SQ8": 1.0, "SQ4": 0.5, "SQ6": 0.75, "SQfp16": 2.0, "SQbf16": 2.0, "Flat": 4.0}


def factory_code_bytes(factory: str, dim: int) -> int:
    """Bytes per vector an ``index_factory`` string keeps in RAM (FAISS's code size, + 8 ids for IVF).

    Understands ``[OPQ.../PCA.../RR/HR ,][IVFn,](PQm[xb][fs] | SQ8 | SQ4 | SQfp16 | Flat | RaBitQ[fs][b]
    | SQtqmse<b> | SQtq<b>)``; the pre-transforms store nothing per vector, an inverted file stores
    an 8-byte id per vector. RaBitQ at ``b`` bits stores ``ceil(d/8)`` sign bits and two float32
    factors, plus, for ``b > 1``, ``ceil(d(b-1)/8)`` extra bits and three more float32 factors;
    TurboQuant ``SQtqmse<b>`` stores ``ceil(db/8)`` bytes, ``SQtq<b>`` ``b`` bit planes of
    ``ceil(d/8)`` bytes and two float32 factors. (Fast-scan codes are packed in blocks of 32 vectors,
    so the last block pads up to 31 vectors' worth.)

    >>> factory_code_bytes("OPQ16,PQ16", 384), factory_code_bytes("IVF64,PQ32x4fs", 384)
    (16, 24)
    >>> factory_code_bytes("RaBitQ", 384), factory_code_bytes("RaBitQ4", 384), factory_code_bytes("SQtqmse1", 384)
    (56, 212, 48)
    """
    parts = [p.strip() for p in factory.split(",") if p.strip()]
    if not parts:
        raise ValueError("empty FAISS factory string; give e.g. 'PQ16' or 'OPQ16,PQ16'.")
    ivf = any(p.startswith("IVF") for p in parts)
    last = parts[-1]
    out_dim = dim
    for part in parts[:-1]:
        match = re.match(r"^(?:OPQ\d+|PCAR?|PCAW?R?)_?(\d+)$", part)
        rotation = _ROTATION.match(part)
        if match:
            out_dim = int(match.group(1))
        elif rotation and rotation.group(1):
            out_dim = int(rotation.group(1))
    match = _PQ.match(last)
    rabitq, turboquant = _RABITQ.match(last), _TURBOQUANT.match(last)
    if match:
        m, bits = int(match.group(1)), int(match.group(2) or 8)
        code = (m * bits + 7) // 8
    elif rabitq:
        bits = int(rabitq.group(2) or 1)
        if not 1 <= bits <= 9:
            raise ValueError(f"FAISS factory {factory!r}: RaBitQ codes have 1 to 9 bits per dimension; got {bits}.")
        code = (out_dim + 7) // 8 + RABITQ_SIGN_FACTORS
        if bits > 1:
            code += (out_dim * (bits - 1) + 7) // 8 + RABITQ_EXTRA_FACTORS
    elif turboquant:
        bits = int(turboquant.group(2))
        allowed = (1, 2, 3, 4, 8) if turboquant.group(1) else (2, 3, 4, 5)
        if bits not in allowed:
            raise ValueError(f"FAISS factory {factory!r}: TurboQuant {'SQtqmse' if turboquant.group(1) else 'SQtq'} "
                             f"takes {', '.join(map(str, allowed))} bits; got {bits}.")
        if turboquant.group(1):
            code = (out_dim * bits + 7) // 8
        else:
            code = bits * ((out_dim + 7) // 8) + TURBOQUANT_QJL_FACTORS
    elif last in _SQ_BYTES:
        code = int(np.ceil(out_dim * _SQ_BYTES[last]))
    else:
        raise ValueError(f"cannot tell the code size of FAISS factory {factory!r}; use PQ, SQ, RaBitQ, SQtqmse or Flat codes.")
    return code + (8 if ivf else 0)


#: FAISS features some factory strings need: (what, regex on a factory component, probe of the
#: faiss module, the first faiss-cpu release that has it). Most specific first.
_FAISS_FEATURES: tuple[tuple[str, re.Pattern[str], Any, str], ...] = (
    ("multi-bit RaBitQ fast-scan codes", re.compile(r"^RaBitQfs[2-9]"), lambda f: hasattr(f, "IndexRaBitQFastScan"), "1.13.2"),
    ("RaBitQ fast-scan codes", re.compile(r"^RaBitQfs"), lambda f: hasattr(f, "IndexRaBitQFastScan"), "1.13.0"),
    ("multi-bit RaBitQ codes", re.compile(r"^RaBitQ[2-9]"),
     lambda f: hasattr(f, "RaBitQuantizer") and hasattr(f.RaBitQuantizer, "nb_bits"), "1.13.1"),
    ("RaBitQ codes", re.compile(r"^RaBitQ"), lambda f: hasattr(f, "IndexRaBitQ"), "1.11.0"),
    ("TurboQuant scalar quantisers", re.compile(r"^SQtq"), lambda f: hasattr(f.ScalarQuantizer, "QT_1bit_tqmse"), "1.14.2"),
)


def faiss_release_needed(factory: str) -> tuple[str, str] | None:
    """``(feature, first faiss-cpu release)`` of the newest FAISS index type ``factory`` uses, or None for older ones."""
    for part in (p.strip() for p in factory.split(",")):
        for what, pattern, _, release in _FAISS_FEATURES:
            if pattern.match(part):
                return what, release
    return None


def check_faiss_supports(factory: str, precision: str | None = None, faiss_module: Any = None) -> None:
    """Raise :class:`~embedtune.errors.EmbedtuneError` naming the faiss-cpu release needed when the installed FAISS lacks an index type of ``factory``.

    >>> check_faiss_supports("SQtqmse4")  # faiss-cpu >= 1.14.2: nothing to say   # doctest: +SKIP
    """
    if faiss_module is None:
        import faiss as faiss_module
    for part in (p.strip() for p in factory.split(",")):
        for what, pattern, probe, release in _FAISS_FEATURES:
            if pattern.match(part):
                if not probe(faiss_module):
                    raise faiss_version_error(factory, precision, faiss_module)
                break


def faiss_version_error(factory: str, precision: str | None = None, faiss_module: Any = None) -> EmbedtuneError:
    """The error for a FAISS index type the installed faiss cannot make: the feature, the release that has it, the fix."""
    if faiss_module is None:
        import faiss as faiss_module
    what, release = faiss_release_needed(factory) or ("this index type", "a newer release")
    name = f"precision {precision!r} (FAISS factory {factory!r})" if precision else f"FAISS factory {factory!r}"
    return EmbedtuneError(f"{name} needs {what}, which FAISS has from faiss-cpu {release}; the installed faiss is "
                          f"{getattr(faiss_module, '__version__', 'unknown')}. Fix: pip install -U 'faiss-cpu>={release}', "
                          "or choose another precision.")


@dataclass(frozen=True)
class Precision:
    """How vectors are stored and searched (see the module table).

    Args:
        name: one of :data:`PRECISIONS`, or ``"faiss:<index_factory string>"``.
        candidates: binary and RaBitQ with rescoring: how many candidates are rescored.
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
        """A ``faiss:<index_factory string>`` precision (the built-in FAISS ones are not: see :attr:`uses_factory`)."""
        return self.name.startswith(_FACTORY_PREFIX)

    @property
    def uses_factory(self) -> bool:
        """Stored as a FAISS ``index_factory`` index: ``faiss:`` strings and :data:`FAISS_PRECISIONS`."""
        return self.is_faiss or self.name in FAISS_PRECISIONS

    @property
    def rescores_float(self) -> bool:
        """Rescores its candidates against float32 vectors kept on disk (:data:`FLOAT_RESCORED`)."""
        return self.name in FLOAT_RESCORED

    @property
    def is_binary(self) -> bool:
        return self.name.startswith("binary")

    @property
    def factory(self) -> str:
        """The FAISS ``index_factory`` string that stores vectors at this precision (binary: ``BFlat``)."""
        if self.is_faiss:
            return self.name[len(_FACTORY_PREFIX):]
        if self.name in FAISS_PRECISIONS:
            return FAISS_PRECISIONS[self.name]
        return {"float32": "Flat", "float16": "SQfp16", "int8": "SQ8"}.get(self.name, "BFlat")

    def ram_bytes(self, dim: int) -> int:
        """Bytes per vector held in memory to search (binary-rescore, rabitq1-rescore: the codes only)."""
        if self.uses_factory:
            return factory_code_bytes(self.factory, dim)
        if self.is_binary:
            return (dim + 7) // 8
        return {"float32": 4, "float16": 2, "int8": 1}[self.name] * dim

    def disk_bytes(self, dim: int) -> int:
        """Bytes per vector on disk (binary-rescore and rabitq1-rescore also keep the float32 vectors there)."""
        return self.ram_bytes(dim) + (4 * dim if self.rescores_float else 0)

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


def new_factory_index(d: int, factory: str, precision: str | None = None) -> Any:
    """``faiss.index_factory(d, factory, METRIC_INNER_PRODUCT)``, or an error naming the faiss-cpu release an index type needs."""
    import faiss

    check_faiss_supports(factory, precision, faiss)
    try:
        return faiss.index_factory(int(d), factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError:
        if faiss_release_needed(factory) is not None:  # e.g. a RaBitQ bit count or form this release lacks
            raise faiss_version_error(factory, precision, faiss) from None
        raise


__all__.append("new_factory_index")


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
            float_vectors: binary-rescore, rabitq1-rescore: the float32 vectors to rescore against
                (default: ``xb``; pass a memory map of the file on disk to keep them out of RAM).
            train: FAISS factory indexes that need training (``faiss:``, int4's ranges, RaBitQ's
                centroid) are trained on these rows (default: ``xb``).
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
        index = new_factory_index(d, precision.factory, precision.name if not precision.is_faiss else None)
        if not index.is_trained:
            with native_chatter_filtered():  # FAISS's "WARNING clustering" lines (one per sub-quantiser), unless -v
                index.train(as_rows(train, "train") if train is not None else xb)
        index.add(xb)
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.nprobe = precision.nprobe or max(1, ivf.nlist // 4)
        rescore_with = (float_vectors if float_vectors is not None else xb) if precision.rescores_float else None
        return cls(precision, d, index, n, float_vectors=rescore_with)

    def ram_bytes(self) -> int:
        """Bytes per vector held in RAM to search (see :meth:`Precision.ram_bytes`)."""
        return self.precision.ram_bytes(self.dim)

    def disk_bytes(self) -> int:
        return self.precision.disk_bytes(self.dim)

    def fixed_bytes(self) -> int:
        """Bytes that do not grow with the corpus: int8 ranges, or a FAISS index's tables (codebooks, rotations)."""
        if self.calibration is not None:
            return 8 * self.dim
        if self.precision.uses_factory:
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
            fetch = min(self.ntotal, max(k, self.precision.candidates)) if self.precision.rescores_float else k
            D, I = self.backend.search(xq, fetch)
            D, I = break_ties(D, I.astype(np.int64))
            if not self.precision.rescores_float:
                return D, I
            D, I = break_ties(rescore(xq, self.float_vectors, I), I)  # rabitq1-rescore: float32 from disk
            return D[:, :k], I[:, :k]
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
