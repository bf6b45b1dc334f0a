"""A precision as a registered object: what it stores per vector, what that costs, and how it is built, searched and saved.

Every precision (``float32`` ... ``turboquant4``, ``faiss:<factory>``, ``<family>:<bytes>``) is a
:class:`PrecisionCodec` registered with :func:`register_precision`; :class:`~embedtune.index.codecs.precision.Precision`
looks a name up here, and the plan, the index build, the deployment recipes and the saved files ask
the codec, never the name. A new precision is one module (a subclass) plus one line (the decorator,
and the module's import in :mod:`embedtune.index.codecs.precision`).

A codec answers:

* its bytes: :meth:`~PrecisionCodec.ram_bytes` per vector of dimension ``k``,
  :meth:`~PrecisionCodec.disk_read_per_query`, and its :attr:`~PrecisionCodec.tier`;
* how it is served: :attr:`~PrecisionCodec.factory`, :attr:`~PrecisionCodec.index_kind`,
  :attr:`~PrecisionCodec.rescore`, :attr:`~PrecisionCodec.faiss_backed`;
* fit, encode and search: :meth:`~PrecisionCodec.build` (on the corpus), :meth:`~PrecisionCodec.encode`,
  :meth:`~PrecisionCodec.search`, :meth:`~PrecisionCodec.reconstruct`;
* what travels beside ``precision.json`` (:attr:`~PrecisionCodec.files`, each recorded by its sha256);
* its row of the store settings (:attr:`~PrecisionCodec.store_kind`) and its LanceDB settings.

>>> from embedtune.index.codecs.precision_registry import precision_codec
>>> codec = precision_codec("binary-rescore")
>>> codec.ram_bytes(128), codec.tier, codec.disk_read_per_query(128, candidates=100)
(16, 'disk-rescore', 51200)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from embedtune.evaluate.search import break_ties, rescore as rescore_rows
from embedtune.index.codecs.faiss_scan import faiss_index_search
from embedtune.index.bill import disk_read_per_query
from embedtune.index.codecs.row_encoding import encode_rows
from embedtune.io import atomic_write
from embedtune.runtime import single_threaded

__all__ = [
    "PrecisionCodec",
    "Encoded",
    "StoredIndex",
    "Tier",
    "register_precision",
    "precision_codec",
    "registered_precisions",
    "precision_examples",
    "builtin_precision_names",
    "divisor_near",
    "precision_file_names",
    "faiss_index_of",
    "CALIBRATION_FILE",
    "CALIBRATION_JSON",
    "CODEC_FILE",
]

#: int8: the per-dimension ranges (safetensors) and the same ranges as readable JSON.
CALIBRATION_FILE = "calibration.safetensors"
CALIBRATION_JSON = "calibration.json"
#: A FAISS-backed precision's trained tables, as a FAISS index holding no vectors.
CODEC_FILE = "codec.faiss"

Tier = Literal["ram", "disk-rescore"]


@dataclass
class Encoded:
    """What :meth:`PrecisionCodec.build` made of a corpus: the searchable backend and what search needs beside it."""

    backend: Any
    calibration: Any = None
    float_vectors: np.ndarray | None = None
    codes: np.ndarray | None = None


class StoredIndex(Protocol):
    """The index a codec searches (:class:`~embedtune.index.codecs.quantized_index.QuantizedIndex`)."""

    precision: Any
    dim: int
    backend: Any
    ntotal: int
    calibration: Any
    float_vectors: np.ndarray | None
    codes: np.ndarray | None


class PrecisionCodec(ABC):
    """One precision: subclass, set the class attributes, implement :meth:`ram_bytes`, :attr:`factory` and :meth:`build`.

    A codec of one name sets :attr:`precision_name`; a codec of many names (``faiss:<factory>``)
    overrides :meth:`accepts`, :meth:`examples` and :meth:`listed_as`.

    Args:
        name: the precision's name (one :meth:`accepts`).
    """

    #: The name of a one-name codec (None for a codec of many names).
    precision_name: ClassVar[str | None] = None
    #: One line for tables and error messages.
    summary: ClassVar[str] = ""
    #: How search rescores its candidates: ``"asym"`` (float query · ±1 signs, nothing more kept), ``"float"``
    #: (the float32 vectors, read from disk: the disk-rescore tier), or None.
    rescore: ClassVar[Literal["asym", "float"] | None] = None
    #: The int8 precision: per-dimension ranges fitted on the corpus, saved as :data:`CALIBRATION_FILE`.
    calibrated: ClassVar[bool] = False
    #: Searched by Hamming distance over packed sign bits (a store holds the ±1 signs).
    sign_bits: ClassVar[bool] = False
    #: Search scores are inner products with the float query (Hamming distances are not: no score error is reported).
    scores_are_inner_products: ClassVar[bool] = True
    #: A precision.json of this precision may predate embedtune's digests (read without them); a new codec's never does.
    predates_digests: ClassVar[bool] = False
    #: The fit is embedtune's own code, so a trained index from another embedtune release is not reused.
    fitted_by_embedtune: ClassVar[bool] = False
    #: ``faiss:<factory>``: a FAISS peer named by its bytes, not a precision whose bytes follow the dimension.
    names_a_factory: ClassVar[bool] = False
    #: Encoding fits nothing on the corpus (float16's FAISS ``SQfp16``): an index of it can be built block by block.
    fits_nothing: ClassVar[bool] = False

    def __init__(self, name: str) -> None:
        if not self.accepts(name):
            raise ValueError(f"{type(self).__name__} is not the codec of precision {name!r}.")
        self.name = name

    # -- the name -------------------------------------------------------------------------------
    @classmethod
    def accepts(cls, name: str) -> bool:
        """Whether ``name`` is a precision this codec implements."""
        return cls.precision_name is not None and name == cls.precision_name

    @classmethod
    def examples(cls) -> tuple[str, ...]:
        """Names the contract test builds, saves and searches (every one-name codec: its name)."""
        return (cls.precision_name,) if cls.precision_name else ()

    @classmethod
    def listed_as(cls) -> tuple[str, ...]:
        """How the list of valid precisions names this codec (an error message, ``--help``)."""
        return (cls.precision_name,) if cls.precision_name else ()

    # -- serving ----------------------------------------------------------------------------------
    @property
    @abstractmethod
    def factory(self) -> str:
        """The FAISS ``index_factory`` string that stores vectors at this precision (``BFlat`` for sign bits)."""

    @property
    def index_kind(self) -> str:
        """What ``embedtune index build --kind`` builds for this precision (default: its factory string)."""
        return self.factory

    @property
    def faiss_backed(self) -> bool:
        """Stored as a trained FAISS index: its tables travel as :data:`CODEC_FILE`."""
        return False

    @property
    def deployable(self) -> bool:
        """Whether a plan can ship it (a reference codec is scored beside the others, never chosen)."""
        return True

    @property
    def sweep_cache(self) -> bool:
        """A plan's sweep keeps its trained index in ``WORK/frozen-faiss`` (slow to train: minutes on a small CPU)."""
        return False

    @property
    def family_codec(self) -> Any:
        """The :class:`~embedtune.index.codecs.registry.CodecFamily` of a ``<family>:<bytes>`` codec, else None."""
        return None

    @property
    def files(self) -> tuple[str, ...]:
        """The files saved beside ``precision.json`` (each recorded there by its sha256)."""
        if self.calibrated:
            return (CALIBRATION_FILE, CALIBRATION_JSON)
        return (CODEC_FILE,) if self.faiss_backed else ()

    @property
    def tables_file(self) -> str:
        """The file a precision with trained tables (:attr:`faiss_backed`) keeps them in: :data:`CODEC_FILE`, a FAISS index."""
        return CODEC_FILE

    @property
    def store_kind(self) -> str:
        """Its row of :data:`embedtune.index.store_configs.STORE_SETTINGS` (Qdrant, pgvector and Milvus settings)."""
        raise NotImplementedError(f"precision {self.name!r} names no store_kind; set one of STORE_SETTINGS' rows, e.g. 'other'.")

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        """The LanceDB recipe fields that differ from an exact float32 scan (:func:`embedtune.index.deployment.lancedb_recipe`)."""
        return {"note": f"no LanceDB equivalent of precision {self.name!r}; exact float32 scan"}

    @property
    def faiss_load(self) -> str | None:
        """How FAISS serves it when no ``index_factory`` string makes it (a plan's recipe says so), else None."""
        return None

    def pq_shape(self, dim: int) -> tuple[int, int] | None:
        """``(sub-vectors, bits)`` when the precision is itself a product quantiser a store can match exactly, else None."""
        return None

    # -- bytes ------------------------------------------------------------------------------------
    @abstractmethod
    def ram_bytes(self, dim: int) -> int:
        """Bytes per vector held in RAM to search (a disk-rescore precision: its codes only)."""

    @property
    def rescores_float(self) -> bool:
        return self.rescore == "float"

    @property
    def tier(self) -> Tier:
        """``"disk-rescore"`` when search reads float32 vectors from disk, else ``"ram"``."""
        return "disk-rescore" if self.rescores_float else "ram"

    def disk_bytes(self, dim: int) -> int:
        """Bytes per vector on disk (a disk-rescore precision keeps the float32 vectors there too)."""
        return self.ram_bytes(dim) + (4 * dim if self.rescores_float else 0)

    def disk_read_per_query(self, dim: int, candidates: int) -> int:
        """Bytes a query reads from disk: the float32 candidates of a disk-rescore precision, else none."""
        return disk_read_per_query(self.rescores_float, dim, candidates)

    def fixed_bytes(self, index: StoredIndex) -> int:
        """Bytes that do not grow with the corpus (ranges, codebooks, rotations)."""
        return 0

    # -- fit, encode, search ----------------------------------------------------------------------
    @abstractmethod
    def build(self, xb: np.ndarray, precision: Any, calibration: Any = None, float_vectors: np.ndarray | None = None,
              train: np.ndarray | None = None, trained_index: Any = None) -> Encoded:
        """Fit on the corpus (``train`` rows when given) and encode ``xb`` (``(n, d)`` float32 rows).

        The parameters fitted before, when given, are used instead of a fit: ``calibration`` (int8's
        ranges) or ``trained_index`` (a FAISS-backed precision's trained, empty index, e.g. a saved ``codec.faiss``).
        """

    def trained_copy(self, trained_index: Any) -> Any:
        """An empty copy of a saved, trained FAISS index to add a corpus to (the saved one stays empty)."""
        import faiss

        return faiss.clone_index(trained_index)

    def write_trained(self, trained_index: Any, directory: Path) -> list[str]:
        """Write the trained, empty index into ``directory`` (atomically) and return the names written (:attr:`files`)."""
        import faiss

        atomic_write(Path(directory) / CODEC_FILE, lambda tmp: faiss.write_index(trained_index, str(tmp)))
        return [CODEC_FILE]

    def read_trained(self, directory: Path) -> Any:
        """The trained, empty index :meth:`write_trained` wrote to ``directory``."""
        import faiss

        return faiss.read_index(str(Path(directory) / CODEC_FILE))

    def float_vectors_for(self, xb: np.ndarray, float_vectors: np.ndarray | None) -> np.ndarray | None:
        """The float32 vectors a float rescoring reads (``float_vectors``, e.g. a memory map, else ``xb``), or None."""
        return (float_vectors if float_vectors is not None else xb) if self.rescores_float else None

    def encode(self, x: np.ndarray, calibration: Any = None, trained_index: Any = None) -> np.ndarray:
        """The codes the deployed index stores for ``x`` (a FAISS-backed precision: ``sa_encode`` with the saved tables, a
        pre-transform applied as :func:`~embedtune.index.codecs.row_encoding.encode_rows` applies it, on one thread)."""
        if trained_index is None:
            raise ValueError(f"precision {self.name!r} needs its trained FAISS index ({CODEC_FILE}) to encode.")
        with single_threaded():
            return encode_rows(trained_index, x)

    def search(self, index: StoredIndex, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(D, I)`` of the top ``k`` rows, ``D`` descending, ties by row; ``rescore="float"`` rescores the top ``candidates``."""
        candidates = index.precision.candidates
        fetch = min(index.ntotal, max(k, candidates)) if self.rescores_float else k
        D, I = faiss_index_search(index.backend, xq, fetch)
        D, I = break_ties(D, I.astype(np.int64))
        if not self.rescores_float:
            return D, I
        D, I = break_ties(rescore_rows(xq, index.float_vectors, I), I)
        return D[:, :k], I[:, :k]

    def reconstruct(self, index: StoredIndex, x: np.ndarray) -> np.ndarray | None:
        """What the codes of ``x`` decode to (for the distortion report), or None where search scores no decoded vector.

        The codes are those the index stores for ``x`` (:func:`~embedtune.index.codecs.row_encoding.encode_rows`), not
        FAISS's own ``sa_encode``, whose map can break a near tie another way."""
        try:
            return np.asarray(index.backend.sa_decode(encode_rows(index.backend, x)), dtype=np.float32)
        except RuntimeError:  # a FAISS index type with no standalone decoder
            return None

    def describe(self) -> str:
        return f"{self.name}: {self.summary}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


_CODECS: list[type[PrecisionCodec]] = []


def register_precision(cls: type[PrecisionCodec]) -> type[PrecisionCodec]:
    """Class decorator: make ``cls`` a precision (``Precision(name)``, ``compress plan --precisions``, the plan's checks)."""
    taken = [name for name in cls.examples() for other in _CODECS if other is not cls and other.accepts(name)]
    if taken:
        raise ValueError(f"precision {taken[0]!r} is registered already; give {cls.__name__} another name.")
    if cls.precision_name is None and cls.accepts is PrecisionCodec.accepts.__func__:  # type: ignore[attr-defined]
        raise ValueError(f"{cls.__name__}: set precision_name, or override accepts() (and examples()) for a codec of many names.")
    if cls not in _CODECS:
        _CODECS.append(cls)
    return cls


def registered_precisions() -> tuple[type[PrecisionCodec], ...]:
    """Every registered codec class, in registration order."""
    return tuple(_CODECS)


def precision_examples() -> list[str]:
    """One name or more per registered codec: what the contract test builds, saves, loads and searches."""
    return [name for cls in _CODECS for name in cls.examples()]


def builtin_precision_names() -> tuple[str, ...]:
    """The one-name precisions, in registration order."""
    return tuple(cls.precision_name for cls in _CODECS if cls.precision_name)


def precision_codec(name: str) -> PrecisionCodec:
    """The codec of precision ``name``, or an error listing the valid names."""
    for cls in _CODECS:
        if isinstance(name, str) and cls.accepts(name):
            return cls(name)
    listed = [entry for cls in _CODECS for entry in cls.listed_as()]
    valid = ", ".join(listed[:-1]) + (f", or {listed[-1]}" if len(listed) > 1 else "".join(listed))
    raise ValueError(f"unknown precision {name!r}; valid: {valid}.")


def precision_file_names() -> tuple[str, ...]:
    """Every file name a registered precision saves beside ``precision.json`` (what a precision or plan folder may hold)."""
    names = [CALIBRATION_FILE, CALIBRATION_JSON, CODEC_FILE]
    for cls in _CODECS:
        for example in cls.examples():
            names += [name for name in cls(example).files if name not in names]
    return tuple(names)


def faiss_index_of(index: Any) -> Any:
    """The FAISS index that holds and searches ``index``'s codes: itself, or a wrapper's ``search_index`` (e.g. ``klt-wpq``)."""
    return getattr(index, "search_index", index)


def divisor_near(dim: int, target: int) -> int:
    """The divisor of ``dim`` closest to ``target`` (a store's product quantiser needs sub-vectors that divide the dimension)."""
    return min((m for m in range(1, dim + 1) if dim % m == 0), key=lambda m: (abs(m - target), m))
