"""The textbook transform coder, ``klt-sq:B``: KLT, reverse water-filling of the bits, one Lloyd-Max quantiser per axis.

The reference every other codec of :mod:`embedtune.index.codecs.transform` is measured against
(Huang & Schultheiss 1963; Gersho & Gray, *Vector Quantization and Signal Compression*, §8.3):

1. rotate the documents onto their principal axes (the KLT, fitted on the corpus);
2. split the ``8B`` bits over the axes by reverse water-filling with integer bits: each extra bit
   goes to the axis whose distortion, ``λ_i · 4^(-b_i)``, is largest (at most 8 bits an axis);
3. quantise each axis with its own Lloyd-Max scalar quantiser (1-D k-means on the corpus's values);
4. score the float query against the dequantised documents.

The codes are bit-packed (``ceil(Σ b_i / 8) = B`` bytes per vector). It is a *reference* codec
(``deployable = False``): FAISS has no index type for per-axis quantisers of unequal bits, so a
plan scores it beside the others but never chooses it; its index searches in numpy.
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from embedtune.evaluate.search import exact_search_blocks
from embedtune.index.codecs.registry import CodecFamily, register_codec
from embedtune.index.codecs.sphere import common_norm
from embedtune.index.codecs.transform import sampled_klt
from embedtune.io import IntegrityError, atomic_write_json, load_weights, save_weights, sha256_file, verify_sha256

__all__ = ["KltSQ", "KltSQSphere", "RotatedCodeIndex", "ScalarTransformIndex", "TABLES_FILE", "is_rotated_index", "read_rotated_index",
           "register_rotated_index", "water_filling_bits", "lloyd_max"]

MAX_BITS_PER_AXIS = 8
LLOYD_ITERATIONS = 30
_SEARCH_BLOCK = 32_768


def water_filling_bits(eigenvalues: np.ndarray, bits: int, cap: int = MAX_BITS_PER_AXIS) -> np.ndarray:
    """Integer bits per axis: each of ``bits`` goes to the axis with the largest ``λ_i 4^(-b_i)`` (at most ``cap`` each)."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    if bits > cap * len(lam):
        raise ValueError(f"{bits} bits do not fit {len(lam)} axes of at most {cap} bits.")
    allocation = np.zeros(len(lam), dtype=np.int64)
    heap = [(-float(value), axis) for axis, value in enumerate(lam)]
    heapq.heapify(heap)
    for _ in range(int(bits)):
        value, axis = heapq.heappop(heap)
        allocation[axis] += 1
        if allocation[axis] < cap:
            heapq.heappush(heap, (value / 4.0, axis))
    return allocation


def lloyd_max(values: np.ndarray, levels: int, iterations: int = LLOYD_ITERATIONS) -> np.ndarray:
    """The ``levels`` reconstruction points of a 1-D Lloyd-Max quantiser fitted on ``values`` (ascending)."""
    values = np.sort(np.asarray(values, dtype=np.float64))
    points = np.quantile(values, (np.arange(levels) + 0.5) / levels)
    for _ in range(iterations):
        cells = np.searchsorted((points[1:] + points[:-1]) / 2, values)
        sums = np.bincount(cells, values, levels)
        counts = np.bincount(cells, None, levels)
        updated = np.where(counts > 0, sums / np.maximum(counts, 1), points)
        if np.allclose(updated, points):
            break
        points = updated
    return np.sort(points)


class RotatedCodeIndex:
    """The FAISS index interface (``add``, ``search``, ``sa_encode``, ``sa_decode``...) in numpy, for codes of a vector's
    principal axes: a subclass encodes ``(x − mean) · axes`` and decodes codes back to those axes (``_decode_rotated``);
    the float query is scored against the decoded documents, block by block.

    A subclass sets ``file_stem`` and gives ``sa_code_size``, ``sa_encode``, ``_decode_rotated``, ``tensors``,
    ``from_tensors`` and ``clone_empty``.

    With a ``radius`` (:meth:`on_sphere`), every decoded document is scaled onto the sphere of that radius before it is
    scored or returned. For a corpus whose rows all have that norm (a cosine model's unit vectors) this costs no byte:
    the norm of a decoded document is a function of its code. It removes a bias the plain decode has: a conditional-mean
    quantiser shrinks each document towards the centre by an amount that depends on its cells, so two documents
    equally near a query score differently. Dividing by the decoded norm gives each the score of its direction.

    Attributes:
        d: input dimension; mean: ``(d,)`` the corpus centre; axes: ``(d, r)`` the coded principal axes.
        codes: ``(ntotal, code_size)`` the codes added.
        radius: the sphere decoded documents are scaled onto, or 0 (decoded as they are).
    """

    is_trained = True
    file_stem: ClassVar[str]

    def __init__(self, mean: np.ndarray, axes: np.ndarray) -> None:
        self.mean = np.ascontiguousarray(mean, dtype=np.float32)
        self.axes = np.ascontiguousarray(axes, dtype=np.float32)
        self.d = int(self.axes.shape[0])
        self._centre = (self.axes.T @ self.mean).astype(np.float32)  # the centre on the coded axes (the sphere's scale)
        self.codes = np.zeros((0, self.sa_code_size()), dtype=np.uint8)
        self.radius = 0.0

    def on_sphere(self, radius: float) -> "RotatedCodeIndex":
        """Decode onto the sphere of ``radius`` (> 0; 0 turns it off); returns ``self``."""
        radius = float(radius)
        if not np.isfinite(radius) or radius < 0:
            raise ValueError(f"a sphere's radius is a finite number >= 0; got {radius!r}.")
        self.radius = radius
        return self

    def _sphere_scale(self, rotated: np.ndarray) -> np.ndarray:
        """``(n, 1)`` float32: radius / ‖x̂‖ for decoded rows ``rotated`` (``x̂ = axes · ŷ + mean``, ``axes`` orthonormal columns).

        In float32, as the scan scores: a float64 copy of every decoded block took longer than decoding it."""
        y = np.asarray(rotated, dtype=np.float32)
        squared = np.einsum("ij,ij->i", y, y) + 2.0 * (y @ self._centre) + np.float32(self.mean @ self.mean)
        return (np.float32(self.radius) / np.sqrt(np.maximum(squared, np.float32(1e-30))))[:, None]

    @property
    def ntotal(self) -> int:
        return len(self.codes)

    def sa_code_size(self) -> int:
        raise NotImplementedError

    def sa_encode(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _decode_rotated(self, codes: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def tensors(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray]) -> "RotatedCodeIndex":
        raise NotImplementedError

    def clone_empty(self) -> "RotatedCodeIndex":
        raise NotImplementedError

    def sa_decode(self, codes: np.ndarray) -> np.ndarray:
        rotated = self._decode_rotated(codes)
        decoded = rotated @ self.axes.T + self.mean
        if self.radius:
            decoded = decoded * self._sphere_scale(rotated)
        return np.ascontiguousarray(decoded, dtype=np.float32)

    def add(self, x: np.ndarray) -> None:
        self.codes = np.concatenate([self.codes, self.sa_encode(x)])

    def reset(self) -> None:
        self.codes = self.codes[:0]

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(D, I)``: the float queries scored against the dequantised documents, top ``k`` (blocks of rows, bounded memory)."""
        xq = self.checked_queries(xq)
        rotated, offset = xq @ self.axes, xq @ self.mean  # q · x̂ = (Uᵀq) · ŷ + q · μ; the offset ranks nothing
        if self.radius:
            # On the sphere the offset ranks too: q · x̂ s = ((Uᵀq) · ŷ + q · μ) s, so it rides along as one more column.
            def scaled(codes: np.ndarray) -> np.ndarray:
                y = self._decode_rotated(codes)
                scale = self._sphere_scale(y)
                out = np.empty((len(y), y.shape[1] + 1), dtype=np.float32)
                np.multiply(y, scale, out=out[:, :-1])
                out[:, -1] = scale[:, 0]
                return out

            blocks = ((start, np.ascontiguousarray(scaled(self.codes[start : start + _SEARCH_BLOCK]), dtype=np.float32))
                      for start in range(0, self.ntotal, _SEARCH_BLOCK))
            queries = np.ascontiguousarray(np.hstack([rotated, offset[:, None]]), dtype=np.float32)
            best_d, best_i = exact_search_blocks(queries, blocks, int(k))
            return best_d.astype(np.float32), best_i
        blocks = ((start, np.ascontiguousarray(self._decode_rotated(self.codes[start : start + _SEARCH_BLOCK]), dtype=np.float32))
                  for start in range(0, self.ntotal, _SEARCH_BLOCK))
        best_d, best_i = exact_search_blocks(np.ascontiguousarray(rotated, dtype=np.float32), blocks, int(k))
        return (best_d + offset[:, None]).astype(np.float32), best_i

    def checked_queries(self, xq: np.ndarray) -> np.ndarray:
        """``xq`` as float32 ``(n, d)`` rows; refuses another width and NaN or infinite values, which would rank at random."""
        xq = np.asarray(xq, dtype=np.float32)
        if xq.ndim != 2 or xq.shape[1] != self.d:
            raise ValueError(f"the queries to search must be (n, {self.d}) rows, as the index's vectors; got shape {xq.shape}. "
                             "Fix: embed the queries with the model the index was built from.")
        bad = int((~np.isfinite(xq)).any(axis=1).sum())
        if bad:
            raise ValueError(f"{bad} of the {len(xq)} queries hold NaN or infinite values, which rank no document. "
                             "Fix: check the encoder's output for those queries.")
        return xq

    def serialized_bytes(self) -> int:
        """Bytes of the tables and of the codes added (what a file of this index with its codes holds, headers aside)."""
        return int(self.fixed_bytes() + self.codes.nbytes)

    def fixed_bytes(self) -> int:
        raise NotImplementedError

    def write_file(self, path: str | Path, with_codes: bool = False) -> None:
        """One safetensors file (atomically): the tables, the radius, and with ``with_codes`` the codes added. Its metadata
        names the index type, so :func:`read_rotated_index` reads it back as the same class."""
        tensors = dict(self.tensors())
        if self.radius:
            tensors["radius"] = np.array([self.radius], dtype=np.float64)
        if with_codes:
            tensors["codes"] = np.ascontiguousarray(self.codes, dtype=np.uint8)
        metadata = {"format": ROTATED_CODES_FORMAT, "type": self.file_stem, "d": str(self.d), "code_size": str(self.sa_code_size())}
        save_weights(path, tensors, metadata=metadata)

    def write(self, directory: Path) -> list[str]:
        """The trained tables, no codes, as :data:`TABLES_FILE` in ``directory`` (a precision folder records its digest)."""
        empty = self.clone_empty() if self.ntotal else self
        empty.write_file(Path(directory) / TABLES_FILE)
        return [TABLES_FILE]

    def save(self, directory: str | Path) -> Path:
        """:data:`TABLES_FILE` (the tables) and ``codec.json`` (shapes and the tables' sha256), a folder of its own."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.write(directory)
        atomic_write_json(directory / TABLES_JSON, {"type": self.file_stem, "d": self.d, "code_size": self.sa_code_size(),
                                                    "sha256": sha256_file(directory / TABLES_FILE)})
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "RotatedCodeIndex":
        """What :meth:`save` wrote, checked against its sha256 and shapes (and of this class)."""
        directory = Path(directory)
        info = json.loads((directory / TABLES_JSON).read_text(encoding="utf-8"))
        verify_sha256(directory / TABLES_FILE, info["sha256"], "Save the codec again.")
        index = read_rotated_index(directory / TABLES_FILE)
        if not isinstance(index, cls) or index.d != info["d"] or index.sa_code_size() != info["code_size"]:
            raise IntegrityError(f"{directory / TABLES_JSON}: says a {info.get('type')!r} index of {info['d']}-d vectors, "
                                 f"{info['code_size']} bytes; {directory / TABLES_FILE} holds a {index.file_stem!r} index of {index.d}-d, "
                                 f"{index.sa_code_size()} bytes. Save the codec again.")
        return index


#: A precision folder's tables of a :class:`RotatedCodeIndex` (a registered codec served by embedtune's numpy scan).
TABLES_FILE = "codec.safetensors"
#: :meth:`RotatedCodeIndex.save`'s record of the tables' type, shapes and sha256.
TABLES_JSON = "codec.json"
#: The ``format`` of the safetensors metadata :meth:`RotatedCodeIndex.write_file` writes.
ROTATED_CODES_FORMAT = "embedtune-rotated-codes"
_INDEX_TYPES: dict[str, type[RotatedCodeIndex]] = {}


def register_rotated_index(cls: type[RotatedCodeIndex]) -> type[RotatedCodeIndex]:
    """Class decorator: let :func:`read_rotated_index` read files of ``cls`` (by its ``file_stem``)."""
    _INDEX_TYPES[cls.file_stem] = cls
    return cls


def is_rotated_index(index: Any) -> bool:
    """Whether ``index`` is one of these numpy indexes (saved with :meth:`RotatedCodeIndex.write_file`, not by FAISS)."""
    return isinstance(index, RotatedCodeIndex)


def read_rotated_index(path: str | Path) -> RotatedCodeIndex:
    """The index :meth:`RotatedCodeIndex.write_file` wrote to ``path``, with its codes when they were written.

    The caller checks the file's digest first (a precision folder's ``files_sha256``, an index folder's manifest); this
    checks that the file is one of these indexes and that its tensors agree with each other and with its metadata.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    fix = "Write it again with `embedtune compress plan` (a plan's codec) or `embedtune index build --plan` (an index)."
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise IntegrityError(f"{path}: not a readable safetensors file ({error}). {fix}") from None
    tensors = load_weights(path, as_numpy=True)
    kind = metadata.get("type")
    if metadata.get("format") != ROTATED_CODES_FORMAT or kind not in _INDEX_TYPES:
        raise IntegrityError(f"{path}: metadata says format {metadata.get('format')!r}, type {kind!r}; expected format "
                             f"{ROTATED_CODES_FORMAT!r} and one of {sorted(_INDEX_TYPES)}. {fix}")
    codes = tensors.pop("codes", None)
    radius = tensors.pop("radius", None)
    try:
        index = _INDEX_TYPES[kind].from_tensors(tensors)
    except (KeyError, ValueError, IndexError) as error:
        raise IntegrityError(f"{path}: its tables do not make a {kind!r} index ({error}). {fix}") from None
    if str(index.d) != metadata.get("d") or str(index.sa_code_size()) != metadata.get("code_size"):
        raise IntegrityError(f"{path}: metadata says {metadata.get('d')}-d vectors, {metadata.get('code_size')}-byte codes; its tables "
                             f"give {index.d}-d, {index.sa_code_size()} bytes. {fix}")
    if radius is not None:
        if radius.shape != (1,) or not np.isfinite(radius[0]) or radius[0] < 0:
            raise IntegrityError(f"{path}: tensor 'radius' must hold one finite number >= 0; got {radius!r}. {fix}")
        index.on_sphere(float(radius[0]))
    if codes is not None:
        if codes.dtype != np.uint8 or codes.ndim != 2 or codes.shape[1] != index.sa_code_size():
            raise IntegrityError(f"{path}: tensor 'codes' is {codes.dtype} {codes.shape}; expected uint8 (n, {index.sa_code_size()}). {fix}")
        index.codes = codes
    return index


@register_rotated_index
class ScalarTransformIndex(RotatedCodeIndex):
    """The ``klt-sq`` index.

    Attributes:
        bits: ``(r,)`` bits per axis (1 to 8).
        points: ``(r, 256)`` each axis's reconstruction points (the first ``2^bits`` are used).
    """

    file_stem: ClassVar[str] = "klt-sq"

    def __init__(self, mean: np.ndarray, axes: np.ndarray, bits: np.ndarray, points: np.ndarray) -> None:
        self.bits = np.asarray(bits, dtype=np.int64)
        self.points = np.ascontiguousarray(points, dtype=np.float32)
        self._mask = np.arange(8)[None, :] >= (8 - self.bits)[:, None]  # (r, 8): the low `bits` of each axis's byte
        super().__init__(mean, axes)

    def sa_code_size(self) -> int:
        return int((self.bits.sum() + 7) // 8)

    def fixed_bytes(self) -> int:
        """Bytes that do not grow with the corpus: the axes, the centre and the reconstruction points (float32)."""
        return int(4 * (self.axes.size + self.mean.size + int((2 ** self.bits).sum())))

    def tensors(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean, "axes": self.axes, "bits": self.bits, "points": self.points}

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray]) -> "ScalarTransformIndex":
        return cls(tensors["mean"], tensors["axes"], tensors["bits"], tensors["points"])

    def sa_encode(self, x: np.ndarray) -> np.ndarray:
        y = (np.asarray(x, dtype=np.float32) - self.mean) @ self.axes
        cells = np.empty(y.shape, dtype=np.uint8)
        for axis, count in enumerate(self.bits):
            points = self.points[axis, : 2 ** int(count)]
            cells[:, axis] = np.searchsorted((points[1:] + points[:-1]) / 2, y[:, axis])
        unpacked = np.unpackbits(cells[:, :, None], axis=2)  # (n, r, 8)
        return np.packbits(unpacked[:, self._mask], axis=1)

    def _cells(self, codes: np.ndarray) -> np.ndarray:
        total = int(self.bits.sum())
        flat = np.unpackbits(np.asarray(codes, dtype=np.uint8), axis=1)[:, :total]
        unpacked = np.zeros((len(codes), len(self.bits), 8), dtype=np.uint8)
        unpacked[:, self._mask] = flat
        return np.packbits(unpacked, axis=2)[:, :, 0]

    def _decode_rotated(self, codes: np.ndarray) -> np.ndarray:
        cells = self._cells(codes)
        return np.take_along_axis(self.points, cells.T.astype(np.int64), axis=1).T  # (n, r)

    def clone_empty(self) -> "ScalarTransformIndex":
        return ScalarTransformIndex(self.mean, self.axes, self.bits, self.points).on_sphere(self.radius)


@register_codec
class KltSQ(CodecFamily):
    family = "klt-sq"
    summary = "textbook transform coder: KLT, integer reverse water-filling, a Lloyd-Max quantiser per axis (reference)"
    deployable = False

    def check_dim(self, dim: int) -> None:
        if 8 * self.code_bytes > MAX_BITS_PER_AXIS * dim:
            raise ValueError(f"codec {self.name!r}: {8 * self.code_bytes} bits do not fit {dim} axes of at most "
                             f"{MAX_BITS_PER_AXIS} bits; use a budget of at most {dim} bytes.")

    def train(self, x: np.ndarray, seed: int = 0) -> Any:
        sample, eigenvalues, axes = sampled_klt(self, x, seed)
        bits = water_filling_bits(eigenvalues, 8 * self.code_bytes)
        kept = np.nonzero(bits)[0]
        mean = sample.mean(axis=0)
        rotated = (sample - mean) @ axes[:, kept]
        points = np.zeros((len(kept), 2 ** MAX_BITS_PER_AXIS), dtype=np.float32)
        for column, axis in enumerate(kept):
            levels = 2 ** int(bits[axis])
            points[column, :levels] = lloyd_max(rotated[:, column], levels)
        return ScalarTransformIndex(mean, axes[:, kept], bits[kept], points)


@register_codec
class KltSQSphere(KltSQ):
    """``klt-sq-sphere:B``: the textbook coder's codes, each document decoded onto the sphere of the corpus's common norm
    (:meth:`RotatedCodeIndex.on_sphere`). Same codes, same bytes; only the decode and the scores differ."""

    family = "klt-sq-sphere"
    summary = ("the textbook transform coder's codes, decoded onto the unit sphere of a cosine model's vectors "
               "(no extra byte; reference)")
    requires_common_norm = True

    def train(self, x: np.ndarray, seed: int = 0) -> Any:
        radius = common_norm(self.name, x)
        return super().train(x, seed).on_sphere(radius)
