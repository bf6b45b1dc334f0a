"""``klt-apq:B``: ``klt-wpq``'s tables, with each document's codes chosen for the scores of the queries that rank it high.

``klt-wpq`` codes ``y = x S^{1/2}`` (:mod:`embedtune.index.codecs.weighted`) with a product quantiser: each
sub-quantiser's nearest codeword, which minimises ``||y − ŷ||²``, the weighted score error averaged over *all*
queries. A document's rank, though, is decided by the queries that score it high, and those are nearly parallel to
it. Take queries with second moment ``S`` (the same stand-in klt-wpq uses), Gaussian, and condition on a large
score ``q · x``: the expected squared score error of the residual ``r = y − ŷ`` is

    L(r) = ||r||² + (η − 1) (u · r)²,    u = y / ||y||,

ScaNN's anisotropic loss, here in ``y`` (the S-metric's direction of ``x`` is ``y``'s own). ``η`` (:data:`ANISOTROPY`)
is how much more the parallel error costs than an average direction's.

The parallel term couples the sub-quantisers: a codeword in one sub-space moves the parallel residual the others
may cancel. The codes are chosen by iterated conditional modes (:func:`anisotropic_codes`): start from the PQ codes,
then per sub-quantiser take the codeword that minimises ``L`` given the others' (exact: a table over its 256
codewords), for a few sweeps. Each step lowers ``L`` or leaves it, so the codes' loss is never above the PQ codes'.
With ``η = 1`` the loss separates over the (orthogonal) sub-spaces and the PQ codes are already optimal.

``u · r`` counts the whole residual, the left-out axes' part included: ``(||y_⊥||² − y_⊥ · m_⊥) / ||y||``, with
``y_⊥`` the part of ``y`` outside the kept axes and ``m_⊥`` its mean over the fit sample (a mean is a per-query
constant in every score, no ranking change). The codes can partly cancel it along ``y``. The tables this needs
beside klt-wpq's (``x ↦ y_⊥`` as a ``d × d`` matrix, ``m_⊥``, ``η``) are saved as :data:`ANISOTROPY_FILE`.

Only the encoder changes: the codebooks, the served FAISS ``IndexResidualQuantizer`` (``codec.faiss``) and its
search are klt-wpq's, and the codes are added with ``add_sa_codes``. η = 8 is declared once from the label-free
agreement (held-out documents as queries) on SciFact and ArguAna with MiniLM (``benchmarks/score_aware_coding.py``),
never from test queries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from embedtune.index.codecs.precision_registry import CODEC_FILE
from embedtune.index.codecs.registry import register_codec
from embedtune.index.codecs.row_encoding import map_rows, row_product, transform_matrix
from embedtune.index.codecs.sphere import SphereRanked
from embedtune.index.codecs.weighted import ENCODER_FILE, KltWeightedPQ, ScoreWeightedIndex
from embedtune.io import atomic_write

__all__ = ["ANISOTROPY", "ANISOTROPY_FILE", "SWEEPS", "AnisotropicIndex", "KltAnisotropicPQ", "KltAnisotropicPQSphere", "anisotropic_codes", "anisotropic_loss"]

#: η: the cost of the residual along the document against that of an average direction (1: plain klt-wpq codes).
ANISOTROPY = 8.0
#: Sweeps of iterated conditional modes over the sub-quantisers (it stops earlier once no code changes).
SWEEPS = 4
#: ``x ↦ y_⊥``, ``m_⊥`` and ``η``, beside ``codec.faiss`` and ``encoder.faiss``.
ANISOTROPY_FILE = "anisotropy.safetensors"
#: Rows per block of the search over codes, so its tables (rows × sub-quantisers × 256, float64) stay near 64 MB.
BLOCK_ELEMENTS = 8_000_000


def anisotropic_loss(y: np.ndarray, decoded: np.ndarray, u: np.ndarray, parallel_offset: np.ndarray, eta: float) -> np.ndarray:
    """Per row: ``||y − ŷ||² + (η − 1)(u · (y − ŷ) + p₀)²`` (the kept axes' residual, and ``p₀`` the parallel part outside them)."""
    r = np.asarray(y, dtype=np.float64) - np.asarray(decoded, dtype=np.float64)
    parallel = np.einsum("nr,nr->n", np.asarray(u, dtype=np.float64), r) + parallel_offset
    return (r**2).sum(axis=1) + (eta - 1.0) * parallel**2


def anisotropic_codes(y: np.ndarray, centroids: np.ndarray, codes: np.ndarray, u: np.ndarray, parallel_offset: np.ndarray,
                      eta: float, sweeps: int = SWEEPS) -> np.ndarray:
    """Product-quantiser codes that lower :func:`anisotropic_loss`, by iterated conditional modes from ``codes``.

    Args:
        y: ``(n, r)`` the rows on the kept axes.
        centroids: ``(M, K, r / M)`` the sub-quantisers' codewords (sub-space ``j`` is ``y[:, j·r/M : (j+1)·r/M]``).
        codes: ``(n, M)`` the starting codes (the nearest codewords).
        u: ``(n, r)`` the parallel direction on the kept axes.
        parallel_offset: ``(n,)`` the parallel residual outside the kept axes.
        eta: the parallel error's weight; 1 returns ``codes`` unchanged (the loss is then separable).
    """
    codes = np.array(codes, dtype=np.uint8, copy=True)
    if eta == 1.0 or len(codes) == 0:
        return codes
    m, k, dsub = centroids.shape
    cent = np.asarray(centroids, dtype=np.float64)
    cent_sq = (cent**2).sum(axis=2)  # (M, K)
    lam = float(eta) - 1.0
    block = max(1, BLOCK_ELEMENTS // (m * k))
    for lo in range(0, len(codes), block):
        hi = min(len(codes), lo + block)
        yb = np.asarray(y[lo:hi], dtype=np.float64)
        ub = np.asarray(u[lo:hi], dtype=np.float64)
        cb = codes[lo:hi]
        rows = np.arange(hi - lo)
        # Per sub-quantiser: ||y_j − c_jk||² (up to a per-row constant) and u_j · c_jk, over its K codewords.
        dist = np.empty((m, hi - lo, k))
        proj = np.empty((m, hi - lo, k))
        parallel = (ub * yb).sum(axis=1) + np.asarray(parallel_offset[lo:hi], dtype=np.float64)
        for j in range(m):
            sub = slice(j * dsub, (j + 1) * dsub)
            # Products in whole tiles of rows (row_product): a row's codes depend on that row alone.
            dist[j] = cent_sq[j][None, :] - 2.0 * row_product(yb[:, sub], cent[j].T)
            proj[j] = row_product(ub[:, sub], cent[j].T)
            parallel -= proj[j][rows, cb[:, j]]
        for _ in range(sweeps):
            changed = 0
            for j in range(m):
                rest = parallel + proj[j][rows, cb[:, j]]  # the parallel residual without sub-quantiser j's codeword
                best = (dist[j] + lam * (rest[:, None] - proj[j]) ** 2).argmin(axis=1)
                changed += int((best != cb[:, j]).sum())
                cb[:, j] = best
                parallel = rest - proj[j][rows, best]
            if not changed:
                break
        codes[lo:hi] = cb
    return codes


class AnisotropicIndex(ScoreWeightedIndex):
    """:class:`~embedtune.index.codecs.weighted.ScoreWeightedIndex` whose codes minimise the anisotropic loss.

    Attributes:
        to_dropped: ``(d, d)``: ``x ↦ y_⊥`` (``y = x S^{1/2}`` less its kept axes' part, in ``y``'s coordinates).
        dropped_mean: ``(d,)``: the mean of ``y_⊥`` over the fit sample.
        eta: the parallel error's weight (:data:`ANISOTROPY`).
    """

    def __init__(self, search_index: Any, encoder: Any, to_dropped: np.ndarray, dropped_mean: np.ndarray, eta: float) -> None:
        super().__init__(search_index, encoder)
        d = self.d
        to_dropped = np.asarray(to_dropped, dtype=np.float32)
        dropped_mean = np.asarray(dropped_mean, dtype=np.float32).reshape(-1)
        if to_dropped.shape != (d, d) or dropped_mean.shape != (d,) or not np.isfinite(eta) or eta < 1.0:
            raise ValueError(f"the anisotropic encoder's tables do not fit this {d}-d codec (to_dropped {to_dropped.shape}, "
                             f"dropped_mean {dropped_mean.shape}, η {eta!r}: η must be ≥ 1). Write the codec again with "
                             "`embedtune compress plan`.")
        self.to_dropped, self.dropped_mean, self.eta = to_dropped, dropped_mean, float(eta)

    def _tables(self) -> tuple[np.ndarray, np.ndarray]:
        """``(x ↦ y on the kept axes as a (r, d) float64 matrix, the sub-quantisers' codewords (M, K, r / M))``."""
        import faiss

        pq = faiss.downcast_index(self.encoder.index).pq
        centroids = faiss.vector_to_array(pq.centroids).reshape(pq.M, pq.ksub, pq.dsub)
        return transform_matrix(self.encoder), centroids

    def directions(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(y on the kept axes, u on the kept axes, the parallel residual outside them)`` of ``x``'s rows.

        Every product is a float64 one in whole tiles of rows (:func:`~embedtune.index.codecs.row_encoding.row_product`),
        so each row's result depends on that row alone: FAISS's own transform gave rows other last bits in other
        blocks, and the search over near ties then other codes.
        """
        to_kept, _ = self._tables()
        x = np.asarray(x, dtype=np.float32).astype(np.float64)
        y = row_product(x, to_kept.T)
        dropped = row_product(x, self.to_dropped)
        dropped_sq = (dropped**2).sum(axis=1)
        norm = np.sqrt((y**2).sum(axis=1) + dropped_sq)
        safe = np.where(norm > 0, norm, 1.0)
        u = np.where(norm[:, None] > 0, y / safe[:, None], 0.0)  # a zero row: no direction, the plain codes
        offset = np.where(norm > 0, (dropped_sq - (dropped * self.dropped_mean.astype(np.float64)).sum(axis=1)) / safe, 0.0)
        return y, u, offset

    def sa_encode(self, x: np.ndarray) -> np.ndarray:
        """Codes of ``x``'s rows that minimise the anisotropic loss (ICM from the weighted PQ codes), each row's depending
        on that row alone, :func:`~embedtune.index.codecs.row_encoding.map_rows` rows at a time (their float64 directions
        stay near 64 MB)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        codes = super().sa_encode(x)
        if self.eta == 1.0 or len(x) == 0:
            return codes
        _, centroids = self._tables()
        step = map_rows(x.shape[1])
        for lo in range(0, len(x), step):
            hi = min(len(x), lo + step)
            y, u, offset = self.directions(x[lo:hi])
            codes[lo:hi] = anisotropic_codes(y, centroids, codes[lo:hi], u, offset, self.eta)
        return codes

    def clone_empty(self) -> "AnisotropicIndex":
        empty = super().clone_empty()
        return AnisotropicIndex(empty.search_index, empty.encoder, self.to_dropped, self.dropped_mean, self.eta)

    def serialized_bytes(self) -> int:
        return super().serialized_bytes() + int(self.to_dropped.nbytes + self.dropped_mean.nbytes + 4)

    def write(self, directory: Path) -> list[str]:
        """klt-wpq's two files, and :data:`ANISOTROPY_FILE` (``to_dropped``, ``dropped_mean``, ``eta``), each atomically."""
        from safetensors.numpy import save_file

        written = super().write(directory)
        tensors = {"to_dropped": np.ascontiguousarray(self.to_dropped), "dropped_mean": np.ascontiguousarray(self.dropped_mean),
                   "eta": np.array([self.eta], dtype=np.float32)}
        atomic_write(directory / ANISOTROPY_FILE, lambda tmp: save_file(tensors, str(tmp)))
        return [*written, ANISOTROPY_FILE]

    @classmethod
    def read(cls, directory: Path) -> "AnisotropicIndex":
        from safetensors.numpy import load_file

        weighted = ScoreWeightedIndex.read(directory)
        if not (directory / ANISOTROPY_FILE).is_file():
            raise FileNotFoundError(f"{directory}: the anisotropic codec needs {ANISOTROPY_FILE} (its encoder's directions) beside "
                                    f"{CODEC_FILE} and {ENCODER_FILE}; write the codec again with `embedtune compress plan`.")
        tensors = load_file(str(directory / ANISOTROPY_FILE))
        return cls(weighted.search_index, weighted.encoder, tensors["to_dropped"], tensors["dropped_mean"], float(tensors["eta"][0]))


@register_codec
class KltAnisotropicPQ(KltWeightedPQ):
    family = "klt-apq"
    summary = ("klt-wpq's tables and served index, with each document's codes chosen for the score error of the queries "
               "that rank it high (anisotropic loss, iterated conditional modes)")
    files: ClassVar[tuple[str, ...]] = (CODEC_FILE, ENCODER_FILE, ANISOTROPY_FILE)
    eta: ClassVar[float] = ANISOTROPY

    def train(self, x: np.ndarray, seed: int = 0) -> AnisotropicIndex:
        weighted, sample, root, kept = self.fit_weighted(x, seed)
        d = root.shape[0]
        to_dropped = root @ (np.eye(d) - kept.T @ kept)  # x ↦ y_⊥ = x S^{1/2} (I − keptᵀ kept)
        dropped_mean = (sample.astype(np.float64) @ to_dropped).mean(axis=0)
        return AnisotropicIndex(weighted.search_index, weighted.encoder, to_dropped, dropped_mean, self.eta)

    def read_trained(self, directory: Path) -> AnisotropicIndex:
        return AnisotropicIndex.read(Path(directory))


@register_codec
class KltAnisotropicPQSphere(SphereRanked, KltAnisotropicPQ):
    """``klt-apq-sphere:B``: ``klt-apq``'s codes, each query's top candidates then ranked by the direction of their decoded
    vectors (:mod:`embedtune.index.codecs.sphere`): same bytes, for a cosine model's unit vectors."""

    family = "klt-apq-sphere"
    summary = ("klt-apq's codes, the top candidates ranked by their decoded direction "
               "(a cosine model's unit vectors; no extra byte)")
