"""The :class:`Precision` of stored vectors: a name looked up among the registered codecs, with the search settings.

Every precision is a registered :class:`~embedtune.index.codecs.precision_registry.PrecisionCodec`
(:func:`~embedtune.index.codecs.precision_registry.register_precision`); :class:`Precision` pairs one
with the settings a search takes (rescoring candidates, IVF lists visited) and answers for it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

# The built-in codecs, imported in the order the precisions are listed (PRECISIONS, --help): float, int8, sign bits, FAISS.
from embedtune.index.codecs import float_codecs, int8, binary, faiss_codes, registry  # noqa: F401  (each registers its codecs)
from embedtune.index.codecs.faiss_codes import FACTORY_PREFIX, FactoryPrecision
from embedtune.index.codecs.precision_registry import PrecisionCodec, Tier, builtin_precision_names, precision_codec, registered_precisions
from embedtune.index.codecs.registry import CodecFamily

__all__ = ["PRECISIONS", "FAISS_PRECISIONS", "FLOAT_RESCORED", "FACTORY_PREFIX", "Precision", "bytes_per_vector"]

PRECISIONS = builtin_precision_names()
"""The built-in precisions; ``faiss:<index_factory string>`` names any FAISS index as well, and ``<family>:<bytes>`` any
registered codec (:mod:`embedtune.index.codecs.registry`, e.g. ``klt-pq:32``)."""
#: The built-in precisions that are FAISS index types: name -> its ``index_factory`` string.
FAISS_PRECISIONS = {cls.precision_name: cls.factory_string for cls in registered_precisions()
                    if issubclass(cls, FactoryPrecision) and cls.precision_name}
#: Precisions that rescore their candidates against the float32 vectors kept on disk.
FLOAT_RESCORED = tuple(cls.precision_name for cls in registered_precisions() if cls.precision_name and cls.rescore == "float")


@dataclass(frozen=True)
class Precision:
    """How vectors are stored and searched (see the table of :mod:`embedtune.index.codecs`).

    Args:
        name: a registered precision: one of :data:`PRECISIONS`, ``"faiss:<index_factory string>"``, or a registered
            codec (``"klt-pq:32"``).
        candidates: binary and RaBitQ with rescoring: how many candidates are rescored.
        nprobe: ``faiss:IVF...``: inverted lists visited per query (default: a quarter of them).
    """

    name: str
    candidates: int = 100
    nprobe: int | None = None
    if TYPE_CHECKING:  # set in __post_init__, not a dataclass field
        _codec: PrecisionCodec

    def __post_init__(self) -> None:
        # Not a dataclass field (so not in to_dict, ==, hash or repr): the codec is a function of the name.
        object.__setattr__(self, "_codec", precision_codec(self.name))  # an unknown name is an error listing the valid ones
        if isinstance(self.candidates, bool) or not isinstance(self.candidates, int) or self.candidates < 1:
            raise ValueError(f"candidates must be a positive integer; got {self.candidates!r}.")

    @property
    def precision_codec(self) -> PrecisionCodec:
        """The registered codec of this precision: its bytes, build, search, saved files and store settings."""
        return self._codec

    @property
    def is_faiss(self) -> bool:
        """A ``faiss:<index_factory string>`` precision (the built-in FAISS ones are not: see :attr:`uses_factory`)."""
        return self._codec.names_a_factory

    @property
    def is_codec(self) -> bool:
        """A registered codec (``<family>:<bytes>``, :mod:`embedtune.index.codecs.registry`)."""
        return self._codec.family_codec is not None

    @property
    def codec(self) -> CodecFamily:
        """The registered codec's family (an error for the other precisions)."""
        family = self._codec.family_codec
        if family is None:
            raise ValueError(f"precision {self.name!r} is not a registered codec family (<family>:<bytes>).")
        return family

    @property
    def uses_factory(self) -> bool:
        """Stored as a trained FAISS index (``codec.faiss``): ``faiss:`` strings, :data:`FAISS_PRECISIONS`, and the
        deployable registered codecs."""
        return self._codec.faiss_backed

    @property
    def rescore(self) -> str | None:
        """How search rescores the candidates: ``"asym"``, ``"float"`` (from disk) or None."""
        return self._codec.rescore

    @property
    def rescores_float(self) -> bool:
        """Rescores its candidates against float32 vectors kept on disk (:data:`FLOAT_RESCORED`)."""
        return self._codec.rescores_float

    @property
    def tier(self) -> Tier:
        """``"disk-rescore"`` for a precision that rescores with float32 vectors read from disk at query time, else ``"ram"``."""
        return self._codec.tier

    @property
    def is_binary(self) -> bool:
        return self._codec.sign_bits

    @property
    def factory(self) -> str:
        """The FAISS ``index_factory`` string that stores vectors at this precision (binary: ``BFlat``; a registered
        codec: its name, since its FAISS index is fitted on the corpus and travels as ``codec.faiss``)."""
        return self._codec.factory

    def ram_bytes(self, dim: int) -> int:
        """Bytes per vector held in memory to search (binary-rescore, rabitq1-rescore: the codes only)."""
        return self._codec.ram_bytes(dim)

    def disk_bytes(self, dim: int) -> int:
        """Bytes per vector on disk (binary-rescore and rabitq1-rescore also keep the float32 vectors there)."""
        return self._codec.disk_bytes(dim)

    def disk_read_per_query(self, dim: int) -> int:
        """Bytes a query reads from disk: its :attr:`candidates` float32 vectors when it rescores from disk, else none."""
        return self._codec.disk_read_per_query(dim, self.candidates)

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
