"""Registered codecs: a codec family is one module plus one :func:`register_codec` line.

A registered codec is named by data, as FAISS ``index_factory`` strings are:
``"<family>:<bytes per vector>"``, e.g. ``"klt-pq:32"`` (a KLT, then product quantisation of the
principal axes, 32 bytes per vector in RAM). The byte budget is part of the name, so a codec costs
the same on every compressor's output; what it keeps of those bytes (how many axes, how many bits
each) is fitted on the corpus.

A family turns a name and the corpus into a *trained, empty index*: an object with the FAISS index
interface the rest of :mod:`embedtune.index` already speaks (``d``, ``ntotal``, ``is_trained``,
``add``, ``search``, ``sa_encode``, ``sa_decode``, ``sa_code_size``, ``reset``). The FAISS-backed
families return a real FAISS index, so saving (``codec.faiss``), ``index build --plan``, ``search``
and ``compress export`` need nothing new. A family that cannot be a FAISS index says so
(``deployable = False``): it is scored in a plan's sweep, beside the others, but never chosen.

>>> from embedtune.index.codecs.registry import codec_family, registered_codecs
>>> family = codec_family("klt-pq:32")
>>> family.code_size(384), family.bits(384)
(32, 256)
>>> sorted(registered_codecs())                                     # doctest: +SKIP
['klt-apq', 'klt-pq', 'klt-pq4', 'klt-rq', 'klt-sq', 'klt-wpq']
"""

from __future__ import annotations

import functools
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from embedtune.index.codecs.precision_registry import CODEC_FILE, Encoded, PrecisionCodec, StoredIndex, divisor_near, register_precision
from embedtune.index.codecs.row_encoding import ENCODE_BLOCK_ROWS, add_encoded
from embedtune.index.codecs.sphere import sphere_search
from embedtune.runtime import single_threaded

__all__ = ["FamilyCodecPrecision", "CodecFamily", "add_encoded", "ENCODE_BLOCK_ROWS", "register_codec", "codec_family", "registered_codecs", "is_registered_codec", "CODEC_NAME", "MAX_CODE_BYTES"]

#: A registered codec's name: ``<family>:<bytes per vector>``.
CODEC_NAME = re.compile(r"^([a-z][a-z0-9-]*):(\d+)$")
#: Above this many bytes per vector a code is larger than int8 of a 4096-d vector: certainly a typo.
MAX_CODE_BYTES = 4096

_FAMILIES: dict[str, type["CodecFamily"]] = {}


class CodecFamily(ABC):
    """One way of coding vectors at a byte budget (see the module docstring).

    Subclasses set ``family`` (the name before the colon), ``summary`` (one line for tables and
    ``--help``) and ``deployable``, and implement :meth:`train`.

    Args:
        code_bytes: bytes per vector held in RAM.
    """

    family: ClassVar[str]
    summary: ClassVar[str]
    #: Whether :meth:`train` returns a FAISS index (saved as ``codec.faiss``, served by ``index build --plan``).
    deployable: ClassVar[bool] = True
    #: Whether :meth:`train` returns a plain FAISS index. A deployable family that encodes otherwise than its search index
    #: would (a wrapper around a FAISS search index) sets False and gives its trained object ``clone_empty()``,
    #: ``serialized_bytes()`` and ``write(directory) -> file names``, and :meth:`read_trained`; a plan's sweep does not cache it.
    faiss_index: ClassVar[bool] = True
    #: The files a deployable family's trained tables are saved as, beside ``precision.json`` (the first holds the tables).
    files: ClassVar[tuple[str, ...]] = (CODEC_FILE,)
    #: Whether no FAISS index type holds these codes, so embedtune's own numpy scan serves them (with ``faiss_index`` False:
    #: the trained object is a :class:`~embedtune.index.codecs.textbook.RotatedCodeIndex`, and an index folder keeps its
    #: tables and codes in one safetensors file).
    numpy_scan: ClassVar[bool] = False
    #: Whether :meth:`train` needs rows of one common norm (a cosine model's unit vectors) and refuses others.
    requires_common_norm: ClassVar[bool] = False
    #: Candidates per query that a deployable family's search ranks by their decoded direction
    #: (:func:`embedtune.index.codecs.sphere.sphere_rescore`; it then requires a common norm), or 0: the plain scores.
    sphere_candidates: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every family's fit runs on one thread (embedtune.runtime.single_threaded): OpenBLAS rounds some products
        # differently on 1 and 2 threads and k-means then finds other codebooks, so without it the tables would depend on
        # the machine a plan ran on. Declared here once, so a new family cannot forget it.
        train = cls.__dict__.get("train")
        if train is not None and not getattr(train, "__isabstractmethod__", False):
            @functools.wraps(train)
            def serial_train(self: "CodecFamily", *args: Any, **kwargs: Any) -> Any:
                with single_threaded():
                    return train(self, *args, **kwargs)

            cls.train = serial_train  # type: ignore[method-assign]

    def __init__(self, code_bytes: int) -> None:
        if isinstance(code_bytes, bool) or not isinstance(code_bytes, (int, np.integer)) or not 1 <= int(code_bytes) <= MAX_CODE_BYTES:
            raise ValueError(f"codec {self.family!r}: bytes per vector must be an integer in [1, {MAX_CODE_BYTES}]; got {code_bytes!r}.")
        self.code_bytes = int(code_bytes)

    @property
    def name(self) -> str:
        return f"{self.family}:{self.code_bytes}"

    def code_size(self, dim: int) -> int:
        """Bytes per vector in RAM: the budget in the name, whatever the dimension."""
        return self.code_bytes

    def bits(self, dim: int) -> int:
        """Bits per vector (for the rate-distortion bound)."""
        return 8 * self.code_size(dim)

    def check_dim(self, dim: int) -> None:
        """Raise when ``dim``-d vectors cannot be coded at this budget (a family may refuse budgets above float32's)."""
        if self.code_bytes > 4 * dim:
            raise ValueError(f"codec {self.name!r}: {self.code_bytes} bytes per vector is more than float32 of {dim}-d vectors "
                             f"({4 * dim} bytes); use float32, or a budget of at most {4 * dim}.")

    @abstractmethod
    def train(self, x: np.ndarray, seed: int = 0) -> Any:
        """The trained, empty index for ``x``'s space, fitted on ``x``'s rows (a sample of them when many)."""

    def read_trained(self, directory: Path) -> Any:
        """The trained, empty index written to ``directory`` (a plain FAISS index: :data:`CODEC_FILE`)."""
        import faiss

        return faiss.read_index(str(Path(directory) / CODEC_FILE))

    def mismatch(self, index: Any) -> str | None:
        """What makes a read ``index`` another codec's tables than this family's, or None (a family served by embedtune's
        numpy scan says; a FAISS index is checked by its reader)."""
        return None

    def describe(self) -> str:
        return f"{self.name}: {self.summary}"


def register_codec(cls: type[CodecFamily]) -> type[CodecFamily]:
    """Class decorator: make ``cls.family`` a codec name (``<family>:<bytes>``)."""
    if not CODEC_NAME.match(f"{cls.family}:1"):
        raise ValueError(f"codec family {cls.family!r}: use lower-case letters, digits and '-'.")
    if cls.family in _FAMILIES and _FAMILIES[cls.family] is not cls:
        raise ValueError(f"codec family {cls.family!r} is registered already ({_FAMILIES[cls.family].__module__}).")
    _FAMILIES[cls.family] = cls
    return cls


def registered_codecs() -> dict[str, type[CodecFamily]]:
    """Every registered family, by name (importing :mod:`embedtune.index.codecs` registers the built-in ones)."""
    return dict(_FAMILIES)


def is_registered_codec(name: str) -> bool:
    """Whether ``name`` is ``<registered family>:<bytes>``."""
    match = CODEC_NAME.match(name) if isinstance(name, str) else None
    return bool(match) and match.group(1) in _FAMILIES  # type: ignore[union-attr]


def codec_family(name: str) -> CodecFamily:
    """The :class:`CodecFamily` of a codec name such as ``"klt-pq:32"``, or an error listing the families."""
    match = CODEC_NAME.match(name) if isinstance(name, str) else None
    if match is None or match.group(1) not in _FAMILIES:
        valid = ", ".join(f"{family}:<bytes>" for family in sorted(_FAMILIES))
        raise ValueError(f"unknown codec {name!r}; registered codecs: {valid}.")
    return _FAMILIES[match.group(1)](int(match.group(2)))


@register_precision
class FamilyCodecPrecision(PrecisionCodec):
    """The precision of a registered codec family's name (``klt-pq:32``): fitted on the corpus by its :class:`CodecFamily`."""

    summary = "a registered codec family at a byte budget, fitted on the corpus"
    fitted_by_embedtune = True  # the fit is embedtune's code: another release may fit it otherwise
    store_kind = "product"

    @classmethod
    def accepts(cls, name: str) -> bool:
        return is_registered_codec(name)

    @classmethod
    def examples(cls) -> tuple[str, ...]:
        # 4 bytes: residual quantisation trains one 256-centroid stage per byte, and the contract, not the rate, is under test.
        return tuple(f"{family}:4" for family in sorted(_FAMILIES))

    @classmethod
    def listed_as(cls) -> tuple[str, ...]:
        return (f"a registered codec ({', '.join(f'{family}:<bytes>' for family in sorted(_FAMILIES))})",)

    @property
    def family_codec(self) -> CodecFamily:
        return codec_family(self.name)

    @property
    def factory(self) -> str:
        """Its name: no ``index_factory`` string makes it; its FAISS index is fitted on the corpus and travels as ``codec.faiss``."""
        return self.name

    @property
    def faiss_backed(self) -> bool:
        return self.family_codec.deployable

    @property
    def deployable(self) -> bool:
        return self.family_codec.deployable

    @property
    def sweep_cache(self) -> bool:
        # The sweep's cache writes and reads plain FAISS indexes; a wrapper (its own encoder beside them) is refitted instead.
        return self.family_codec.deployable and self.family_codec.faiss_index

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(self.family_codec.files) if self.faiss_backed else ()

    @property
    def tables_file(self) -> str:
        return self.family_codec.files[0]

    @property
    def faiss_load(self) -> str:
        candidates = self.family_codec.sphere_candidates
        if candidates:
            return (f"{self._faiss_load()}; then search each query for its top {candidates} and rank them by q · x / |x|, x each "
                    "candidate's decoded vector (index.reconstruct_batch: from RAM), as "
                    "embedtune.index.codecs.sphere.sphere_rescore does; `embedtune search` does it")
        return self._faiss_load()

    def _faiss_load(self) -> str:
        if self.family_codec.numpy_scan:
            return (f"no FAISS index type holds these codes: load {self.tables_file} (the codec's tables, fitted on the corpus) with "
                    "embedtune.index.codecs.read_rotated_index, add the compressed vectors with its add(), and search it with its "
                    "search() (a numpy scan); `embedtune index build --plan` and `embedtune search` do this")
        if not self.family_codec.faiss_index:
            # FAISS's own add() would encode in another metric than the codes the plan scored.
            return (f"load {CODEC_FILE} with faiss.read_index (the codec's search tables, fitted on the corpus), then add the codes "
                    "of the compressed vectors with add_sa_codes, encoded by embedtune.index.codecs.DeployedCodec (the plan folder's "
                    f"{', '.join(self.files[1:])} beside {CODEC_FILE}), not with add(); `embedtune index build --plan` does both")
        return (f"load {CODEC_FILE} with faiss.read_index (the codec's tables, fitted on the corpus), then add the "
                "compressed vectors; `embedtune index build --plan` does both")

    def ram_bytes(self, dim: int) -> int:
        return self.family_codec.code_size(dim)

    def fixed_bytes(self, index: StoredIndex) -> int:
        if not self.faiss_backed:
            return int(index.backend.fixed_bytes())
        if not self.family_codec.faiss_index:
            return max(0, index.backend.serialized_bytes() - index.ntotal * self.ram_bytes(index.dim))
        import faiss

        serialized = faiss.serialize_index(index.backend).size
        return max(0, int(serialized) - index.ntotal * self.ram_bytes(index.dim))

    def trained_copy(self, trained_index: Any) -> Any:
        return super().trained_copy(trained_index) if self.family_codec.faiss_index else trained_index.clone_empty()

    def write_trained(self, trained_index: Any, directory: Path) -> list[str]:
        if self.family_codec.faiss_index:
            return super().write_trained(trained_index, directory)
        return list(trained_index.write(Path(directory)))

    def read_trained(self, directory: Path) -> Any:
        return self.family_codec.read_trained(Path(directory))

    def build(self, xb: np.ndarray, precision: Any, calibration: Any = None, float_vectors: np.ndarray | None = None,
              train: np.ndarray | None = None, trained_index: Any = None) -> Encoded:
        index = self.trained_copy(trained_index) if trained_index is not None else self.family_codec.train(train if train is not None else xb)
        add_encoded(index, xb)
        return Encoded(index)

    def search(self, index: StoredIndex, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        candidates = self.family_codec.sphere_candidates
        if not candidates:
            return super().search(index, xq, k)
        return sphere_search(index.backend, xq, k, candidates)  # the candidates' codes are decoded from RAM: nothing from disk

    def reconstruct(self, index: StoredIndex, x: np.ndarray) -> np.ndarray | None:
        decoded = super().reconstruct(index, x)
        if decoded is None or not self.family_codec.sphere_candidates:
            return decoded
        # What the search scores: each decoded direction, at the norm of the row it codes (rows share one norm).
        norms = np.linalg.norm(decoded.astype(np.float64), axis=1, keepdims=True)
        scale = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=1, keepdims=True) / np.maximum(norms, 1e-30)
        return (decoded * scale).astype(np.float32)

    def lancedb_settings(self, dim: int, candidates: int, top_k: int) -> dict[str, Any]:
        return {"index": {"index_type": "IVF_PQ", "distance_type": "dot", "num_sub_vectors": divisor_near(dim, self.ram_bytes(dim)),
                          "num_bits": 8},
                "note": f"LanceDB has no {self.family_codec.family} codec: IVF_PQ at about the same bytes, and LanceDB trains its own "
                        "codebooks (no KLT), not the plan's"}
