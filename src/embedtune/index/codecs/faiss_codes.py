"""FAISS index types as codecs: the bytes an ``index_factory`` string stores per vector, and which faiss-cpu release makes it.

:func:`factory_code_bytes` is the accounting every byte figure of a ``faiss:`` or built-in FAISS
precision rests on (checked against ``sa_code_size`` and the serialized index in the tests);
:func:`new_factory_index` makes the index, or names the faiss-cpu release an index type needs.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from embedtune.errors import EmbedtuneError

__all__ = [
    "factory_code_bytes",
    "faiss_release_needed",
    "check_faiss_supports",
    "faiss_version_error",
    "new_factory_index",
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
