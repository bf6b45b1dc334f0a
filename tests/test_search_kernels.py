"""Exact search kernels: each against brute force, kernel-independent results, ties, blocks, tuning."""

import numpy as np
import pytest

from embedtune.evaluate import kernels
from embedtune.evaluate.search import TIE_MARGIN, exact_search, exact_search_blocks, merge_topk, rescore


def brute_force(xq, xb, k):
    scores = xq.astype(np.float64) @ xb.astype(np.float64).T
    I = np.lexsort((np.broadcast_to(np.arange(len(xb)), scores.shape), -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, I, 1).astype(np.float32), I


@pytest.fixture
def data(rng):
    xb = rng.normal(size=(3000, 48)).astype(np.float32)
    xq = rng.normal(size=(40, 48)).astype(np.float32)
    return xq, xb


@pytest.mark.parametrize("name", list(kernels.KERNELS))
def test_every_kernel_matches_brute_force(name, data):
    xq, xb = data
    D, I = kernels.KERNELS[name](xq, xb, 15)
    D_ref, I_ref = brute_force(xq, xb, 15)
    assert D.shape == I.shape == (40, 15) and I.dtype == np.int64
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_allclose(D, D_ref, rtol=1e-5, atol=1e-5)
    assert (np.diff(D, axis=1) <= 0).all()


@pytest.mark.parametrize("name", list(kernels.KERNELS))
def test_every_kernel_single_query_and_small_corpus(name, rng):
    xb = rng.normal(size=(7, 5)).astype(np.float32)
    xq = rng.normal(size=(1, 5)).astype(np.float32)
    D, I = kernels.KERNELS[name](xq, xb, 7)
    np.testing.assert_array_equal(I, brute_force(xq, xb, 7)[1])


@pytest.mark.parametrize("name", list(kernels.KERNELS))
def test_exact_search_is_identical_whatever_the_kernel(name, data):
    xq, xb = data
    D_ref, I_ref = exact_search(xq, xb, k=20, kernel="numpy")
    D, I = exact_search(xq, xb, k=20, kernel=name)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_array_equal(D, D_ref)  # canonical rescoring: bitwise equal
    np.testing.assert_array_equal(I, brute_force(xq, xb, 20)[1])


def test_many_duplicates_at_the_cut_keep_the_lowest_rows(rng):
    # 30 copies of one vector, more than k + TIE_MARGIN: the kernels' top-k picks among them freely.
    base = rng.normal(size=(200, 16)).astype(np.float32) * 0.1
    dup = np.ones(16, np.float32)
    rows = rng.choice(200, size=30, replace=False)
    base[rows] = dup
    xq = dup[None, :]
    assert 30 > 5 + TIE_MARGIN
    for name in kernels.KERNELS:
        _, I = exact_search(xq, base, k=5, kernel=name)
        assert I[0].tolist() == sorted(rows.tolist())[:5], name


def test_rescore_is_float64_accurate(data):
    xq, xb = data
    I = np.tile(np.arange(10), (len(xq), 1))
    expected = (xq.astype(np.float64) @ xb[:10].astype(np.float64).T).astype(np.float32)
    np.testing.assert_array_equal(rescore(xq, xb, I), expected)


def test_blocks_equal_one_search(data):
    xq, xb = data
    blocks = ((start, xb[start : start + 700].astype(np.float16).astype(np.float32)) for start in range(0, len(xb), 700))
    xb16 = xb.astype(np.float16).astype(np.float32)
    D, I = exact_search_blocks(xq, blocks, k=12)
    D_ref, I_ref = exact_search(xq, xb16, k=12)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_array_equal(D, D_ref)


def test_merge_topk_breaks_ties_by_row():
    D1, I1 = np.array([[1.0, 0.5]], np.float32), np.array([[7, 8]])
    D2, I2 = np.array([[1.0, 0.9]], np.float32), np.array([[3, 4]])
    D, I = merge_topk([(D1, I1), (D2, I2)], 3)
    assert I.tolist() == [[3, 7, 4]] and D.tolist() == [[1.0, 1.0, np.float32(0.9)]]


def test_memmap_corpus(tmp_path, data):
    xq, xb = data
    np.save(tmp_path / "xb.npy", xb)
    mapped = np.load(tmp_path / "xb.npy", mmap_mode="r")
    np.testing.assert_array_equal(exact_search(xq, mapped, 5, kernel="torch-16m")[1], brute_force(xq, xb, 5)[1])


def test_select_kernel_measures_and_caches(rng, monkeypatch, caplog):
    monkeypatch.setattr(kernels, "_TUNE_MIN_WORK", 0)
    monkeypatch.setattr(kernels, "_TUNE_ROWS", 2000)
    kernels.clear_kernel_cache()
    xb = rng.normal(size=(2000, 32)).astype(np.float32)
    xq = rng.normal(size=(64, 32)).astype(np.float32)
    with caplog.at_level("DEBUG", logger="embedtune.evaluate.kernels"):
        name = kernels.select_kernel(xq, xb, 10)
    assert name in kernels.KERNELS
    choices = kernels.kernel_choices()
    assert len(choices) == 1 and choices[0]["kernel"] == name
    assert set(choices[0]["seconds"]) == set(kernels.TUNED_KERNELS) and all(s > 0 for s in choices[0]["seconds"].values())
    assert "search kernel for" in caplog.text
    assert kernels.select_kernel(xq[:50], xb[:1900], 9) == name  # same shape class: cached, no new timing
    assert len(kernels.kernel_choices()) == 1
    assert kernels.select_kernel(xq, xb, 10, candidates=("numpy",)) == "numpy"
    kernels.clear_kernel_cache()


def test_small_problems_skip_tuning(rng):
    kernels.clear_kernel_cache()
    xb = rng.normal(size=(100, 8)).astype(np.float32)
    assert kernels.select_kernel(xb[:3], xb, 5) == kernels.DEFAULT_KERNEL
    assert kernels.kernel_choices() == []


def test_kernel_pinning_and_errors(data, monkeypatch):
    xq, xb = data
    monkeypatch.setenv("EMBEDTUNE_SEARCH_KERNEL", "faiss")
    np.testing.assert_array_equal(exact_search(xq, xb, 5)[1], brute_force(xq, xb, 5)[1])
    monkeypatch.setenv("EMBEDTUNE_SEARCH_KERNEL", "nope")
    with pytest.raises(ValueError, match="unknown search kernel 'nope'"):
        exact_search(xq, xb, 5)
    with pytest.raises(ValueError, match="unknown search kernel"):
        kernels.select_kernel(xq, xb, 5, candidates=("bogus", "numpy"))


def test_single_threaded_restores_settings(data):
    before = kernels.search_threads()
    kernels.KERNELS["torch-1t"](*data, 3)
    kernels.KERNELS["faiss-1t"](*data, 3)
    assert kernels.search_threads() == before


def test_faiss_block_setting_is_restored(data):
    import faiss

    before = faiss.cvar.distance_compute_blas_database_bs
    kernels.KERNELS["faiss-bs64k"](*data, 3)
    assert faiss.cvar.distance_compute_blas_database_bs == before


@pytest.mark.parametrize("k", [1, 10, 100])
def test_pruned_kernel_across_many_blocks(rng, k):
    xb = rng.normal(size=(5000, 24)).astype(np.float32)
    xq = rng.normal(size=(30, 24)).astype(np.float32)
    D, I = kernels.torch_pruned_topk(xq, xb, k, score_bytes=1, group=64)  # 1024-row blocks, 16 groups each
    D_ref, I_ref = brute_force(xq, xb, k)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_allclose(D, D_ref, rtol=1e-5, atol=1e-5)


def test_pruned_kernel_when_every_block_improves(rng):
    # Rows sorted by ascending score for the query: every group of every block is "hot".
    xq = rng.normal(size=(1, 8)).astype(np.float32)
    xb = rng.normal(size=(4096, 8)).astype(np.float32)
    xb = xb[np.argsort(xb @ xq[0])]
    xq = np.vstack([xq, -xq])  # and a second query for which nothing after block one matters
    D, I = kernels.torch_pruned_topk(xq, xb, 20, score_bytes=1, group=128)
    np.testing.assert_array_equal(I, brute_force(xq, xb, 20)[1])
