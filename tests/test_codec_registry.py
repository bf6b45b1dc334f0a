"""Registered codecs: the contract every family keeps, the rate-distortion bound, and refused tampering."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.index.codecs import (
    CODEC_FILE,
    PRECISION_FILE,
    DeployedCodec,
    Precision,
    QuantizedIndex,
    codec_family,
    corpus_spectrum,
    distortion_report,
    gaussian_bound,
    registered_codecs,
    water_level,
)
from embedtune.index.codecs.textbook import ScalarTransformIndex, water_filling_bits
from embedtune.io import IntegrityError

D, N = 32, 3000


@pytest.fixture(scope="module")
def corpus() -> tuple[np.ndarray, np.ndarray]:
    """Anisotropic Gaussian rows with a common offset, like sentence embeddings (a decaying spectrum, a mean direction)."""
    rng = np.random.default_rng(0)
    scales = np.geomspace(1.0, 0.05, D)
    rotation = np.linalg.qr(rng.standard_normal((D, D)))[0]
    docs = (rng.standard_normal((N, D)) * scales) @ rotation.T + 0.5 * rotation[:, 0]
    queries = docs[:40] + 0.1 * rng.standard_normal((40, D))
    return docs.astype(np.float32), queries.astype(np.float32)


@pytest.mark.parametrize("family", sorted(registered_codecs()))
def test_every_registered_codec_encodes_saves_loads_and_scores_the_same(family, corpus, tmp_path):
    docs, queries = corpus
    precision = Precision(f"{family}:8")
    assert precision.is_codec and precision.ram_bytes(D) == 8
    index = QuantizedIndex.build(docs, precision)
    assert index.backend.sa_code_size() == 8 and index.backend.ntotal == N
    scores, rows = index.search(queries, 10)
    assert scores.shape == rows.shape == (40, 10)
    exact = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact)])
    assert recall > 0.5, f"{family}: recall@10 {recall:.2f} against exact search"
    codes = index.backend.sa_encode(docs)
    if precision.uses_factory:
        index.save_precision(tmp_path)
        codec = DeployedCodec.load(tmp_path)
        assert np.array_equal(codec.encode(docs), codes)
        reloaded = codec.trained_index
    else:
        with pytest.raises(ValueError, match="reference codec"):
            index.save_precision(tmp_path)
        index.backend.clone_empty().save(tmp_path)
        reloaded = ScalarTransformIndex.load(tmp_path)
        assert np.array_equal(reloaded.sa_encode(docs), codes)
    reloaded.add(docs)
    again, again_rows = reloaded.search(queries, 10)
    assert np.array_equal(again_rows, rows) or np.allclose(np.sort(again, axis=1), np.sort(scores, axis=1), atol=1e-5)


@pytest.mark.parametrize("family", sorted(registered_codecs()))
def test_a_codec_is_never_far_below_the_gaussian_bound_and_reports_its_gap(family, corpus):
    docs, queries = corpus
    index = QuantizedIndex.build(docs, f"{family}:8")
    report = distortion_report(docs, index.backend.sa_decode(index.backend.sa_encode(docs)), 64, queries)
    assert report["bound_mse"] == pytest.approx(gaussian_bound(corpus_spectrum(docs), 64))
    # Gaussian data: no codec beats the bound by more than the sampling noise of a few thousand rows.
    assert report["gap_db"] > -0.5
    assert report["gap_db"] < 6.0, f"{family} is {report['gap_db']:.2f} dB above the bound"
    assert report["score_mse"] > 0


def test_the_bound_matches_the_closed_form_of_a_gaussian_source():
    # One axis: D(R) = λ 2^(-2R).
    assert gaussian_bound(np.array([3.0]), 5) == pytest.approx(3.0 * 2.0 ** -10)
    # Every axis active: D = d (Π λ)^(1/d) 2^(-2R/d).
    lam = np.array([4.0, 2.0, 1.0, 0.5])
    bits = 24
    closed = len(lam) * np.exp(np.mean(np.log(lam))) * 2.0 ** (-2 * bits / len(lam))
    assert gaussian_bound(lam, bits) == pytest.approx(closed)
    # Too few bits for the small axes: they keep their whole variance, the active ones share the rest.
    theta = water_level(lam, 1)
    assert theta == pytest.approx(np.sqrt(4.0 * 2.0) * 2.0 ** -1)
    assert gaussian_bound(lam, 1) == pytest.approx(2 * theta + 1.0 + 0.5)
    assert gaussian_bound(lam, 0) == pytest.approx(lam.sum())


def test_the_bound_is_what_a_gaussian_source_measures_to():
    rng = np.random.default_rng(1)
    lam = np.array([9.0, 4.0, 1.0, 0.25])
    x = rng.standard_normal((200_000, 4)) * np.sqrt(lam)
    assert corpus_spectrum(x) == pytest.approx(lam, rel=0.02)


def test_water_filling_bits_gives_each_bit_to_the_largest_distortion():
    assert water_filling_bits(np.array([16.0, 1.0]), 2).tolist() == [2, 0]   # 16/4 = 4 > 1
    assert water_filling_bits(np.array([16.0, 2.0]), 3).tolist() == [2, 1]   # 16/16 = 1 < 2
    assert water_filling_bits(np.array([1.0, 1.0, 1.0]), 24).tolist() == [8, 8, 8]
    with pytest.raises(ValueError, match="do not fit"):
        water_filling_bits(np.array([1.0]), 9)


def test_codec_names_are_data_and_typos_are_refused():
    assert Precision("klt-pq:48").ram_bytes(384) == 48 and Precision("klt-pq:48").factory == "klt-pq:48"
    assert codec_family("klt-rq:16").bits(768) == 128
    with pytest.raises(ValueError, match="registered codec"):
        Precision("klt-qp:32")
    with pytest.raises(ValueError, match="bytes per vector"):
        codec_family("klt-pq:0")


def test_a_budget_wider_than_the_vectors_is_refused_with_the_fix(corpus):
    docs, _ = corpus
    with pytest.raises(ValueError, match="sub-quantisers need at least"):
        QuantizedIndex.build(docs, "klt-pq:64")  # 64 sub-quantisers on 32 dimensions


def test_tampered_codec_files_are_refused(corpus, tmp_path):
    docs, _ = corpus
    QuantizedIndex.build(docs, "klt-pq:8").save_precision(tmp_path)
    DeployedCodec.load(tmp_path)
    codec = (tmp_path / CODEC_FILE).read_bytes()
    (tmp_path / CODEC_FILE).write_bytes(codec[:-9] + bytes([codec[-9] ^ 1]) + codec[-8:])
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        DeployedCodec.load(tmp_path)
    (tmp_path / CODEC_FILE).write_bytes(codec)
    values = json.loads((tmp_path / PRECISION_FILE).read_text())
    values["dim"] = 16
    (tmp_path / PRECISION_FILE).write_text(json.dumps(values))
    with pytest.raises(IntegrityError, match="content sha256 mismatch"):
        DeployedCodec.load(tmp_path)
    values.pop("content_sha256")
    values["dim"] = 32
    (tmp_path / PRECISION_FILE).write_text(json.dumps(values))
    with pytest.raises(IntegrityError, match="content_sha256"):
        DeployedCodec.load(tmp_path)


def test_a_codec_file_of_another_fit_is_refused(corpus, tmp_path):
    docs, _ = corpus
    QuantizedIndex.build(docs, "klt-pq:8").save_precision(tmp_path / "a")
    QuantizedIndex.build(docs[::-1].copy(), "klt-pq:8").save_precision(tmp_path / "b")
    (tmp_path / "a" / CODEC_FILE).write_bytes((tmp_path / "b" / CODEC_FILE).read_bytes())
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        DeployedCodec.load(tmp_path / "a")


def test_a_codec_refuses_vectors_with_nan_or_inf(corpus):
    docs, _ = corpus
    broken = docs.copy()
    broken[7, 3] = np.nan
    for family in sorted(registered_codecs()):
        with pytest.raises(ValueError, match="NaN or inf"):
            QuantizedIndex.build(broken, f"{family}:8")
