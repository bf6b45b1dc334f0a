"""Vectors stored at one :class:`~embedtune.index.codecs.precision.Precision` and searched as deployed.

:class:`QuantizedIndex` is what ``compress plan`` scores every candidate with, and what
``index build --plan`` rebuilds on disk; both encode through the codecs of this package, so the
scored and the served codes are the same. :meth:`QuantizedIndex.save_precision` and
:func:`load_precision` persist the precision (and the int8 ranges) next to a compressor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.evaluate.search import as_rows
from embedtune.index.codecs.int8 import Calibration
from embedtune.index.codecs.precision import Precision
from embedtune.index.codecs.precision_registry import CALIBRATION_FILE, CALIBRATION_JSON, CODEC_FILE, precision_file_names
from embedtune.io import IntegrityError, read_json_verified, sha256_file, verify_sha256, write_json_with_digest
from embedtune.runtime import single_threaded

__all__ = ["QuantizedIndex", "load_precision", "read_codec_index", "read_precision_json", "PRECISION_FILE", "CALIBRATION_FILE", "CALIBRATION_JSON", "CODEC_FILE"]

PRECISION_FILE = "precision.json"


class QuantizedIndex:
    """Vectors stored at one :class:`Precision`, searched exhaustively (or by the FAISS index given).

    Build with :meth:`build`; ``search`` takes float32 queries in the same space. What each step does
    is the precision's registered codec's (:attr:`Precision.precision_codec`).

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
              float_vectors: np.ndarray | None = None, train: np.ndarray | None = None, trained_index: Any = None) -> "QuantizedIndex":
        """Encode ``xb`` at ``precision``.

        Args:
            xb: ``(n, d)`` float vectors (the compressed corpus).
            precision: a :class:`Precision` or its name.
            calibration: int8 ranges to use (default: fitted on ``xb``).
            float_vectors: binary-rescore, rabitq1-rescore: the float32 vectors to rescore against
                (default: ``xb``; pass a memory map of the file on disk to keep them out of RAM).
            train: FAISS factory indexes that need training (``faiss:``, int4's ranges, RaBitQ's
                centroid) and the registered codecs are trained on these rows (default: ``xb``).
            trained_index: a FAISS-backed precision's trained, empty index (a saved ``codec.faiss``) to use instead of training.
        """
        precision = Precision(precision) if isinstance(precision, str) else precision
        xb = as_rows(xb, "xb")
        n, d = xb.shape
        with single_threaded():  # the same tables and codes on any thread count (see embedtune.runtime.single_threaded)
            encoded = precision.precision_codec.build(xb, precision, calibration=calibration, float_vectors=float_vectors,
                                                      train=as_rows(train, "train") if train is not None else None,
                                                      trained_index=trained_index)
        return cls(precision, d, encoded.backend, n, calibration=encoded.calibration, float_vectors=encoded.float_vectors,
                   codes=encoded.codes)

    def ram_bytes(self) -> int:
        """Bytes per vector held in RAM to search (see :meth:`Precision.ram_bytes`)."""
        return self.precision.ram_bytes(self.dim)

    def disk_bytes(self) -> int:
        return self.precision.disk_bytes(self.dim)

    def fixed_bytes(self) -> int:
        """Bytes that do not grow with the corpus: int8 ranges, or a FAISS index's tables (codebooks, rotations)."""
        return self.precision.precision_codec.fixed_bytes(self)

    def reconstruct(self, x: np.ndarray) -> np.ndarray | None:
        """What the codes of ``x`` (rows in this index's space) decode to, for the distortion report; None where the
        codes have no reconstruction the search scores against (binary Hamming codes, RaBitQ's estimator, FAISS types
        without ``sa_decode``).

        binary-asym scores the float query against ``±1`` signs, so its reconstruction is those signs scaled to the
        rows' mean absolute value (the least-squares scale of a sign code).
        """
        return self.precision.precision_codec.reconstruct(self, as_rows(x, "x"))

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(D, I)`` of the top ``k`` rows for each float query, ``D`` descending, ties by row."""
        xq = as_rows(xq, "xq")
        if xq.shape[1] != self.dim:
            raise ValueError(f"queries are {xq.shape[1]}-d but the index holds {self.dim}-d vectors.")
        return self.precision.precision_codec.search(self, xq, min(int(k), self.ntotal))

    def trained_copy(self) -> Any:
        """The built-in FAISS precisions: a copy of the FAISS index with its trained tables and no vectors."""
        codec = self.precision.precision_codec
        if not codec.faiss_backed or self.backend is None:
            raise ValueError(f"precision {self.precision.name!r} keeps no trained FAISS tables.")
        trained = codec.trained_copy(self.backend)
        trained.reset()
        return trained

    def save_precision(self, directory: str | Path, compressor_state_sha256: str | None = None) -> Path:
        """Write ``precision.json`` and what encoding needs: the int8 ``calibration.safetensors`` + ``.json``, or the
        FAISS precisions' trained tables (``codec.faiss``: int4, RaBitQ, TurboQuant and ``faiss:`` factories), so a
        deployment never refits them; a codec that encodes with more than its FAISS index saves that too (its ``files``).

        ``compressor_state_sha256``: the fitted state of the compressor whose output these codes encode
        (an exported model's), recorded so the precision is never read beside another compressor.
        """
        codec = self.precision.precision_codec
        if not codec.deployable:
            raise ValueError(f"codec {self.precision.name!r} is a reference codec, scored beside the others but not deployable "
                             "(it is not a FAISS index); choose a deployable precision.")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        if CALIBRATION_FILE in codec.files and self.calibration is not None:
            self.calibration.save(directory / CALIBRATION_FILE)
            self.calibration.to_json(directory / CALIBRATION_JSON)
            written += [CALIBRATION_FILE, CALIBRATION_JSON]
        if codec.tables_file in codec.files and self.backend is not None:
            trained = self.trained_copy() if self.backend.ntotal else self.backend
            written += codec.write_trained(trained, directory)  # codec.faiss, and what the codec encodes with beside it
        # Every file beside precision.json is recorded by its sha256, and precision.json by its own: a flipped byte or
        # a swapped file is refused on load instead of silently changing the deployed codes.
        write_json_with_digest(directory / PRECISION_FILE, {**self.precision.to_dict(), "dim": self.dim, "factory": self.precision.factory,
                                                            "files_sha256": {name: sha256_file(directory / name) for name in written},
                                                            **({"compressor_state_sha256": compressor_state_sha256}
                                                               if compressor_state_sha256 is not None else {})})
        return directory


def load_precision(directory: str | Path, require_digest: bool = False) -> tuple[Precision, Calibration | None]:
    """Read what :meth:`QuantizedIndex.save_precision` wrote, every file checked (:func:`read_precision_json`).

    The int8 ranges must agree with their readable copy (``calibration.json``) and the dimension:
    one file swapped in from another precision folder is refused even with every digest recomputed.
    """
    directory = Path(directory)
    path = directory / PRECISION_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {PRECISION_FILE}; write it with QuantizedIndex.save_precision or `compress plan`.")
    values = read_precision_json(directory, require_digest=require_digest)
    precision = Precision.from_dict({k: v for k, v in values.items() if k in ("name", "candidates", "nprobe")})
    calibration = Calibration.load(directory / CALIBRATION_FILE) if (directory / CALIBRATION_FILE).is_file() else None
    files = precision.precision_codec.files
    if CALIBRATION_FILE in files and calibration is None:
        raise FileNotFoundError(f"{directory}: precision {precision.name} needs {CALIBRATION_FILE} (its per-dimension ranges).")
    for name in precision_file_names():
        if (directory / name).is_file() and name not in files:  # the files say another precision than precision.json does
            raise IntegrityError(f"{directory / PRECISION_FILE}: precision {precision.name!r} has no use for {directory / name}, which "
                                 f"another precision wrote. {_PRECISION_FIX}")
    if calibration is not None:
        if isinstance(values.get("dim"), int) and calibration.dim != values["dim"]:
            raise IntegrityError(f"{directory / CALIBRATION_FILE}: {calibration.dim} ranges, but {PRECISION_FILE} field 'dim' is "
                                 f"{values['dim']}. {_PRECISION_FIX}")
        readable_path = directory / CALIBRATION_JSON
        if readable_path.is_file():
            try:
                readable = json.loads(readable_path.read_text(encoding="utf-8"))
                same = (np.array_equal(np.asarray(readable.get("vmin"), np.float32), calibration.vmin)
                        and np.array_equal(np.asarray(readable.get("vmax"), np.float32), calibration.vmax))
            except (ValueError, TypeError, AttributeError):
                same = False
            if not same:
                raise IntegrityError(f"{directory / CALIBRATION_FILE}: its ranges differ from {readable_path}'s. {_PRECISION_FIX}")
    return precision, calibration


_PRECISION_FIX = "Write it again with `embedtune compress plan` (or QuantizedIndex.save_precision)."


def read_precision_json(directory: str | Path, require_digest: bool = False) -> dict[str, Any]:
    """``precision.json``, its own digest checked, and the sha256 of every file it lists (``files_sha256``) verified.

    A file written before embedtune recorded digests (no ``content_sha256``) is read as it is, for the
    precisions that predate them (``PrecisionCodec.predates_digests``: a registered codec's files were
    always recorded), and never with ``require_digest`` (an exported model's precision, always written
    with its digests).
    """
    directory = Path(directory)
    values, verified = read_json_verified(directory / PRECISION_FILE, _PRECISION_FIX, require_digest=require_digest)
    recorded = values.get("files_sha256")
    if verified and not isinstance(recorded, dict):
        raise IntegrityError(f"{directory / PRECISION_FILE}: field 'files_sha256' is missing. {_PRECISION_FIX}")
    if not verified and isinstance(values.get("name"), str) and not Precision(values["name"]).precision_codec.predates_digests:
        raise IntegrityError(f"{directory / PRECISION_FILE}: field 'content_sha256' is missing, which a {values['name']!r} "
                             f"precision.json always has. {_PRECISION_FIX}")
    known = precision_file_names()
    for name, digest in sorted((recorded or {}).items()):
        if name not in known or not isinstance(digest, str):
            raise IntegrityError(f"{directory / PRECISION_FILE}: field 'files_sha256' lists {name!r}, which is not a precision file. "
                                 f"{_PRECISION_FIX}")
        verify_sha256(directory / name, digest, _PRECISION_FIX)
    if verified:
        for name in known:
            if (directory / name).is_file() and name not in recorded:
                raise IntegrityError(f"{directory / name}: not listed in {directory / PRECISION_FILE} field 'files_sha256', so it is "
                                     f"not this precision's. {_PRECISION_FIX}")
    return values


def read_codec_index(directory: str | Path, precision: Precision, dim: int) -> Any:
    """The trained, empty FAISS index :meth:`QuantizedIndex.save_precision` wrote (``codec.faiss``, and what the codec encodes
    with beside it), checked against the precision."""
    tables = precision.precision_codec.tables_file
    path = Path(directory) / tables
    if (Path(directory) / PRECISION_FILE).is_file():
        read_precision_json(directory)  # the codec files' digests, recorded when they were written
    if not path.is_file():
        raise FileNotFoundError(f"{Path(directory)}: precision {precision.name!r} needs {tables} (its trained tables), "
                                "which plans written before embedtune kept them lack; write the plan again with `embedtune compress plan`.")
    index = precision.precision_codec.read_trained(Path(directory))
    if index.d != dim or index.ntotal != 0 or not index.is_trained or index.sa_code_size() != precision.ram_bytes(dim):
        raise ValueError(f"{path}: holds a {type(index).__name__} of {index.d}-d vectors with {index.sa_code_size()}-byte codes "
                         f"({index.ntotal} vectors, trained: {bool(index.is_trained)}), not the trained, empty {precision.factory!r} "
                         f"index of {dim}-d vectors precision {precision.name!r} needs. Write the plan again with `embedtune compress plan`.")
    return index
