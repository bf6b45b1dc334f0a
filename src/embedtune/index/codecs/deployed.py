"""The deployed codes of a planned precision, with every fitted parameter saved once: :class:`DeployedCodec`.

sentence-transformers' ``quantize_embeddings`` calibrates int8 ranges on whatever it is given
(or on ``calibration_embeddings``), so encoding a stream batch by batch gives codes whose
ranges differ per batch. A :class:`DeployedCodec` holds the parameters the plan fitted on the
corpus (the int8 ranges, or FAISS's trained tables: SQ4 ranges, RaBitQ's centroid, TurboQuant's
codebook, PQ codebooks) and encodes every later batch with exactly those, the same codes the
plan scored and ``index build --plan`` stores:

>>> from sentence_transformers import SentenceTransformer                   # doctest: +SKIP
>>> from embedtune.index.codecs import DeployedCodec
>>> codec = DeployedCodec.load("model-dive-int8")   # an exported model folder, or a plan folder  # doctest: +SKIP
>>> codes = codec.encode(SentenceTransformer("model-dive-int8").encode(texts))  # (n, codec.code_size) uint8  # doctest: +SKIP

Saved as a folder: ``precision.json``, plus ``calibration.safetensors`` and ``calibration.json``
(int8) or ``codec.faiss`` (a trained, empty FAISS index: the built-in FAISS precisions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress import load_compressor
from embedtune.compress.st_export import COMPRESSOR_SUBFOLDER
from embedtune.evaluate.search import as_rows
from embedtune.io import IntegrityError
from embedtune.index.codecs.int8 import Calibration
from embedtune.index.codecs.precision import Precision
from embedtune.index.codecs.quantized_index import CODEC_FILE, PRECISION_FILE, QuantizedIndex, load_precision, read_codec_index

__all__ = ["DeployedCodec", "PRECISION_SUBFOLDER"]

#: Where an exported sentence-transformers folder keeps its planned precision.
PRECISION_SUBFOLDER = "embedtune_precision"


class DeployedCodec:
    """Encode float vectors (the compressed embeddings) into the codes a planned precision stores.

    Build with :meth:`from_index` (a :class:`QuantizedIndex` built on the corpus), or read one
    with :meth:`load`. ``encode`` never refits anything: every batch is encoded with the saved
    parameters.

    Attributes:
        precision: the :class:`Precision`.
        dim: the dimension of the vectors it encodes.
        calibration: int8: the per-dimension ranges.
        trained_index: the built-in FAISS precisions: a trained FAISS index holding no vectors.
    """

    def __init__(self, precision: Precision, dim: int, calibration: Calibration | None = None, trained_index: Any = None) -> None:
        codec = precision.precision_codec
        if codec.calibrated and calibration is None:
            raise ValueError(f"precision {precision.name} needs its calibration (the per-dimension ranges fitted on the corpus).")
        if codec.faiss_backed and trained_index is None:
            raise ValueError(f"precision {precision.name!r} needs its trained FAISS index ({CODEC_FILE}).")
        self.precision, self.dim, self.calibration, self.trained_index = precision, int(dim), calibration, trained_index

    @classmethod
    def from_index(cls, index: QuantizedIndex) -> "DeployedCodec":
        """The codec of ``index``'s precision with the parameters it was built with."""
        faiss_backed = index.precision.precision_codec.faiss_backed
        return cls(index.precision, index.dim, index.calibration, index.trained_copy() if faiss_backed else None)

    @property
    def code_size(self) -> int:
        """Bytes per encoded vector (what :meth:`encode` returns per row)."""
        return self.precision.ram_bytes(self.dim)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """``(n, dim)`` float vectors -> their codes.

        float32, float16: the values at that dtype; int8: FAISS SQ8's uint8 codes with the saved
        ranges; binary*: the packed sign bits; the FAISS precisions: ``sa_encode`` with the saved
        trained tables (``(n, code_size)`` uint8).
        """
        x = as_rows(x, "the vectors to encode")
        if x.shape[1] != self.dim:
            raise ValueError(f"the codec encodes {self.dim}-d vectors (the compressor's output); got {x.shape[1]}-d. "
                             "Encode with the exported model (or the plan's compressor) first.")
        return self.precision.precision_codec.encode(x, self.calibration, self.trained_index)

    def build_index(self, xb: np.ndarray, float_vectors: np.ndarray | None = None) -> QuantizedIndex:
        """``xb`` (``(n, dim)`` float vectors) stored and searchable with the saved parameters, nothing refitted."""
        return QuantizedIndex.build(xb, self.precision, calibration=self.calibration, float_vectors=float_vectors,
                                    trained_index=self.trained_index)

    def save(self, directory: str | Path, compressor_state_sha256: str | None = None) -> Path:
        """Write ``precision.json`` and the fitted parameters into ``directory`` (every file atomically).

        Every file's sha256 goes into ``precision.json``, which carries its own digest too;
        ``compressor_state_sha256`` (an exported model's compressor) ties the codes to the
        compressor whose output they encode.
        """
        index = QuantizedIndex(self.precision, self.dim, self.trained_index, 0, calibration=self.calibration)
        return index.save_precision(directory, compressor_state_sha256=compressor_state_sha256)

    @classmethod
    def load(cls, directory: str | Path) -> "DeployedCodec":
        """Read a codec from a plan folder, an exported model folder (its ``embedtune_precision/``), or a folder :meth:`save` wrote.

        Every file is checked against the digests ``precision.json`` records; an exported model's
        precision must carry them (a missing digest is an error), and must be the precision of the
        model's own compressor.
        """
        directory = Path(directory)
        model_folder = None
        if not (directory / PRECISION_FILE).is_file() and (directory / PRECISION_SUBFOLDER / PRECISION_FILE).is_file():
            model_folder, directory = directory, directory / PRECISION_SUBFOLDER
        precision, calibration = load_precision(directory, require_digest=model_folder is not None)
        if model_folder is not None:
            _check_model_compressor(model_folder, directory)
        dim = int(_read_dim(directory))
        trained = read_codec_index(directory, precision, dim) if precision.precision_codec.faiss_backed else None
        return cls(precision, dim, calibration, trained)


def _check_model_compressor(model_folder: Path, directory: Path) -> None:
    """An exported model's precision was written for the compressor it ships (``embedtune_compressor/``): refuse another's."""

    recorded = json.loads((directory / PRECISION_FILE).read_text(encoding="utf-8")).get("compressor_state_sha256")
    compressor_dir = model_folder / COMPRESSOR_SUBFOLDER
    if recorded is None or not compressor_dir.is_dir():
        return  # exported before the compressor was recorded, or a model without embedtune's compressor copy
    actual = load_compressor(compressor_dir).state_sha256()
    if actual != recorded:
        raise IntegrityError(f"{directory / PRECISION_FILE}: field 'compressor_state_sha256' is {recorded[:12]}..., but the model's "
                             f"compressor ({compressor_dir}) has state {actual[:12]}...: this precision was fitted for another "
                             "compressor's output. Fix: export the model again with `embedtune compress export --plan`.")


def _read_dim(directory: Path) -> int:
    values = json.loads((directory / PRECISION_FILE).read_text(encoding="utf-8"))
    dim = values.get("dim")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"{directory / PRECISION_FILE}: field 'dim' must be a positive integer; got {dim!r}. "
                         "Write it again with `embedtune compress plan`.")
    return dim
