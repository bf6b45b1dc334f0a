"""klt-apq: klt-wpq's tables and served index, with codes chosen by the anisotropic loss (iterated conditional modes).

The registry's contract (build, bytes, save, load, search, tampering) is checked for every registered codec in
``tests/test_codec_registry.py``; here: what is particular to the anisotropic encoder. Its codes lower the loss
they are chosen by, below the plain codes'; with η = 1 they are the plain codes; its search is the ``y``-space
computation ``z · ŷ`` of those codes; ``codec.faiss`` alone searches them in plain FAISS. That a plan which chooses
it serves exactly what it scored is checked with ``klt-wpq``'s, in ``tests/test_weighted_codec.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_weighted_codec import _shared_mean_corpus

from embedtune.evaluate.search import break_ties
from embedtune.index.codecs import CODEC_FILE, DeployedCodec, QuantizedIndex
from embedtune.index.codecs.anisotropic import (
    ANISOTROPY,
    ANISOTROPY_FILE,
    AnisotropicIndex,
    KltAnisotropicPQ,
    anisotropic_codes,
    anisotropic_loss,
)
from embedtune.index.codecs.weighted import ENCODER_FILE, SCORE_WEIGHT, score_weighting
from embedtune.io import IntegrityError

D = 32


def _pq_tables(backend: AnisotropicIndex) -> tuple[np.ndarray, np.ndarray]:
    """The kept axes of ``y`` (``(r, d)``, from the encoder's transform and ``S^{-1/2}``) and the PQ codewords."""
    import faiss

    to_kept = faiss.downcast_VectorTransform(backend.encoder.chain.at(0))
    matrix = faiss.vector_to_array(to_kept.A).reshape(to_kept.d_out, to_kept.d_in).astype(np.float64)
    pq = faiss.downcast_index(backend.encoder.index).pq
    return matrix, faiss.vector_to_array(pq.centroids).reshape(pq.M, pq.ksub, pq.dsub)


def _decode_y(centroids: np.ndarray, codes: np.ndarray) -> np.ndarray:
    return np.concatenate([centroids[j][codes[:, j]] for j in range(centroids.shape[0])], axis=1).astype(np.float64)


def test_the_codes_lower_the_anisotropic_loss_below_the_plain_codes():
    docs, _ = _shared_mean_corpus(3000)
    backend = KltAnisotropicPQ(8).train(docs)
    assert isinstance(backend, AnisotropicIndex) and backend.eta == ANISOTROPY
    plain = backend.encoder.sa_encode(docs)  # klt-wpq's codes: the nearest codeword per sub-quantiser
    codes = backend.sa_encode(docs)
    assert codes.shape == plain.shape == (3000, 8) and codes.dtype == np.uint8
    y, u, offset = backend.directions(docs)
    _, centroids = _pq_tables(backend)
    before = anisotropic_loss(y, _decode_y(centroids, plain), u, offset, ANISOTROPY)
    after = anisotropic_loss(y, _decode_y(centroids, codes), u, offset, ANISOTROPY)
    assert (after <= before + 1e-9).all()  # every step of the search lowers a row's loss or keeps it
    assert after.mean() < 0.95 * before.mean()
    # ... at the price of a little more plain squared error: the other side of the trade.
    assert ((y - _decode_y(centroids, codes)) ** 2).sum(1).mean() > ((y - _decode_y(centroids, plain)) ** 2).sum(1).mean()
    # No single sub-quantiser's change lowers a row's loss further: a fixed point of the search (run to convergence).
    converged = anisotropic_codes(y, centroids, plain, u, offset, ANISOTROPY, sweeps=50)
    base = anisotropic_loss(y, _decode_y(centroids, converged), u, offset, ANISOTROPY)
    rows = np.arange(200)
    for j in range(centroids.shape[0]):
        for k in range(0, centroids.shape[1], 17):
            other = converged[rows].copy()
            other[:, j] = k
            assert (anisotropic_loss(y[rows], _decode_y(centroids, other), u[rows], offset[rows], ANISOTROPY) >= base[rows] - 1e-9).all()


def test_with_no_anisotropy_the_codes_are_the_plain_codes():
    docs, _ = _shared_mean_corpus(2000)
    backend = KltAnisotropicPQ(8).train(docs)
    plain = backend.encoder.sa_encode(docs)
    y, u, offset = backend.directions(docs)
    _, centroids = _pq_tables(backend)
    assert np.array_equal(anisotropic_codes(y, centroids, plain, u, offset, 1.0), plain)
    # η = 1 makes the loss separable over orthogonal sub-spaces: ICM from the nearest codewords moves nothing.
    assert np.array_equal(anisotropic_codes(y, centroids, plain, u, offset, 1.0 + 1e-12, sweeps=3), plain)
    flat = AnisotropicIndex(backend.search_index, backend.encoder, backend.to_dropped, backend.dropped_mean, 1.0)
    assert np.array_equal(flat.sa_encode(docs), plain)


def test_the_parallel_direction_and_offset_are_those_of_y():
    docs, _ = _shared_mean_corpus(2000)
    backend = KltAnisotropicPQ(8).train(docs)
    root, inverse_root = score_weighting(docs, SCORE_WEIGHT)
    kept_in_y, _ = _pq_tables(backend)
    kept = kept_in_y @ inverse_root  # orthonormal rows: the kept axes of y
    y_full = docs.astype(np.float64) @ root
    y, u, offset = backend.directions(docs)
    assert np.allclose(y, y_full @ kept.T, atol=1e-4)
    norm = np.linalg.norm(y_full, axis=1)
    assert np.allclose(u, (y_full @ kept.T) / norm[:, None], atol=1e-5)
    dropped = y_full - (y_full @ kept.T) @ kept
    expected = ((dropped**2).sum(1) - dropped @ backend.dropped_mean.astype(np.float64)) / norm
    assert np.allclose(offset, expected, atol=1e-5)
    # A zero row has no direction: its codes are the plain ones, and nothing is NaN.
    zero = np.zeros((1, D), dtype=np.float32)
    assert np.array_equal(backend.sa_encode(zero), backend.encoder.sa_encode(zero))


def test_search_is_the_y_space_inner_product_of_the_anisotropic_codes():
    docs, queries = _shared_mean_corpus(3000)
    index = QuantizedIndex.build(docs, "klt-apq:8")
    backend = index.backend
    assert isinstance(backend, AnisotropicIndex) and backend.sa_code_size() == 8 and index.ram_bytes() == 8
    scores, rows = index.search(queries, 20)
    root, inverse_root = score_weighting(docs, SCORE_WEIGHT)
    kept_in_y, centroids = _pq_tables(backend)
    kept = kept_in_y @ inverse_root
    y_decoded = _decode_y(centroids, backend.sa_encode(docs))
    z = queries.astype(np.float64) @ inverse_root @ kept.T
    expected = z @ y_decoded.T
    assert np.allclose(scores, np.take_along_axis(expected, rows.astype(np.int64), axis=1), rtol=1e-4, atol=1e-4)
    assert np.allclose(queries @ index.reconstruct(docs).T, expected, rtol=1e-4, atol=1e-4)


def test_codec_faiss_alone_searches_the_anisotropic_codes_in_plain_faiss(tmp_path):
    import faiss

    docs, queries = _shared_mean_corpus(3000)
    index = QuantizedIndex.build(docs, "klt-apq:8")
    index.save_precision(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"precision.json", CODEC_FILE, ENCODER_FILE, ANISOTROPY_FILE}
    codec = DeployedCodec.load(tmp_path)
    assert np.array_equal(codec.encode(docs), index.backend.sa_encode(docs))
    plain = faiss.read_index(str(tmp_path / CODEC_FILE))
    assert isinstance(plain, faiss.IndexResidualQuantizer) and plain.metric_type == faiss.METRIC_INNER_PRODUCT
    plain.add_sa_codes(codec.encode(docs))
    scores, rows = index.search(queries, 10)
    # FAISS orders equal scores as its heap leaves them; embedtune by ascending row (break_ties), on every kernel.
    faiss_scores, faiss_rows = break_ties(*plain.search(queries, 10))
    assert np.allclose(faiss_scores, scores, rtol=1e-5, atol=1e-5)
    assert np.array_equal(faiss_rows, rows)


def test_a_missing_or_foreign_anisotropy_file_is_refused(tmp_path):
    docs, _ = _shared_mean_corpus(3000)
    QuantizedIndex.build(docs, "klt-apq:8").save_precision(tmp_path / "a")
    other, _ = _shared_mean_corpus(3000, seed=1)  # another corpus: another weighting, other directions
    QuantizedIndex.build(other, "klt-apq:8").save_precision(tmp_path / "b")
    (tmp_path / "a" / ANISOTROPY_FILE).write_bytes((tmp_path / "b" / ANISOTROPY_FILE).read_bytes())
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        DeployedCodec.load(tmp_path / "a")
    (tmp_path / "b" / ANISOTROPY_FILE).unlink()
    with pytest.raises((IntegrityError, FileNotFoundError), match=ANISOTROPY_FILE):
        DeployedCodec.load(tmp_path / "b")
