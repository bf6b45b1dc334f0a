"""Precision as a saved setting: bytes per vector, int8 calibration round trip, and every search path."""

from __future__ import annotations

import numpy as np
import pytest

from embedtune.index.codecs import (
    PRECISIONS,
    Calibration,
    Precision,
    QuantizedIndex,
    binary_codes,
    factory_code_bytes,
    load_precision,
    sign_vectors,
)
from embedtune.evaluate.search import exact_search


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture()
def vectors():
    rng = np.random.default_rng(0)
    return _unit(rng, 600, 64), _unit(rng, 20, 64)


def test_bytes_per_vector():
    d = 128
    assert {p: Precision(p).ram_bytes(d) for p in PRECISIONS} == {
        "float32": 512, "float16": 256, "int8": 128, "binary": 16, "binary-asym": 16, "binary-rescore": 16,
        "int4": 64, "rabitq1": 16 + 8, "rabitq1-rescore": 16 + 8, "rabitq4": 16 + 48 + 8 + 12, "turboquant1": 16, "turboquant4": 64}
    assert Precision("binary-rescore").disk_bytes(d) == 16 + 512
    assert Precision("binary-asym").disk_bytes(d) == 16
    assert Precision("binary").ram_bytes(100) == 13  # ceil(100 / 8)
    assert Precision("faiss:OPQ16,PQ16").ram_bytes(384) == 16
    assert Precision("faiss:PQ32x4fs").ram_bytes(384) == 16
    assert Precision("faiss:IVF64,PQ32x4fs").ram_bytes(384) == 16 + 8  # the list ids
    assert factory_code_bytes("SQ8", 96) == 96 and factory_code_bytes("SQfp16", 96) == 192


@pytest.mark.parametrize("factory", ["PQ16", "OPQ16,PQ16", "PQ32x4fs", "SQ8", "PQ8x10"])
def test_factory_code_bytes_match_faiss(factory):
    faiss = pytest.importorskip("faiss")
    index = faiss.index_factory(64, factory, faiss.METRIC_INNER_PRODUCT)
    assert factory_code_bytes(factory, 64) == index.sa_code_size()


def test_unknown_precision_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown precision 'int2'"):
        Precision("int2")
    with pytest.raises(ValueError, match="code size"):
        Precision("faiss:HNSW32")
    with pytest.raises(ValueError, match="candidates"):
        Precision("binary-asym", candidates=0)


def test_calibration_round_trip_and_matches_faiss_sq8(tmp_path, vectors):
    xb, xq = vectors
    calibration = Calibration.fit(xb)
    assert np.array_equal(calibration.vmin, xb.min(axis=0)) and np.array_equal(calibration.vmax, xb.max(axis=0))
    calibration.save(tmp_path / "c.safetensors")
    loaded = Calibration.load(tmp_path / "c.safetensors")
    assert np.array_equal(loaded.vmin, calibration.vmin) and np.array_equal(loaded.vmax, calibration.vmax)
    # The FAISS SQ8 index built from the saved ranges scores exactly as our decode of the codes.
    index = QuantizedIndex.build(xb, "int8", calibration=loaded)
    decoded = loaded.decode(loaded.encode(xb))
    assert np.abs(decoded - xb).max() <= (calibration.vmax - calibration.vmin).max() / 255 + 1e-6
    D, I = index.search(xq, 10)
    D_ref, I_ref = exact_search(xq, decoded, 10)
    assert np.array_equal(I, I_ref)
    np.testing.assert_allclose(D, D_ref, atol=1e-5)
    # Streaming calibration over blocks equals the one-pass fit.
    blocks = Calibration.fit_blocks((lo, xb[lo : lo + 100]) for lo in range(0, len(xb), 100))
    assert np.array_equal(blocks.vmin, calibration.vmin) and np.array_equal(blocks.vmax, calibration.vmax)


def test_calibration_rejects_bad_ranges(tmp_path):
    with pytest.raises(ValueError, match="vmax >= vmin"):
        Calibration(np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="calibrate"):
        QuantizedIndex.build(np.ones((4, 5), np.float32), "int8", calibration=Calibration(np.zeros(3), np.ones(3)))


def test_float_precisions_keep_the_ranking(vectors):
    xb, xq = vectors
    _, I_ref = exact_search(xq, xb, 10)
    _, I32 = QuantizedIndex.build(xb, "float32").search(xq, 10)
    assert np.array_equal(I32, I_ref)
    _, I16 = QuantizedIndex.build(xb, "float16").search(xq, 10)
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I16, I_ref)]) > 0.95


def test_binary_paths(tmp_path, vectors):
    xb, xq = vectors
    codes = binary_codes(xb)
    assert codes.shape == (600, 8) and codes.dtype == np.uint8
    signs = sign_vectors(codes, 64)
    assert np.array_equal(signs > 0, xb > 0)
    # Hamming: D = -distance, and the order equals exact search over the ±1 vectors (same ties rule).
    D, I = QuantizedIndex.build(xb, "binary").search(xq, 10)
    D_ref, I_ref = exact_search(np.where(xq > 0, 1.0, -1.0).astype(np.float32), signs, 10)
    assert np.array_equal(I, I_ref)
    assert np.array_equal(-D * 2, 64 - D_ref)  # hamming = (d - <s, t>) / 2
    # asym rescoring with every row as a candidate equals exact float query · signs.
    index = QuantizedIndex.build(xb, Precision("binary-asym", candidates=600))
    _, I_asym = index.search(xq, 10)
    assert np.array_equal(I_asym, exact_search(xq, signs, 10)[1])
    # float rescoring with every row as a candidate equals exact float search, also from a memory map.
    np.save(tmp_path / "v.npy", xb)
    mmap = np.load(tmp_path / "v.npy", mmap_mode="r")
    index = QuantizedIndex.build(xb, Precision("binary-rescore", candidates=600), float_vectors=mmap)
    _, I_float = index.search(xq, 10)
    assert np.array_equal(I_float, exact_search(xq, xb, 10)[1])
    # With fewer candidates, rescoring can only reorder the Hamming top candidates.
    index = QuantizedIndex.build(xb, Precision("binary-rescore", candidates=50))
    _, I_50 = index.search(xq, 10)
    _, I_ham = QuantizedIndex.build(xb, "binary").search(xq, 50)
    assert all(set(a) <= set(b) for a, b in zip(I_50, I_ham))


def test_faiss_peer_and_fixed_bytes(vectors):
    xb, xq = vectors
    index = QuantizedIndex.build(xb, "faiss:PQ8x4")  # 16 centroids per sub-quantizer: trains on 600 rows
    D, I = index.search(xq, 5)
    assert I.shape == (20, 5) and (I >= 0).all() and (np.diff(D, axis=1) <= 0).all()
    assert index.ram_bytes() == 4
    assert index.fixed_bytes() >= 16 * 64 * 4  # its codebooks
    assert QuantizedIndex.build(xb, "int8").fixed_bytes() == 8 * 64
    assert QuantizedIndex.build(xb, "binary").fixed_bytes() == 0


def test_save_and_load_precision(tmp_path, vectors):
    xb, _ = vectors
    QuantizedIndex.build(xb, Precision("int8")).save_precision(tmp_path / "p")
    precision, calibration = load_precision(tmp_path / "p")
    assert precision == Precision("int8") and calibration is not None and calibration.dim == 64
    assert (tmp_path / "p" / "calibration.json").is_file()
    (tmp_path / "p" / "calibration.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="calibration.safetensors"):
        load_precision(tmp_path / "p")
