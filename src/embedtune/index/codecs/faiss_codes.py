"""FAISS index types as codecs: the bytes an ``index_factory`` string stores per vector, and which faiss-cpu release makes it.

:func:`factory_code_bytes` is the accounting every byte figure of a ``faiss:`` or built-in FAISS
precision rests on (checked against ``sa_code_size`` and the serialized index in the tests);
:func:`new_factory_index` makes the index, or names the faiss-cpu release an index type needs.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from embedtune.errors import EmbedtuneError
from embedtune.index.codecs.precision_registry import Encoded, PrecisionCodec, StoredIndex, divisor_near, register_precision
from embedtune.index.codecs.row_encoding import add_encoded
from embedtune.runtime import native_chatter_filtered

__all__ = [
    "FACTORY_PREFIX",
    "FactoryPrecision",
    "Int4",
    "RaBitQ1",
    "RaBitQ1Rescore",
    "RaBitQ4",
    "TurboQuant1",
    "TurboQuant4",
    "FaissFactory",
    "factory_code_bytes",
    "faiss_release_needed",
    "check_faiss_supports",
    "faiss_version_error",
    "new_factory_index",
    "without_polysemous_training",
    "bounded_opq_training",
    "OPQ_WIDE_DIM",
    "OPQ_WIDE_ITERATIONS",
    "RABITQ_SIGN_FACTORS",
    "RABITQ_EXTRA_FACTORS",
    "TURBOQUANT_QJL_FACTORS",
]

_PQ = re.compile(r"^(?:PQ|RQ|LSQ)(\d+)(?:x(\d+))?(fs|np)?$")
# Product additive quantisers: PRQ / PLSQ <splits> x <codebooks per split> x <bits> (no norm suffix: inner product needs none).
_PRODUCT_AQ = re.compile(r"^P(?:RQ|LSQ)(\d+)x(\d+)x(\d+)$")
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

    Understands ``[OPQ.../PCA.../RR/HR ,][IVFn,](PQm[xb][fs] | RQm[xb] | LSQm[xb] | PRQsxmxb | PLSQsxmxb | SQ8
    | SQ4 | SQfp16 | Flat | RaBitQ[fs][b] | SQtqmse<b> | SQtq<b>)``; the pre-transforms store nothing per vector, an inverted file stores
    an 8-byte id per vector. RaBitQ at ``b`` bits stores ``ceil(d/8)`` sign bits and two float32
    factors, plus, for ``b > 1``, ``ceil(d(b-1)/8)`` extra bits and three more float32 factors;
    TurboQuant ``SQtqmse<b>`` stores ``ceil(db/8)`` bytes, ``SQtq<b>`` ``b`` bit planes of
    ``ceil(d/8)`` bytes and two float32 factors. (Fast-scan codes are packed in blocks of 32 vectors,
    so the last block pads up to 31 vectors' worth.)

    >>> factory_code_bytes("OPQ16,PQ16", 384), factory_code_bytes("IVF64,PQ32x4fs", 384)
    (16, 24)
    >>> factory_code_bytes("RaBitQ", 384), factory_code_bytes("RaBitQ4", 384), factory_code_bytes("SQtqmse1", 384)
    (56, 212, 48)
    >>> factory_code_bytes("RQ32x8", 384), factory_code_bytes("PRQ4x8x8", 384)
    (32, 32)
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
    rabitq, turboquant, product_aq = _RABITQ.match(last), _TURBOQUANT.match(last), _PRODUCT_AQ.match(last)
    if match:
        m, bits = int(match.group(1)), int(match.group(2) or 8)
        code = (m * bits + 7) // 8
    elif product_aq:
        splits, books, bits = (int(g) for g in product_aq.groups())
        code = (splits * books * bits + 7) // 8
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
        raise ValueError(f"cannot tell the code size of FAISS factory {factory!r}; use PQ, RQ, LSQ, PRQ, SQ, RaBitQ, SQtqmse or Flat codes.")
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


def without_polysemous_training(index: Any) -> Any:
    """``index`` with FAISS's polysemous training switched off on every product quantiser inside it; returns ``index``.

    ``index_factory`` turns it on for ``PQm`` (and ``OPQm,PQm``). It only renumbers each codebook's centroids so that
    Hamming distances between codes approximate their distances, for polysemous filtering, which embedtune never
    uses: the centroids, the decoded vectors and every score are the same without it. It cost 5-7 times the k-means
    itself (112 s against 16 s for ``PQ64`` on 11,429 x 384 rows, one thread).
    """
    import faiss

    stack = [index]
    while stack:
        node = faiss.downcast_index(stack.pop())
        if hasattr(node, "do_polysemous_training"):
            node.do_polysemous_training = False
        # The wrapped index of IndexPreTransform (``index``) and IndexRefine (``base_index``).
        stack += [child for child in (getattr(node, "index", None), getattr(node, "base_index", None)) if isinstance(child, faiss.Index)]
    return index


#: Above this input width an OPQ rotation trains for :data:`OPQ_WIDE_ITERATIONS` iterations, not FAISS's 50.
OPQ_WIDE_DIM = 768
#: Each OPQ iteration trains a product quantiser and solves a ``d × d`` SVD, so its cost grows as ``d³``. On 9,000 ×
#: 1536 rows (``OPQ32,PQ32``, one thread, 2026-12-07, ``benchmarks/opq_iterations.py``) FAISS's 50 took 818 s and 10
#: took 151 s; the held-out MSE was 0.19023 and 0.19143, against 0.19470 for ``PQ32`` without a rotation, so 10 keep
#: 73 % of the rotation's gain. Every committed result used vectors of 768 dims or fewer, so FAISS's 50.
OPQ_WIDE_ITERATIONS = 10


def bounded_opq_training(index: Any) -> Any:
    """``index`` with the iterations of an OPQ rotation in front capped at :data:`OPQ_WIDE_ITERATIONS` where its input is
    wider than :data:`OPQ_WIDE_DIM`; returns ``index``. Narrower inputs keep FAISS's own count."""
    import faiss

    if isinstance(index, faiss.IndexPreTransform):
        for i in range(index.chain.size()):
            step = faiss.downcast_VectorTransform(index.chain.at(i))
            if isinstance(step, faiss.OPQMatrix) and step.d_in > OPQ_WIDE_DIM and step.niter > OPQ_WIDE_ITERATIONS:
                step.niter = OPQ_WIDE_ITERATIONS
    return index


def new_factory_index(d: int, factory: str, precision: str | None = None) -> Any:
    """``faiss.index_factory(d, factory, METRIC_INNER_PRODUCT)``, or an error naming the faiss-cpu release an index type needs.

    Polysemous training is off (:func:`without_polysemous_training`): same scores, a fraction of the training time. An
    OPQ rotation on vectors wider than :data:`OPQ_WIDE_DIM` trains for :data:`OPQ_WIDE_ITERATIONS` iterations
    (:func:`bounded_opq_training`).
    """
    import faiss

    check_faiss_supports(factory, precision, faiss)
    try:
        return bounded_opq_training(without_polysemous_training(faiss.index_factory(int(d), factory, faiss.METRIC_INNER_PRODUCT)))
    except RuntimeError:
        if faiss_release_needed(factory) is not None:  # e.g. a RaBitQ bit count or form this release lacks
            raise faiss_version_error(factory, precision, faiss) from None
        raise


#: A ``faiss:<index_factory string>`` precision's prefix.
FACTORY_PREFIX = "faiss:"
_PQ_CODE = re.compile(r"^PQ(\d+)(?:x(\d+))?(?:fs|np)?$")


class FactoryPrecision(PrecisionCodec):
    """A precision stored as a FAISS ``index_factory`` index, trained on the corpus; its tables travel as ``codec.faiss``.

    Subclasses set ``precision_name``, ``factory_string`` and ``store_kind`` (the built-in FAISS precisions).
    """

    factory_string: str = ""
    predates_digests = True

    @property
    def factory(self) -> str:
        return self.factory_string

    @property
    def faiss_backed(self) -> bool:
        return True

    def ram_bytes(self, dim: int) -> int:
        return factory_code_bytes(self.factory, dim)

    def fixed_bytes(self, index: StoredIndex) -> int:
        """The serialized index less its codes: the trained tables (codebooks, rotations, ranges, a centroid)."""
        import faiss

        serialized = faiss.serialize_index(index.backend).size
        return max(0, int(serialized) - index.ntotal * self.ram_bytes(index.dim))

    def build(self, xb: np.ndarray, precision: Any, calibration: Any = None, float_vectors: np.ndarray | None = None,
              train: np.ndarray | None = None, trained_index: Any = None) -> Encoded:
        import faiss

        if trained_index is not None:
            index = self.trained_copy(trained_index)
        else:
            index = new_factory_index(xb.shape[1], self.factory, None if self.names_a_factory else self.name)
        if not index.is_trained:
            with native_chatter_filtered():  # FAISS's "WARNING clustering" lines (one per sub-quantiser), unless -v
                index.train(train if train is not None else xb)
        add_encoded(index, xb)  # an OPQ peer's codes as `index build --plan` writes them (row_encoding)
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.nprobe = precision.nprobe or max(1, ivf.nlist // 4)
        return Encoded(index, float_vectors=self.float_vectors_for(xb, float_vectors))

    def reconstruct(self, index: StoredIndex, x: np.ndarray) -> np.ndarray | None:
        if "RaBitQ" in self.factory:
            return None  # RaBitQ ranks by an unbiased inner-product estimator, not by a decoded vector
        return super().reconstruct(index, x)


@register_precision
class Int4(FactoryPrecision):
    precision_name = "int4"
    summary = "FAISS SQ4: 4 bits per dimension, per-dimension ranges trained on the corpus, float query"
    factory_string = "SQ4"
    store_kind = "four-bit"

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        return {"index": {"index_type": "IVF_PQ", "distance_type": "dot", "num_sub_vectors": divisor_near(dim, dim // 2), "num_bits": 8},
                "note": "no 4-bit scalar quantiser in LanceDB: IVF_PQ at about the same bytes"}


class _RaBitQ(FactoryPrecision):
    bits = 1

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        settings: dict[str, Any] = {"index": {"index_type": "IVF_RQ", "distance_type": "dot", "num_bits": self.bits},
                                    "note": "LanceDB's RaBitQ (IVF_RQ), with IVF partitions FAISS's flat RaBitQ index does not have"}
        if self.rescores_float:  # LanceDB's refine_factor reranks limit x refine_factor candidates with the float32 vectors
            settings.update(refine_factor=math.ceil(candidates / top_k), rescore="float", candidates=candidates)
        return settings


@register_precision
class RaBitQ1(_RaBitQ):
    precision_name = "rabitq1"
    summary = "FAISS RaBitQ: sign bits of the vector minus the corpus centroid, two float32 factors per vector"
    factory_string = "RaBitQ"
    store_kind = "rabitq"


@register_precision
class RaBitQ1Rescore(RaBitQ1):
    precision_name = "rabitq1-rescore"
    summary = "RaBitQ top candidates, rescored against the float32 vectors memory-mapped from disk"
    rescore = "float"


@register_precision
class RaBitQ4(_RaBitQ):
    precision_name = "rabitq4"
    summary = "FAISS RaBitQ4 (extended RaBitQ): the sign bit plus 3 more bits per dimension"
    factory_string = "RaBitQ4"
    store_kind = "four-bit"
    bits = 4


class _TurboQuant(FactoryPrecision):
    bits = 1

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        return {"index": {"index_type": "IVF_RQ", "distance_type": "dot", "num_bits": self.bits},
                "note": "no TurboQuant in LanceDB: RaBitQ (IVF_RQ) at the same bits per dimension"}


@register_precision
class TurboQuant1(_TurboQuant):
    precision_name = "turboquant1"
    summary = "FAISS SQtqmse1 (TurboQuant): Lloyd-Max codes for unit vectors, 1 bit per dimension, no training"
    factory_string = "SQtqmse1"
    store_kind = "rabitq"


@register_precision
class TurboQuant4(_TurboQuant):
    precision_name = "turboquant4"
    summary = "FAISS SQtqmse4 (TurboQuant) at 4 bits per dimension"
    factory_string = "SQtqmse4"
    store_kind = "four-bit"
    bits = 4


@register_precision
class FaissFactory(FactoryPrecision):
    """``faiss:<index_factory string>``: any FAISS index the bytes of which :func:`factory_code_bytes` can tell."""

    summary = "any FAISS index_factory string, e.g. faiss:OPQ16,PQ16"
    names_a_factory = True

    def __init__(self, name: str) -> None:
        super().__init__(name)
        factory_code_bytes(self.factory, 64 * 12)  # fail fast on a string we cannot account for

    @classmethod
    def accepts(cls, name: str) -> bool:
        return name.startswith(FACTORY_PREFIX)

    @classmethod
    def examples(cls) -> tuple[str, ...]:
        return (f"{FACTORY_PREFIX}PQ4x4fs", f"{FACTORY_PREFIX}SQ8")

    @classmethod
    def listed_as(cls) -> tuple[str, ...]:
        return (f"{FACTORY_PREFIX}<index_factory string>",)

    @property
    def factory(self) -> str:
        return self.name[len(FACTORY_PREFIX):]

    @property
    def sweep_cache(self) -> bool:
        return True

    @property
    def _last(self) -> str:
        return self.factory.split(",")[-1].strip()

    @property
    def store_kind(self) -> str:
        last = self._last
        if last in ("SQ4", "SQ6"):
            return "four-bit"
        return {"SQ8": "int8", "SQfp16": "float16"}.get(last) or ("product" if _PQ_CODE.match(last) else "other")

    def pq_shape(self, dim: int) -> tuple[int, int] | None:
        pq = _PQ_CODE.match(self._last)
        return (int(pq.group(1)), int(pq.group(2) or 8)) if pq else None

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        pq = self.pq_shape(dim)
        if pq is None:
            return {"note": f"no LanceDB equivalent of FAISS {self.factory!r}; exact float32 scan"}
        parts = [p.strip() for p in self.factory.split(",")]
        nlist = next((int(p[3:]) for p in parts if re.match(r"^IVF\d+$", p)), None)
        return {"index": {"index_type": "IVF_PQ", "distance_type": "dot", "num_sub_vectors": pq[0], "num_bits": pq[1],
                          **({"num_partitions": nlist} if nlist else {})},
                "note": "LanceDB's IVF_PQ at the same code size (its own rotation and codebooks)"}
