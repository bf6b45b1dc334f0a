"""The :class:`Precision` of stored vectors: its name, its FAISS factory string, and its bytes in RAM and on disk."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from embedtune.index.codecs.faiss_codes import factory_code_bytes
from embedtune.index.codecs.registry import CodecFamily, codec_family, is_registered_codec, registered_codecs

__all__ = ["PRECISIONS", "FAISS_PRECISIONS", "FLOAT_RESCORED", "FACTORY_PREFIX", "Precision", "bytes_per_vector"]

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
"""The built-in precisions; ``faiss:<index_factory string>`` names any FAISS index as well, and ``<family>:<bytes>`` any
registered codec (:mod:`embedtune.index.codecs.registry`, e.g. ``klt-pq:32``)."""
#: Precisions that rescore their candidates against the float32 vectors kept on disk.
FLOAT_RESCORED = ("binary-rescore", "rabitq1-rescore")
FACTORY_PREFIX = "faiss:"


@dataclass(frozen=True)
class Precision:
    """How vectors are stored and searched (see the table of :mod:`embedtune.index.codecs`).

    Args:
        name: one of :data:`PRECISIONS`, or ``"faiss:<index_factory string>"``.
        candidates: binary and RaBitQ with rescoring: how many candidates are rescored.
        nprobe: ``faiss:IVF...``: inverted lists visited per query (default: a quarter of them).
    """

    name: str
    candidates: int = 100
    nprobe: int | None = None

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS and not self.name.startswith(FACTORY_PREFIX) and not is_registered_codec(self.name):
            codecs = ", ".join(f"{family}:<bytes>" for family in sorted(registered_codecs()))
            raise ValueError(f"unknown precision {self.name!r}; valid: {', '.join(PRECISIONS)}, a registered codec ({codecs}), "
                             "or faiss:<index_factory string>.")
        if self.is_faiss:
            factory_code_bytes(self.factory, 64 * 12)  # fail fast on a string we cannot account for
        if isinstance(self.candidates, bool) or not isinstance(self.candidates, int) or self.candidates < 1:
            raise ValueError(f"candidates must be a positive integer; got {self.candidates!r}.")

    @property
    def is_faiss(self) -> bool:
        """A ``faiss:<index_factory string>`` precision (the built-in FAISS ones are not: see :attr:`uses_factory`)."""
        return self.name.startswith(FACTORY_PREFIX)

    @property
    def is_codec(self) -> bool:
        """A registered codec (``<family>:<bytes>``, :mod:`embedtune.index.codecs.registry`)."""
        return is_registered_codec(self.name)

    @property
    def codec(self) -> CodecFamily:
        """The registered codec's family (an error for the other precisions)."""
        return codec_family(self.name)

    @property
    def uses_factory(self) -> bool:
        """Stored as a trained FAISS index (``codec.faiss``): ``faiss:`` strings, :data:`FAISS_PRECISIONS`, and the
        deployable registered codecs."""
        return self.is_faiss or self.name in FAISS_PRECISIONS or (self.is_codec and self.codec.deployable)

    @property
    def rescores_float(self) -> bool:
        """Rescores its candidates against float32 vectors kept on disk (:data:`FLOAT_RESCORED`)."""
        return self.name in FLOAT_RESCORED

    @property
    def is_binary(self) -> bool:
        return self.name.startswith("binary")

    @property
    def factory(self) -> str:
        """The FAISS ``index_factory`` string that stores vectors at this precision (binary: ``BFlat``; a registered
        codec: its name, since its FAISS index is fitted on the corpus and travels as ``codec.faiss``)."""
        if self.is_codec:
            return self.name
        if self.is_faiss:
            return self.name[len(FACTORY_PREFIX):]
        if self.name in FAISS_PRECISIONS:
            return FAISS_PRECISIONS[self.name]
        return {"float32": "Flat", "float16": "SQfp16", "int8": "SQ8"}.get(self.name, "BFlat")

    def ram_bytes(self, dim: int) -> int:
        """Bytes per vector held in memory to search (binary-rescore, rabitq1-rescore: the codes only)."""
        if self.is_codec:
            return self.codec.code_size(dim)
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


# The built-in index kinds of `embedtune index build --kind` and the precision each stores (s-t "int8" too: one byte).
_KIND_PRECISION = {"flat": "float32", "float32": "float32", "sq8": "int8", "int8": "int8", "binary": "binary"}


def bytes_per_vector(kind: str, d: int) -> int:
    """Index bytes per vector of an index kind: float32 ``4d``, int8/sq8 ``d``, binary ``ceil(d / 8)``."""
    if kind not in _KIND_PRECISION:
        raise ValueError(f"unknown kind {kind!r}; valid: flat, sq8, int8, binary.")
    return Precision(_KIND_PRECISION[kind]).ram_bytes(d)
