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
['klt-pq', 'klt-pq4', 'klt-rq', 'klt-sq']
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

__all__ = ["CodecFamily", "register_codec", "codec_family", "registered_codecs", "is_registered_codec", "CODEC_NAME", "MAX_CODE_BYTES"]

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
