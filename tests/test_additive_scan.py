"""An additive quantiser's codes searched by the product quantiser's scan: the same top-k and scores, in place."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from embedtune.index.codecs import additive_scan
from embedtune.index.codecs.additive_scan import additive_scanner, additive_search


def _residual_quantiser(d: int = 24, m: int = 4, n: int = 600, metric: int = faiss.METRIC_INNER_PRODUCT, seed: int = 0):
    rng = np.random.default_rng(seed)
    xb = rng.standard_normal((n, d)).astype(np.float32)
    index = faiss.IndexResidualQuantizer(d, m, 8, metric, faiss.AdditiveQuantizer.ST_LUT_nonorm)
    index.rq.max_beam_size = 2
    index.train(xb)
    index.add(xb)
    return index, rng.standard_normal((37, d)).astype(np.float32)


def test_the_scan_returns_the_additive_quantisers_own_top_k_and_scores():
    index, xq = _residual_quantiser()
    D, I = additive_search(index, xq, 10)
    D_ref, I_ref = index.search(xq, 10)
    np.testing.assert_allclose(D, D_ref, rtol=1e-5, atol=1e-5)
    assert (I == I_ref).mean() > 0.99  # equal up to the order of float-rounded ties
    assert additive_scanner(index) is not None


def test_behind_a_pre_transform_the_queries_are_transformed_first():
    index, _ = _residual_quantiser(d=16)
    xq = np.random.default_rng(4).standard_normal((37, 24)).astype(np.float32)
    rotation = faiss.RandomRotationMatrix(24, 16)
    rotation.init(3)
    wrapped = faiss.IndexPreTransform(rotation, index)
    D, I = additive_search(wrapped, xq, 5)
    D_ref, I_ref = wrapped.search(xq, 5)
    np.testing.assert_allclose(D, D_ref, rtol=1e-5, atol=1e-5)
    assert (I == I_ref).mean() > 0.99


def test_the_scan_reads_the_codes_in_place_so_rows_added_later_are_found():
    index, xq = _residual_quantiser()
    additive_search(index, xq, 3)  # the product-quantiser view is built and kept
    new_rows = 100 * np.random.default_rng(9).standard_normal((5, 24)).astype(np.float32)
    index.add(new_rows)
    _, I = additive_search(index, new_rows, 1)
    _, I_ref = index.search(new_rows, 1)
    assert np.array_equal(I, I_ref) and (I >= 600).all()


def test_queries_in_several_blocks_give_the_one_block_answer(monkeypatch):
    index, xq = _residual_quantiser()
    whole = additive_search(index, xq, 7)
    monkeypatch.setattr(additive_scan, "REPEATED_QUERY_FLOATS", 4 * 24 * 5)  # five queries a block
    blocked = additive_search(index, xq, 7)
    assert np.array_equal(whole[1], blocked[1])
    np.testing.assert_allclose(whole[0], blocked[0], rtol=1e-6)  # the look-up tables are computed per block: float rounding


@pytest.mark.parametrize("case", ["l2", "flat", "nbits"])
def test_other_indexes_are_searched_by_faiss_itself(case):
    if case == "l2":
        index, xq = _residual_quantiser(metric=faiss.METRIC_L2)
    elif case == "flat":
        index = faiss.IndexFlatIP(24)
        index.add(np.random.default_rng(1).standard_normal((50, 24)).astype(np.float32))
        xq = np.random.default_rng(2).standard_normal((4, 24)).astype(np.float32)
    else:
        xb = np.random.default_rng(3).standard_normal((600, 24)).astype(np.float32)
        index = faiss.IndexResidualQuantizer(24, 2, 6, faiss.METRIC_INNER_PRODUCT, faiss.AdditiveQuantizer.ST_LUT_nonorm)
        index.train(xb)
        index.add(xb)
        xq = xb[:4]
    assert additive_scanner(index) is None
    D, I = additive_search(index, xq, 5)
    D_ref, I_ref = index.search(xq, 5)
    assert np.array_equal(I, I_ref) and np.array_equal(D, D_ref)


def test_k_is_capped_at_the_rows_held():
    index, xq = _residual_quantiser(n=300)
    D, I = additive_search(index, xq[:2], 1000)
    assert I.shape == (2, 300) and sorted(I[0]) == list(range(300))


@pytest.mark.parametrize("factory", ["PRQ2x3x8", "PRQ3x2x8"])
def test_a_product_additive_quantiser_is_scanned_with_its_codebooks_in_their_own_dimensions(factory):
    # PRQ keeps each codebook in its part's d / s dimensions; read as full-dimensional codewords they would score garbage.
    rng = np.random.default_rng(5)
    xb = rng.standard_normal((700, 24)).astype(np.float32)
    xq = rng.standard_normal((29, 24)).astype(np.float32)
    index = faiss.index_factory(24, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(xb)
    index.add(xb)
    assert additive_scanner(index) is not None
    D, I = additive_search(index, xq, 10)
    D_ref, I_ref = index.search(xq, 10)
    np.testing.assert_allclose(D, D_ref, rtol=1e-4, atol=1e-4)
    assert (I == I_ref).mean() > 0.99
    # and the scores are the inner products with the decoded vectors
    decoded = index.sa_decode(index.sa_encode(xb))
    np.testing.assert_allclose(D[:, 0], (xq @ decoded.T).max(axis=1), rtol=1e-4, atol=1e-4)
