"""Registered codecs and precisions: the contract every one keeps, the rate-distortion bound, and refused tampering."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import embedtune.index.codecs as codecs_package
from embedtune.index.codecs import (
    CODEC_FILE,
    PRECISION_FILE,
    PRECISIONS,
    DeployedCodec,
    Precision,
    PrecisionCodec,
    QuantizedIndex,
    codec_family,
    corpus_spectrum,
    distortion_report,
    gaussian_bound,
    precision_examples,
    register_precision,
    registered_codecs,
    registered_precisions,
    water_level,
)
from embedtune.index.codecs.precision_registry import Encoded, faiss_index_of
from embedtune.index.codecs.sphere import sphere_rescore
from embedtune.index.codecs.textbook import RotatedCodeIndex, water_filling_bits
from embedtune.index.deployment import deployment_recipe
from embedtune.index.store_configs import STORE_SETTINGS, STORES, milvus_config, pgvector_sql, precision_kind, qdrant_config
from embedtune import runtime
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


_BUILT: dict[str, QuantizedIndex] = {}


def _rows_for(name: str, docs: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The corpus as a codec (``family`` or ``family:B``) takes it: unit rows for a family that declares it needs one norm."""
    family = registered_codecs().get(name.split(":")[0])
    if family is not None and family.requires_common_norm:
        return (docs / np.linalg.norm(docs, axis=1, keepdims=True)).astype(np.float32), queries
    return docs, queries


def _built_at_8_bytes(family: str, docs: np.ndarray) -> QuantizedIndex:
    """``family:8`` built on the module's corpus once: residual quantisation takes about a minute to train here."""
    if family not in _BUILT:
        _BUILT[family] = QuantizedIndex.build(_rows_for(family, docs, docs)[0], Precision(f"{family}:8"))
    return _BUILT[family]


@pytest.mark.parametrize("family", sorted(registered_codecs()))
def test_every_registered_codec_encodes_saves_loads_and_scores_the_same(family, corpus, tmp_path):
    docs, queries = _rows_for(family, *corpus)
    precision = Precision(f"{family}:8")
    assert precision.is_codec and precision.ram_bytes(D) == 8
    index = _built_at_8_bytes(family, docs)
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
        assert isinstance(index.backend, RotatedCodeIndex)
        index.backend.clone_empty().save(tmp_path)
        reloaded = type(index.backend).load(tmp_path)
        assert np.array_equal(reloaded.sa_encode(docs), codes)
    reloaded.add(docs)
    again, again_rows = reloaded.search(queries, 10)
    candidates = codec_family(f"{family}:8").sphere_candidates
    if candidates:  # the deployed search: the codes' own top candidates, ranked by their decoded direction
        again, again_rows = sphere_rescore(faiss_index_of(reloaded), queries, reloaded.search(queries, candidates)[1], 10)
    assert np.array_equal(again_rows, rows) or np.allclose(np.sort(again, axis=1), np.sort(scores, axis=1), atol=1e-5)


@pytest.mark.parametrize("family", sorted(registered_codecs()))
def test_a_codec_is_never_far_below_the_gaussian_bound_and_reports_its_gap(family, corpus):
    docs, queries = _rows_for(family, *corpus)
    index = _built_at_8_bytes(family, docs)
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


# -- every registered precision: the contract ----------------------------------------------------------------------------
# Parametrized from the registry itself, so a newly registered precision is checked without touching this file.

PRECISION_JSON_FIELDS = {"name", "candidates", "nprobe", "dim", "factory", "files_sha256", "content_sha256"}


def _stored_bytes_per_vector(index: QuantizedIndex) -> int:
    """What the index really holds per vector: FAISS's code size, the packed codes, or the float32 array."""
    if index.codes is not None:
        return int(index.codes.shape[1] * index.codes.itemsize)
    if index.backend is not None:
        return int(index.backend.sa_code_size())
    return int(index.float_vectors.nbytes // index.ntotal)


def _check_precision_contract(name: str, docs: np.ndarray, queries: np.ndarray, directory) -> None:
    precision = Precision(name)
    codec = precision.precision_codec
    dim, n = docs.shape[1], len(docs)
    index = QuantizedIndex.build(docs, precision)
    assert index.ntotal == n and index.dim == dim
    # The bytes it reports are the bytes it stores.
    assert _stored_bytes_per_vector(index) == precision.ram_bytes(dim) == index.ram_bytes(), name
    assert index.fixed_bytes() >= 0
    assert codec.tier in ("ram", "disk-rescore") and precision.tier == codec.tier
    assert precision.disk_bytes(dim) == precision.ram_bytes(dim) + (4 * dim if codec.tier == "disk-rescore" else 0)
    assert precision.disk_read_per_query(dim) == (precision.candidates * 4 * dim if codec.tier == "disk-rescore" else 0)
    if codec.tier == "disk-rescore":
        assert index.float_vectors is not None and index.float_vectors.shape == docs.shape
    assert codec.faiss_backed == precision.uses_factory and isinstance(codec.index_kind, str) and codec.factory == precision.factory
    scores, rows = index.search(queries, 10)
    assert scores.shape == rows.shape == (len(queries), 10)
    assert (np.diff(scores, axis=1) <= 1e-6).all(), f"{name}: scores are not in descending order"
    decoded = index.reconstruct(docs[:5])
    assert decoded is None or decoded.shape == (5, dim)
    if not codec.deployable:
        with pytest.raises(ValueError, match="reference codec"):
            index.save_precision(directory)
        return
    index.save_precision(directory)
    saved = json.loads((directory / PRECISION_FILE).read_text())
    assert set(saved) - {"compressor_state_sha256"} == PRECISION_JSON_FIELDS and saved["name"] == name
    assert set(saved["files_sha256"]) == set(codec.files) == {p.name for p in directory.iterdir()} - {PRECISION_FILE}
    loaded = DeployedCodec.load(directory)
    assert loaded.precision == precision and loaded.dim == dim
    codes = loaded.encode(docs)
    assert np.array_equal(codes, DeployedCodec.from_index(index).encode(docs)), f"{name}: the saved codec encodes otherwise"
    assert codes.nbytes == n * precision.ram_bytes(dim), f"{name}: encode's codes are not ram_bytes per vector"
    # Search through the loaded parameters gives what the built index gave.
    again, again_rows = loaded.build_index(docs).search(queries, 10)
    assert np.array_equal(again_rows, rows) and np.allclose(again, scores, atol=1e-6), name
    # Tampered files are refused: each file beside precision.json, then precision.json itself.
    for file in [*codec.files, PRECISION_FILE]:
        original = (directory / file).read_bytes()
        if file == PRECISION_FILE:
            (directory / file).write_text(json.dumps({**saved, "candidates": precision.candidates + 1}))
        else:
            (directory / file).write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        with pytest.raises(IntegrityError, match="sha256"):
            DeployedCodec.load(directory)
        (directory / file).write_bytes(original)
    DeployedCodec.load(directory)


@pytest.mark.parametrize("name", precision_examples())
def test_every_registered_precision_builds_saves_loads_searches_the_same_and_refuses_tampering(name, corpus, tmp_path):
    docs, queries = _rows_for(name, *corpus)
    _check_precision_contract(name, docs, queries, tmp_path)


@pytest.mark.parametrize("name", precision_examples())
def test_every_registered_precision_has_store_settings_and_recipes(name):
    precision = Precision(name)
    kind = precision_kind(precision)
    assert kind in STORE_SETTINGS, f"{name}: store kind {kind!r} has no STORE_SETTINGS row"
    assert set(STORE_SETTINGS[kind]) == set(STORES), f"{name}: a store without a setting (write 'not supported' in its note)"
    for store, (setting, note) in STORE_SETTINGS[kind].items():
        assert setting and isinstance(note, str), (name, store)
    recipe = deployment_recipe(precision, D)
    assert recipe["faiss"]["factory"] == precision.factory and recipe["faiss"]["rescore"] == precision.rescore
    assert recipe["lancedb"]["note"], f"{name}: the LanceDB recipe says nothing about how it differs"
    assert qdrant_config(precision, D)["vectors_config"]["size"] == D
    assert "CREATE TABLE" in pgvector_sql(precision, D)
    assert milvus_config(precision, D)["fields"]


def test_the_precision_table_is_the_registry():
    builtins = [cls.precision_name for cls in registered_precisions() if cls.precision_name]
    assert list(PRECISIONS) == builtins
    assert PRECISIONS[:6] == ("float32", "float16", "int8", "binary", "binary-asym", "binary-rescore")
    assert set(precision_examples()) >= set(PRECISIONS) and any(n.startswith("faiss:") for n in precision_examples())
    assert {f"{family}:4" for family in registered_codecs()} <= set(precision_examples())
    for name in PRECISIONS:  # the table in embedtune.index.codecs' docstring lists every built-in precision
        assert f"\n{name} " in codecs_package.__doc__ or f"\n{name}(" in codecs_package.__doc__, name


class ToyFloat64(PrecisionCodec):
    """A trivial codec for the test below: the float64 vectors, searched exactly."""

    precision_name = "toy-float64"
    summary = "float64 vectors, exact inner product"
    factory = "Flat"
    index_kind = "flat"
    store_kind = "float32"

    def ram_bytes(self, dim: int) -> int:
        return 8 * dim

    def build(self, xb, precision, calibration=None, float_vectors=None, train=None, trained_index=None) -> Encoded:
        return Encoded(None, codes=np.ascontiguousarray(xb, dtype=np.float64))

    def encode(self, x, calibration=None, trained_index=None) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=np.float64)

    def search(self, index, xq, k):
        scores = xq.astype(np.float64) @ index.codes.T
        rows = np.lexsort((np.broadcast_to(np.arange(index.ntotal), scores.shape), -scores), axis=1)[:, :k]
        return np.take_along_axis(scores, rows, axis=1).astype(np.float32), rows.astype(np.int64)

    def reconstruct(self, index, x):
        return x


@pytest.fixture
def toy_precision_registered(monkeypatch):
    """``ToyFloat64`` registered for one test only (the registry is restored afterwards)."""
    import embedtune.index.codecs.precision_registry as registry_module

    monkeypatch.setattr(registry_module, "_CODECS", list(registry_module._CODECS))
    register_precision(ToyFloat64)
    yield "toy-float64"


def test_a_new_precision_is_one_class_and_one_registration(toy_precision_registered, corpus, tmp_path):
    from embedtune.workflows.plan import QuerySet, precision_tier, score_precisions

    name = toy_precision_registered
    docs, queries = corpus
    assert name in precision_examples() and Precision(name).ram_bytes(D) == 8 * D
    with pytest.raises(ValueError, match="is registered already"):
        register_precision(type("Another", (ToyFloat64,), {}))
    _check_precision_contract(name, docs, queries, tmp_path / "codec")
    test_every_registered_precision_has_store_settings_and_recipes(name)
    # The plan takes the name as it takes the built-in ones: a scored row with its bytes and tier.
    assert precision_tier(name) == "ram"
    ids = [f"q{i}" for i in range(len(queries))]
    query_set = QuerySet(ids, queries, {q: {f"d{i}": 1} for i, q in enumerate(ids)}, "val", ignore_identical_ids=False)
    rows = score_precisions(query_set, [f"d{i}" for i in range(N)], docs, None, ["float32", name], top_k=10, rounds=1)
    toy = next(row for row in rows if row["precision"] == name)
    assert toy["ram_bytes"] == 8 * D and toy["tier"] == "ram" and toy["recall@10"] == rows[0]["recall@10"]


def test_an_unknown_precision_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown precision 'int3'; valid: float32, .*turboquant4.*faiss:<index_factory string>.*klt-pq:<bytes>"):
        Precision("int3")


# -- every axis kept when no whole number of axes per sub-quantiser covers the dimension (zero-padded axes) --------

PAD_D, PAD_N = 64, 4000


@pytest.fixture(scope="module")
def wide_corpus() -> tuple[np.ndarray, np.ndarray]:
    """64-d Gaussian rows with a slowly decaying spectrum (every axis worth bits at 48 B) and a mean direction."""
    rng = np.random.default_rng(0)
    scales = 0.9 ** np.arange(PAD_D) + 0.05
    rotation = np.linalg.qr(rng.standard_normal((PAD_D, PAD_D)))[0]
    docs = (rng.standard_normal((PAD_N, PAD_D)) * scales) @ rotation.T + 0.5 * rotation[:, 0]
    queries = docs[:40] + 0.1 * rng.standard_normal((40, PAD_D))
    return docs.astype(np.float32), queries.astype(np.float32)


def _unpadded_candidate_axes(codec, eigenvalues: np.ndarray) -> list[int]:
    """``_KltCodec.candidate_axes`` before padded axes existed (multiples of the groups up to d only)."""
    d, m = len(eigenvalues), codec.groups()
    active = int((eigenvalues > water_level(eigenvalues, codec.bits(d))).sum())
    options = sorted({m * k for k in codec.axes_per_group if m * k <= d})
    lower = [r for r in options if r <= active]
    keep = [r for r in lower if r >= active / 3] or lower[-1:]
    return keep + [r for r in options if r > active][:1]


def _covers(codec, d: int) -> bool:
    """A whole number of axes per sub-quantiser (of those tried) codes every axis, or none up to 2d does."""
    multiples = [codec.groups() * k for k in codec.axes_per_group]
    return d in multiples or not any(d < r <= 2 * d for r in multiples)


def test_the_candidate_axes_are_unchanged_where_a_multiple_of_the_groups_covers_the_dimension():
    rng = np.random.default_rng(3)
    for d in (64, 100, 128, 384, 768):
        spectra = [np.geomspace(1.0, 0.05, d), 0.9 ** np.arange(d) + 0.05, np.sort(rng.exponential(size=d))[::-1]]
        for family in ("klt-pq", "klt-pq4"):
            for code_bytes in range(1, d // 2 + 1):
                codec = codec_family(f"{family}:{code_bytes}")
                if codec.groups() > d or not _covers(codec, d):
                    continue
                for eigenvalues in spectra:
                    assert codec.candidate_axes(eigenvalues) == _unpadded_candidate_axes(codec, eigenvalues), (family, code_bytes, d)
    # The budgets of the near-limit tables on 384-d and 768-d vectors are among them: their choices are the old ones.
    for d in (384, 768):
        for code_bytes in (16, 32, 48, 64):
            assert _covers(codec_family(f"klt-pq:{code_bytes}"), d), (code_bytes, d)
    assert max(codec_family("klt-pq:16").candidate_axes(0.9 ** np.arange(64) + 0.05)) <= 64


def test_groups_that_no_whole_number_of_axes_covers_also_try_every_axis_zero_padded():
    flat = 0.9 ** np.arange(128) + 0.05
    # 48 sub-quantisers on 128 axes: 48 or 96 axes drop the weakest; all 128 padded to 144 keep them.
    assert codec_family("klt-pq:48").candidate_axes(flat) == [48, 96, 144]
    four_each = codec_family("klt-pq:32")  # four axes each cover them all: nothing to pad
    assert max(four_each.candidate_axes(flat)) == 128
    assert four_each.candidate_axes(flat) == _unpadded_candidate_axes(four_each, flat)


def test_more_groups_than_half_the_dimensions_also_try_every_axis_zero_padded():
    flat = 0.9 ** np.arange(PAD_D) + 0.05
    assert codec_family("klt-pq:48").candidate_axes(flat) == [48, 96]  # 48 axes alone, or all 64 padded to 96
    assert codec_family("klt-pq4:24").candidate_axes(flat) == [48, 96]
    assert codec_family("klt-pq:64").candidate_axes(flat) == [64]  # one axis each covers them all: nothing to pad


def test_klt_pq_past_half_the_dimensions_keeps_every_axis_and_more_bytes_lower_the_error(wide_corpus, tmp_path):
    import faiss

    from embedtune.index.codecs.transform import transform_matrix

    docs, queries = wide_corpus
    errors = {}
    for code_bytes in (32, 48):
        index = QuantizedIndex.build(docs, f"klt-pq:{code_bytes}")
        residual = docs - index.backend.sa_decode(index.backend.sa_encode(docs))
        errors[code_bytes] = float(((residual - residual.mean(axis=0)) ** 2).sum(axis=1).mean())
    matrix = transform_matrix(index.backend)  # klt-pq:48's
    assert matrix.shape == (96, PAD_D) and np.linalg.matrix_rank(matrix) == PAD_D  # every axis, 32 zero rows
    assert int((np.abs(matrix).sum(axis=1) == 0).sum()) == 32
    assert np.allclose(matrix.T @ matrix, np.eye(PAD_D), atol=1e-5)
    # Measured 0.0106 at 32 B and 0.0028 at 48 B (0.046 with the weakest 16 axes dropped, as before).
    assert errors[48] < 0.5 * errors[32], errors
    # Saved and loaded: the same codes, decodes (the padding is a FAISS RemapDimensionsTransform) and search.
    index.save_precision(tmp_path)
    codec = DeployedCodec.load(tmp_path)
    codes = faiss.vector_to_array(faiss.downcast_index(index.backend.index).codes).reshape(len(docs), -1)  # what it holds
    assert np.array_equal(codec.encode(docs), codes)
    plain = faiss.read_index(str(tmp_path / CODEC_FILE))
    assert np.allclose(plain.sa_decode(codes), index.backend.sa_decode(codes), atol=1e-6)
    reloaded = codec.trained_index
    reloaded.add(docs)
    scores, rows = index.search(queries, 10)
    again, again_rows = reloaded.search(queries, 10)
    assert np.array_equal(again_rows, rows) or np.allclose(np.sort(again, axis=1), np.sort(scores, axis=1), atol=1e-5)


@pytest.mark.parametrize("family", ["klt-wpq", "klt-apq"])
def test_score_weighted_codecs_past_half_the_dimensions_keep_every_axis_and_round_trip(family, wide_corpus, tmp_path):
    import faiss

    from embedtune.index.codecs.transform import transform_matrix

    docs, queries = wide_corpus
    index = QuantizedIndex.build(docs, f"{family}:48")
    encoder_map = transform_matrix(index.backend.encoder)  # x -> y on the kept axes (S^{1/2} folded in)
    assert encoder_map.shape == (96, PAD_D) and np.linalg.matrix_rank(encoder_map) == PAD_D
    codes = index.backend.sa_encode(docs)
    assert codes.shape == (PAD_N, 48)
    score_error = {}
    for code_bytes, built in ((48, index), (32, QuantizedIndex.build(docs, f"{family}:32"))):
        decoded = built.backend.sa_decode(built.backend.sa_encode(docs))
        error = queries @ (docs - decoded).T
        score_error[code_bytes] = float(((error - error.mean(axis=1, keepdims=True)) ** 2).mean())
    assert score_error[48] < 0.7 * score_error[32], score_error
    scores, rows = index.search(queries, 10)
    exact = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact)]) > 0.8
    index.save_precision(tmp_path)
    codec = DeployedCodec.load(tmp_path)
    assert np.array_equal(codec.encode(docs), codes)
    reloaded = codec.trained_index
    reloaded.add(docs)
    again, again_rows = reloaded.search(queries, 10)
    assert np.array_equal(again_rows, rows) and np.allclose(again, scores, atol=1e-5)
    plain = faiss.read_index(str(tmp_path / CODEC_FILE))  # codec.faiss alone, in plain FAISS
    plain.add_sa_codes(codes)
    assert np.allclose(np.sort(plain.search(queries, 10)[0], axis=1), np.sort(scores, axis=1), atol=1e-4)


@pytest.fixture
def thread_count_restored():
    before = runtime.thread_budget()
    yield
    runtime.set_threads(before)


@pytest.mark.parametrize("family", sorted(registered_codecs()))
def test_a_codec_fits_and_encodes_the_same_on_one_thread_and_on_two(family, corpus, thread_count_restored):
    """OpenBLAS rounds some products differently on 1 and 2 threads; a plan's default thread count depends on the load,
    so without one-thread BLAS in the fits the same plan would write other tables on a busy machine than on an idle one."""
    docs, _ = _rows_for(family, corpus[0][:1000], corpus[1])
    # Residual quantisation trains a stage per byte (15 s at 8 B here): two stages take the same paths.
    budget = 2 if family == "klt-rq" else 8
    tables = []
    for threads in (1, 2):
        runtime.set_threads(threads)
        index = QuantizedIndex.build(docs, Precision(f"{family}:{budget}"))
        runtime.set_threads(1)  # encode and decode alike, so only the fit differs
        codes = index.backend.sa_encode(docs)
        decoded = index.backend.sa_decode(codes) if hasattr(index.backend, "sa_decode") else None
        tables.append((codes, decoded))
    (codes_1, decoded_1), (codes_2, decoded_2) = tables
    assert np.array_equal(codes_1, codes_2), f"{family}: other codes on 2 threads"
    if decoded_1 is not None:
        assert np.array_equal(decoded_1, decoded_2), f"{family}: other tables on 2 threads"


def test_product_quantisers_trained_side_by_side_are_the_ones_faiss_trains(corpus, thread_count_restored):
    import faiss

    from embedtune.index.codecs.registry import codec_family as family_of
    from embedtune.index.codecs.transform import sampled_klt, train_quantiser
    from embedtune.runtime import single_threaded

    codec = family_of("klt-pq:8")
    sample, eigenvalues, axes = sampled_klt(codec, corpus[0])
    r = codec.candidate_axes(eigenvalues)[0]
    faiss_trained, side_by_side = (codec._index(axes, r, codec._permutation(eigenvalues, r)) for _ in range(2))
    with single_threaded():
        faiss_trained.train(sample)
    runtime.set_threads(2)
    train_quantiser(side_by_side, sample)
    assert side_by_side.is_trained and faiss.downcast_index(side_by_side.index).is_trained
    centroids = [faiss.vector_to_array(faiss.downcast_index(index.index).pq.centroids) for index in (faiss_trained, side_by_side)]
    assert np.array_equal(*centroids)
    assert np.array_equal(faiss_trained.sa_encode(corpus[0]), side_by_side.sa_encode(corpus[0]))


def _serialized(index) -> bytes:
    import faiss

    if hasattr(index, "search_index"):  # klt-wpq and klt-apq: the FAISS index that holds the codes
        index = index.search_index
    return faiss.serialize_index(index).tobytes()


@pytest.mark.parametrize("name", ["klt-pq:8", "klt-pq4:8", "klt-wpq:8", "klt-apq:8"])
def test_a_klt_codec_encoded_in_blocks_side_by_side_holds_the_codes_of_one_call(name, corpus, thread_count_restored, monkeypatch):
    import embedtune.index.codecs.row_encoding as row_encoding

    docs = corpus[0]
    codec = Precision(name).precision_codec
    runtime.set_threads(1)
    trained = codec.family_codec.train(docs)
    in_one_call, in_blocks = codec.trained_copy(trained), codec.trained_copy(trained)
    row_encoding.add_encoded(in_one_call, docs)  # one block: N < ENCODE_BLOCK_ROWS
    monkeypatch.setattr(row_encoding, "ENCODE_BLOCK_ROWS", 700)  # 5 blocks, the last one short
    runtime.set_threads(2)
    row_encoding.add_encoded(in_blocks, docs)
    assert in_blocks.ntotal == in_one_call.ntotal == N
    assert _serialized(in_blocks) == _serialized(in_one_call)


def test_an_opq_peer_holds_the_codes_index_build_writes_block_by_block(corpus, thread_count_restored, monkeypatch):
    """A plan's FAISS OPQ peer is a pre-transform over a product quantiser too: the sweep's index and the one
    `index build --plan` writes from its tables, block by block, hold the same codes."""
    import faiss

    import embedtune.index.codecs.row_encoding as row_encoding

    runtime.set_threads(1)
    precision = Precision("faiss:OPQ8,PQ8")
    trained = QuantizedIndex.build(corpus[0], precision).backend
    trained.reset()
    ties = _near_tie_rows(trained, 600)
    in_the_sweep = QuantizedIndex.build(ties, precision, trained_index=trained).backend
    block_by_block = faiss.clone_index(trained)
    monkeypatch.setattr(row_encoding, "ENCODE_BLOCK_ROWS", 7)
    runtime.set_threads(2)
    row_encoding.add_encoded(block_by_block, ties)
    assert _serialized(block_by_block) == _serialized(in_the_sweep)
    assert np.array_equal(precision.precision_codec.encode(ties, trained_index=trained),
                          faiss.vector_to_array(faiss.downcast_index(in_the_sweep.index).codes).reshape(600, -1))


@pytest.mark.parametrize("split", [1, 3, 7, 16, 333])
def test_a_float64_product_gives_each_row_the_bits_of_one_call_in_any_split(split, thread_count_restored):
    """OpenBLAS's dgemm gives a lone row (gemv) or a short tile of rows other last bits; row_product pads to whole tiles."""
    from embedtune.index.codecs.row_encoding import row_product

    rng = np.random.default_rng(0)
    x, right = rng.standard_normal((1000, 96)).astype(np.float32), rng.standard_normal((96, 40))
    whole = row_product(x, right)
    runtime.set_threads(2)
    assert np.array_equal(row_product(x, right), whole)
    runtime.set_threads(1)
    parts = np.concatenate([row_product(x[lo : lo + split], right) for lo in range(0, len(x), split)])
    assert np.array_equal(parts, whole)


def _near_tie_rows(trained, n: int, seed: int = 0) -> np.ndarray:
    """Rows whose every sub-space sits halfway between two of the codec's codewords: each code is decided by the last
    bits of the row's map onto the kept axes."""
    import faiss

    from embedtune.index.codecs.row_encoding import transform_matrix

    rng = np.random.default_rng(seed)
    encoder = getattr(trained, "encoder", trained)  # klt-wpq and klt-apq choose codes with their encoder's map
    pq = faiss.downcast_index(encoder.index).pq
    centroids = faiss.vector_to_array(pq.centroids).reshape(pq.M, pq.ksub, pq.dsub).astype(np.float64)
    first = rng.integers(0, pq.ksub, (n, pq.M))
    second = (first + rng.integers(1, pq.ksub, (n, pq.M))) % pq.ksub
    y = 0.5 * (centroids[np.arange(pq.M), first] + centroids[np.arange(pq.M), second]).reshape(n, -1)
    return np.ascontiguousarray(y @ np.linalg.pinv(transform_matrix(encoder)).T, dtype=np.float32)


@pytest.mark.parametrize("name", ["klt-pq:8", "klt-pq4:8", "klt-wpq:8", "klt-apq:8"])
def test_a_row_gets_the_same_code_whatever_rows_are_encoded_with_it(name, corpus, thread_count_restored, monkeypatch):
    """FAISS maps an IndexPreTransform's rows with sgemm, whose last bits for a row depend on where it sits in the call;
    on rows halfway between two codewords that moved 106 of 600 codes of klt-pq:8 between one call and blocks of 7. The
    index a plan scores and the one `index build --plan` writes block by block must hold the same codes."""
    import embedtune.index.codecs.row_encoding as row_encoding

    codec = Precision(name).precision_codec
    runtime.set_threads(1)
    trained = codec.family_codec.train(corpus[0])
    ties = _near_tie_rows(trained, 600)
    in_one_call, in_blocks = codec.trained_copy(trained), codec.trained_copy(trained)
    row_encoding.add_encoded(in_one_call, ties)
    monkeypatch.setattr(row_encoding, "ENCODE_BLOCK_ROWS", 7)
    runtime.set_threads(2)
    row_encoding.add_encoded(in_blocks, ties)
    assert _serialized(in_blocks) == _serialized(in_one_call)
    one_by_one = np.concatenate([row_encoding.encode_rows(trained, ties[i : i + 1]) for i in range(0, 600, 37)])
    assert np.array_equal(one_by_one, row_encoding.encode_rows(trained, ties)[::37])
    # What a deployed codec hands a user to add (DeployedCodec.encode) is what the index holds.
    assert np.array_equal(codec.encode(ties[::37], trained_index=trained), one_by_one)
    # The distortion report (MSE, dB to the bound) decodes the codes the index holds, not those of FAISS's own map.
    held = getattr(in_one_call, "search_index", in_one_call).reconstruct_n(0, len(ties))
    assert np.array_equal(codec.reconstruct(SimpleNamespace(backend=in_one_call), ties), held)
    # Wide vectors are mapped fewer rows at a time (here 7), which changes no code.
    monkeypatch.setattr(row_encoding, "MAPPED_VALUES", 7 * ties.shape[1])
    assert row_encoding.map_rows(ties.shape[1]) == 7
    assert np.array_equal(row_encoding.encode_rows(trained, ties)[::37], one_by_one)
