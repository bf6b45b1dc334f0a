"""Quantised search (SQ8, s-t int8, binary Hamming, rescoring) against brute-force references."""

import numpy as np
import pytest

from embedtune.index import codecs


def topk_ref(scores: np.ndarray, k: int):
    """Descending score, ties by ascending row (float64 scores)."""
    rows = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
    I = np.lexsort((rows, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, I, 1), I


@pytest.fixture
def data(rng):
    xb = rng.normal(size=(1500, 64)).astype(np.float32)
    xq = rng.normal(size=(25, 64)).astype(np.float32)
    return xq, xb


def test_sq8_search_matches_decoded_brute_force(data):
    xq, xb = data
    index = codecs.sq8_index(64, xb=xb)
    index.add(xb)
    decoded = index.sa_decode(index.sa_encode(xb))
    D_ref, I_ref = topk_ref(xq.astype(np.float64) @ decoded.astype(np.float64).T, 10)
    D, I = codecs.sq8_search(index, xq, 10)
    np.testing.assert_allclose(D, D_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(I, I_ref)
    assert index.sa_code_size() == codecs.bytes_per_vector("sq8", 64) == 64


def test_sq8_streaming_ranges_equal_faiss_training(data):
    xq, xb = data
    trained = codecs.sq8_index(64, xb=xb)
    blocks = ((s, xb[s : s + 100]) for s in range(0, len(xb), 100))
    streamed = codecs.sq8_index(64, ranges=codecs.Calibration.fit_blocks(blocks))
    import faiss

    np.testing.assert_array_equal(faiss.vector_to_array(trained.sq.trained), faiss.vector_to_array(streamed.sq.trained))
    np.testing.assert_array_equal(trained.sa_encode(xq), streamed.sa_encode(xq))


def test_int8_search_matches_integer_brute_force(data):
    from sentence_transformers.util.quantization import quantize_embeddings

    xq, xb = data
    ranges = codecs.int8_ranges(xb)
    codes_b = codecs.int8_quantize(xb, ranges)
    np.testing.assert_array_equal(codes_b, quantize_embeddings(xb, "int8", calibration_embeddings=xb))
    codes_q = codecs.int8_quantize(xq, ranges)
    D, I = codecs.int8_search(codes_q, codes_b, 10)
    exact = codes_q.astype(np.int64) @ codes_b.astype(np.int64).T
    D_ref, I_ref = topk_ref(exact.astype(np.float64), 10)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_array_equal(D, D_ref.astype(np.float32))


def hamming_ref(codes_q, codes_b):
    xor = codes_q[:, None, :] ^ codes_b[None, :, :]
    return np.unpackbits(xor, axis=2).sum(axis=2)


@pytest.mark.parametrize("d", [64, 61])
def test_hamming_search_matches_popcount_brute_force_with_ties(rng, d):
    xb = rng.normal(size=(800, d)).astype(np.float32)
    xq = rng.normal(size=(15, d)).astype(np.float32)
    codes_b, codes_q = codecs.binary_codes(xb), codecs.binary_codes(xq)
    assert codes_b.shape == (800, (d + 7) // 8) and codes_b.dtype == np.uint8
    index = codecs.binary_index(codes_b)
    D, I = codecs.hamming_search(index, codes_q, 25)
    D_ref, I_ref = topk_ref(-hamming_ref(codes_q, codes_b).astype(np.float64), 25)
    np.testing.assert_array_equal(D, D_ref.astype(np.float32))
    np.testing.assert_array_equal(I, I_ref)  # many equal distances: ties are by ascending row


def test_binary_rescoring_against_brute_force(data):
    xq, xb = data
    index = codecs.binary_index(codecs.binary_codes(xb))
    _, candidates = topk_ref(-hamming_ref(codecs.binary_codes(xq), codecs.binary_codes(xb)).astype(np.float64), 100)
    float_scores = xq.astype(np.float64) @ xb.astype(np.float64).T
    signs = np.where(xb > 0, 1.0, -1.0)
    asym_scores = xq.astype(np.float64) @ signs.T
    for mode, scores in (("float", float_scores), ("asym", asym_scores)):
        D, I = codecs.binary_search(index, xq, 10, mode, xb, candidates=100)
        for row in range(len(xq)):
            cand = candidates[row]
            order = np.lexsort((cand, -scores[row, cand]))[:10]
            np.testing.assert_array_equal(I[row], cand[order], err_msg=mode)
            np.testing.assert_allclose(D[row], scores[row, cand[order]], rtol=1e-5, atol=1e-5)


def test_float_rescoring_recovers_exact_top1_mostly(data):
    xq, xb = data
    index = codecs.binary_index(codecs.binary_codes(xb))
    _, I = codecs.binary_search(index, xq, 1, "float", xb, candidates=200)
    exact = np.argmax(xq @ xb.T, axis=1)
    assert (I[:, 0] == exact).mean() >= 0.8


def test_binary_search_errors(data):
    xq, xb = data
    index = codecs.binary_index(codecs.binary_codes(xb))
    with pytest.raises(ValueError, match="needs xb"):
        codecs.binary_search(index, xq, 5, "float")
    with pytest.raises(ValueError, match="rescore_with"):
        codecs.binary_search(index, xq, 5, "bogus")
    with pytest.raises(ValueError, match="unknown kind"):
        codecs.bytes_per_vector("pq", 8)
