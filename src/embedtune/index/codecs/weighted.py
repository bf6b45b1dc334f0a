"""``klt-wpq:B``: KLT-PQ weighted for the score's error, served by FAISS as an additive quantiser in the original space.

A transform coder (``klt-pq:B``) spends its bits where the documents vary most: it minimises the
vectors' squared error. Retrieval pays for the error of the *scores*: an error ``e`` on a document
costs ``E[(q · e)^2] = eᵀ Σ_q e`` over queries with second moment ``Σ_q``. Embedding queries share a
large mean direction, so an error along a direction of small *centred* variance but large
*uncentred* energy costs more than plain KLT thinks. Without a query log, the documents' own
uncentred second moment ``M = XᵀX / n`` stands in for ``Σ_q``, shrunk towards a multiple of the
identity: ``S = α M + (1 − α) tr(M)/d · I`` (:data:`SCORE_WEIGHT`). The documents are coded as
``y = x S^{1/2}`` by ``klt-pq`` (its KLT is then the eigenvectors of ``S^{1/2} Σ_x S^{1/2}``), so the
code's squared error in ``y`` is the weighted score error; queries map to ``z = q S^{-1/2}``, and
``z · y = q · x`` exactly.

Decoding can be written in the original space: sub-quantiser ``j``'s codeword, placed in its
sub-space of the kept axes and mapped back through the KLT and ``S^{-1/2}``, is a full-dimensional
vector, so a decoded document is a *sum* of one codeword per sub-quantiser: an additive quantiser.
The codec is therefore served as a FAISS ``IndexResidualQuantizer`` (inner product, look-up tables)
whose codebooks are those mapped codewords: ``codec.faiss`` searches correctly in any FAISS, and
``q · x̂`` is ``z · ŷ``. The codes, though, are chosen in ``y`` by the weighted encoder
(:data:`ENCODER_FILE`: the ``y``-space transform and product quantiser). FAISS's own ``add()`` on
``codec.faiss`` would run its residual encoder in the original, unweighted metric: valid codes, but
slightly worse ones. embedtune's paths (a plan's sweep, ``index build --plan``,
:class:`~embedtune.index.codecs.DeployedCodec`, ``compress export``) all encode through
:class:`ScoreWeightedIndex`, which adds the weighted codes with ``add_sa_codes``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from embedtune.index.codecs.faiss_scan import faiss_index_search
from embedtune.index.codecs.precision_registry import CODEC_FILE
from embedtune.index.codecs.registry import register_codec
from embedtune.index.codecs.row_encoding import encode_rows, transform_matrix
from embedtune.index.codecs.transform import KltPQ, training_sample
from embedtune.io import atomic_write
from embedtune.runtime import single_threaded

__all__ = ["SCORE_WEIGHT", "ENCODER_FILE", "KltWeightedPQ", "ScoreWeightedIndex", "score_weighting"]

#: α: the weight of the documents' uncentred second moment against the identity in ``S`` (0 is plain ``klt-pq``).
#: Declared once, from the query-weighted benchmark's label-free setting (``benchmarks/query_weighted_coding.py``),
#: never tuned on test queries.
SCORE_WEIGHT = 0.2
#: The weighted encoder (``y``-space transform and product quantiser), saved beside ``codec.faiss``.
ENCODER_FILE = "encoder.faiss"
#: Eigenvalues of ``S`` below this share of the largest are raised to it, so ``S^{-1/2}`` stays finite.
EIGENVALUE_FLOOR = 1e-9


def score_weighting(sample: np.ndarray, alpha: float = SCORE_WEIGHT) -> tuple[np.ndarray, np.ndarray]:
    """``(S^{1/2}, S^{-1/2})`` (float64, symmetric) of ``S = α M + (1 − α) tr(M)/d · I``, ``M`` the rows' uncentred second moment."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"the score weight α must be in [0, 1] (0: plain klt-pq); got {alpha!r}.")
    x = np.asarray(sample, dtype=np.float64)
    with single_threaded():  # the same S on any thread count
        moment = x.T @ x / max(1, len(x))
        d = moment.shape[0]
        s = alpha * moment + (1.0 - alpha) * np.trace(moment) / d * np.eye(d)
        eigenvalues, axes = np.linalg.eigh(s)
    eigenvalues = np.maximum(eigenvalues, EIGENVALUE_FLOOR * max(float(eigenvalues.max()), EIGENVALUE_FLOOR))
    return (axes * np.sqrt(eigenvalues)) @ axes.T, (axes / np.sqrt(eigenvalues)) @ axes.T


class ScoreWeightedIndex:
    """The FAISS index interface over a weighted encoder and the additive quantiser that searches its codes.

    Attributes:
        search_index: a FAISS ``IndexResidualQuantizer`` (inner product) in the original space, whose codebooks are
            the ``y``-space codewords mapped back; it holds the codes and answers every search (``codec.faiss``).
        encoder: a FAISS ``IndexPreTransform`` (``x -> y`` on the kept axes, then the ``IndexPQ``) that chooses the
            codes by the weighted error (:data:`ENCODER_FILE`); its code layout (one byte per sub-quantiser) is the
            additive quantiser's.
    """

    def __init__(self, search_index: Any, encoder: Any) -> None:
        if search_index.d != encoder.d or search_index.sa_code_size() != encoder.sa_code_size():
            raise ValueError(f"the weighted encoder codes {encoder.d}-d vectors in {encoder.sa_code_size()} bytes, but the search index "
                             f"holds {search_index.d}-d vectors in {search_index.sa_code_size()}: they are not one codec's. "
                             "Write the codec again with `embedtune compress plan`.")
        self.search_index, self.encoder = search_index, encoder

    #: Each row's codes depend on that row alone (:mod:`embedtune.index.codecs.row_encoding`): a corpus may be encoded in
    #: blocks side by side.
    encodes_rows_alone = True

    # -- the FAISS index interface --------------------------------------------------------------
    @property
    def d(self) -> int:
        return int(self.search_index.d)

    @property
    def ntotal(self) -> int:
        return int(self.search_index.ntotal)

    @property
    def is_trained(self) -> bool:
        return bool(self.search_index.is_trained and self.encoder.is_trained)

    @property
    def metric_type(self) -> int:
        return int(self.search_index.metric_type)

    def sa_code_size(self) -> int:
        return int(self.search_index.sa_code_size())

    def sa_encode(self, x: np.ndarray) -> np.ndarray:
        """The weighted codes of ``x``'s rows (what :meth:`add` stores), the encoder's map applied in float64
        (:func:`~embedtune.index.codecs.row_encoding.encode_rows`)."""
        return encode_rows(self.encoder, x)

    def sa_decode(self, codes: np.ndarray) -> np.ndarray:
        """The decoded documents in the original space: one mapped codeword per sub-quantiser, summed."""
        return self.search_index.sa_decode(np.ascontiguousarray(codes, dtype=np.uint8))

    def add(self, x: np.ndarray) -> None:
        # Codes chosen by the weighted encoder, not by the search index's own (unweighted) residual encoder.
        self.add_sa_codes(self.sa_encode(x))

    def add_sa_codes(self, codes: np.ndarray) -> None:
        """Append codes made by :meth:`sa_encode`."""
        self.search_index.add_sa_codes(np.ascontiguousarray(codes, dtype=np.uint8))

    def search(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return faiss_index_search(self.search_index, x, k)

    def reset(self) -> None:
        self.search_index.reset()

    # -- copies and files ----------------------------------------------------------------------
    def clone_empty(self) -> "ScoreWeightedIndex":
        """A copy with the same tables and no vectors."""
        import faiss

        search_index = faiss.clone_index(self.search_index)
        search_index.reset()
        return ScoreWeightedIndex(search_index, faiss.clone_index(self.encoder))

    def serialized_bytes(self) -> int:
        """Bytes of both FAISS indexes as written (the codes the search index holds included)."""
        import faiss

        return int(faiss.serialize_index(self.search_index).size + faiss.serialize_index(self.encoder).size)

    def write(self, directory: Path) -> list[str]:
        """Write the empty search index (:data:`CODEC_FILE`) and the encoder (:data:`ENCODER_FILE`), each atomically."""
        import faiss

        empty = self.clone_empty() if self.ntotal else self
        atomic_write(directory / CODEC_FILE, lambda tmp: faiss.write_index(empty.search_index, str(tmp)))
        atomic_write(directory / ENCODER_FILE, lambda tmp: faiss.write_index(empty.encoder, str(tmp)))
        return [CODEC_FILE, ENCODER_FILE]

    @classmethod
    def read(cls, directory: Path) -> "ScoreWeightedIndex":
        import faiss

        missing = [name for name in (CODEC_FILE, ENCODER_FILE) if not (directory / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{directory}: the score-weighted codec needs {' and '.join(missing)} (its search tables and "
                                    "its weighted encoder); write the codec again with `embedtune compress plan`.")
        return cls(faiss.read_index(str(directory / CODEC_FILE)), faiss.read_index(str(directory / ENCODER_FILE)))


@register_codec
class KltWeightedPQ(KltPQ):
    family = "klt-wpq"
    summary = ("KLT-PQ weighted for the score's error (the documents' uncentred second moment stands in for the queries'), "
               "served as a FAISS additive quantiser")
    files: ClassVar[tuple[str, ...]] = (CODEC_FILE, ENCODER_FILE)
    faiss_index: ClassVar[bool] = False
    alpha: ClassVar[float] = SCORE_WEIGHT

    def train(self, x: np.ndarray, seed: int = 0) -> ScoreWeightedIndex:
        return self.fit_weighted(x, seed)[0]

    def fit_weighted(self, x: np.ndarray, seed: int = 0) -> tuple[ScoreWeightedIndex, np.ndarray, np.ndarray, np.ndarray]:
        """The trained, empty index, with what a subclass's encoder may need beside it: the fit sample, ``S^{1/2}`` and
        the kept axes of ``y`` (``(r, d)``, orthonormal rows, and zero rows for padded axes)."""
        import faiss

        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"codec {self.name!r}: expected a (n, d) matrix; got shape {x.shape}.")
        self.check_dim(x.shape[1])
        sample = training_sample(x, seed=seed)
        root, inverse_root = score_weighting(sample, self.alpha)
        weighted = np.ascontiguousarray(sample.astype(np.float64) @ root, dtype=np.float32)
        # The plain coder on y = x S^{1/2}: its KLT, its choice of axes and its codebooks, all in y.
        inner = KltPQ(self.code_bytes).train(weighted, seed=seed)
        # (r, d): y_r = kept · y; rows of padded axes (r > d, every axis kept) are zero.
        kept = transform_matrix(inner)
        pq_index = faiss.downcast_index(inner.index)
        pq = pq_index.pq
        d, r, groups = x.shape[1], int(kept.shape[0]), int(pq.M)
        # The encoder: x -> kept · S^{1/2} x, then the same product quantiser.
        to_kept = faiss.LinearTransform(d, r, False)
        faiss.copy_array_to_vector(np.ascontiguousarray(kept @ root, dtype=np.float32).ravel(), to_kept.A)
        to_kept.is_trained = True
        encoder = faiss.IndexPreTransform(to_kept, faiss.clone_index(pq_index))
        # The search index: codeword c_jk of sub-space j, decoded as y = c_jk · kept_j, x = y · S^{-1/2} (S symmetric).
        centroids = faiss.vector_to_array(pq.centroids).reshape(groups, pq.ksub, pq.dsub).astype(np.float64)
        codebooks = np.concatenate([centroids[j] @ kept[j * pq.dsub : (j + 1) * pq.dsub] @ inverse_root for j in range(groups)])
        search_index = faiss.IndexResidualQuantizer(d, groups, int(pq.nbits), faiss.METRIC_INNER_PRODUCT,
                                                    faiss.AdditiveQuantizer.ST_LUT_nonorm)
        faiss.copy_array_to_vector(np.ascontiguousarray(codebooks, dtype=np.float32).ravel(), search_index.rq.codebooks)
        search_index.rq.is_trained = True
        search_index.is_trained = True
        return ScoreWeightedIndex(search_index, encoder), sample, root, kept

    def read_trained(self, directory: Path) -> ScoreWeightedIndex:
        return ScoreWeightedIndex.read(Path(directory))
