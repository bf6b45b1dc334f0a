"""One search entry for FAISS-backed precisions: a scalar quantiser's batch is scored by BLAS over decoded blocks, with the
top-k FAISS's own scan gives (scores equal up to float rounding), and a few queries still go through FAISS."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from embedtune.index.codecs import Precision, QuantizedIndex, faiss_scan
from embedtune.index.codecs.faiss_scan import BLAS_MIN_QUERIES, faiss_index_search, scalar_quantizer_codes

D = 48


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    xb = rng.standard_normal((3000, D)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq = (xb[:80] + 0.1 * rng.standard_normal((80, D))).astype(np.float32)
    return xb, xq


@pytest.mark.parametrize("qtype", [faiss.ScalarQuantizer.QT_8bit, faiss.ScalarQuantizer.QT_fp16, faiss.ScalarQuantizer.QT_4bit])
@pytest.mark.parametrize("block", [faiss_scan.DECODE_BLOCK_ROWS, 700])
def test_a_scalar_quantiser_batch_finds_what_faiss_finds(data, qtype, block, monkeypatch):
    xb, xq = data
    monkeypatch.setattr(faiss_scan, "DECODE_BLOCK_ROWS", block)  # 700: five blocks merged, the last one short
    index = faiss.IndexScalarQuantizer(D, qtype, faiss.METRIC_INNER_PRODUCT)
    index.train(xb)
    index.add(xb)
    codes = scalar_quantizer_codes(index)
    assert codes.shape == (len(xb), index.code_size) and codes.base is not None  # a view of FAISS's codes, not a copy
    want_d, want_i = index.search(xq, 20)
    got_d, got_i = faiss_index_search(index, xq, 20)
    assert len(xq) >= BLAS_MIN_QUERIES
    np.testing.assert_allclose(got_d, want_d, atol=1e-5)
    assert (got_i == want_i).mean() > 0.99  # only an exact tie may order differently: embedtune's ties go by row
    assert np.all(np.diff(got_d, axis=1) <= 0)


def test_a_few_queries_and_other_indexes_are_searched_by_faiss_itself(data, monkeypatch):
    xb, xq = data
    index = faiss.IndexScalarQuantizer(D, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    index.train(xb)
    index.add(xb)
    decoded: list[int] = []
    real = index.sa_decode
    monkeypatch.setattr(index, "sa_decode", lambda codes: decoded.append(len(codes)) or real(codes))
    few = xq[: BLAS_MIN_QUERIES - 1]
    np.testing.assert_array_equal(faiss_index_search(index, few, 10)[1], index.search(few, 10)[1])
    assert decoded == []
    faiss_index_search(index, xq, 10)
    assert sum(decoded) == len(xb)
    l2 = faiss.IndexScalarQuantizer(D, faiss.ScalarQuantizer.QT_8bit)  # another metric: FAISS's own search
    l2.train(xb)
    l2.add(xb)
    assert scalar_quantizer_codes(l2) is None
    np.testing.assert_array_equal(faiss_index_search(l2, xq, 10)[1], l2.search(xq, 10)[1])


def test_the_int8_and_float16_precisions_serve_the_same_top_k_through_it(data):
    xb, xq = data
    for name in ("int8", "float16", "int4"):
        index = QuantizedIndex.build(xb, Precision(name))
        scores, ids = index.search(xq, 10)
        truth_d, truth_i = index.backend.search(xq, 10)
        assert (ids == truth_i).mean() > 0.99, name
        np.testing.assert_allclose(scores, truth_d, atol=1e-5)
