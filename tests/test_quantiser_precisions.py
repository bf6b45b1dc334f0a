"""The quantiser precisions: FAISS RaBitQ (1-bit, + float rescore, 4-bit), TurboQuant (1-, 4-bit) and SQ4.

Each builds and searches, counts exactly the bytes FAISS stores per vector (codes and per-vector
factors, checked against ``sa_code_size`` and the growth of the serialized index), round-trips
through a saved precision, a plan folder and ``index build --plan``, and on a FAISS without the
index type fails with the release that has it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_beir
from embedtune.compress import get_compressor_class
from embedtune.index.codecs import (
    FAISS_PRECISIONS,
    Precision,
    QuantizedIndex,
    check_faiss_supports,
    factory_code_bytes,
    load_precision,
)
from embedtune.errors import EmbedtuneError
from embedtune.evaluate.search import exact_search, rescore
from embedtune.index import load_index
from embedtune.index.planned import build_planned_index
from embedtune.index.store import new_index
from embedtune.workflows.experiment import load_experiment, training_data
from embedtune.index.plan_format import load_plan, write_plan
from embedtune.workflows.plan import QUANTISER_PEERS, peer_factories, run_plan

faiss = pytest.importorskip("faiss")

NEW = ("int4", "rabitq1", "rabitq1-rescore", "rabitq4", "turboquant1", "turboquant4")


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture()
def vectors():
    """600 unit docs in 64-d and 20 queries, each a noisy copy of doc 10 * i (its nearest neighbour)."""
    rng = np.random.default_rng(0)
    xb = _unit(rng.standard_normal((600, 64)))
    xq = _unit(xb[::30][:20] + 0.15 * rng.standard_normal((20, 64)))
    return xb, xq


def test_the_new_precisions_are_faiss_index_types():
    assert set(NEW) == set(FAISS_PRECISIONS)
    assert {name: Precision(name).factory for name in NEW} == {
        "int4": "SQ4", "rabitq1": "RaBitQ", "rabitq1-rescore": "RaBitQ", "rabitq4": "RaBitQ4",
        "turboquant1": "SQtqmse1", "turboquant4": "SQtqmse4"}
    # 384-d (MiniLM): RaBitQ keeps two float32 factors per vector, 4-bit RaBitQ three more; TurboQuant none.
    assert {name: Precision(name).ram_bytes(384) for name in NEW} == {
        "int4": 192, "rabitq1": 48 + 8, "rabitq1-rescore": 48 + 8, "rabitq4": 48 + 144 + 8 + 12, "turboquant1": 48, "turboquant4": 192}
    assert Precision("rabitq1-rescore").disk_bytes(384) == 56 + 4 * 384  # the float32 vectors it rescores against, on disk
    assert all(Precision(name).disk_bytes(384) == Precision(name).ram_bytes(384) for name in NEW if name != "rabitq1-rescore")


def _stored_bytes_per_vector(factory: str, d: int, n: int = 320) -> tuple[float, int]:
    """What the index grows by per added vector (serialized), and its ``sa_code_size``."""
    rng = np.random.default_rng(1)
    x = _unit(rng.standard_normal((2 * n, d)))
    sizes = []
    for rows in (n, 2 * n):
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
        index.add(x[:rows])
        sizes.append(int(faiss.serialize_index(index).size))
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index
    return (sizes[1] - sizes[0]) / n, inner.sa_code_size()


@pytest.mark.parametrize("d", [24, 64, 100, 127, 384])
@pytest.mark.parametrize("factory", ["SQ4", "RaBitQ", "RaBitQ2", "RaBitQ4", "RaBitQ9", "RaBitQfs", "RaBitQfs4", "SQtqmse1",
                                     "SQtqmse3", "SQtqmse4", "SQtqmse8", "SQtq2", "SQtq5", "RR,RaBitQ", "RR,SQtqmse4"])
def test_byte_count_is_what_faiss_stores_per_vector(factory, d):
    grown, code_size = _stored_bytes_per_vector(factory, d)
    assert factory_code_bytes(factory, d) == grown == code_size
    assert Precision(f"faiss:{factory}").ram_bytes(d) == grown


@pytest.mark.parametrize("name", NEW)
def test_named_precision_bytes_match_the_built_index(name, vectors):
    xb, _ = vectors
    index = QuantizedIndex.build(xb, name)
    grown, code_size = _stored_bytes_per_vector(Precision(name).factory, 64)
    assert index.ram_bytes() == grown == code_size
    # fixed bytes: what the serialized index holds beyond the per-vector codes (ranges, centroid, codebook)
    assert index.fixed_bytes() == int(faiss.serialize_index(index.backend).size) - len(xb) * index.ram_bytes() >= 0


def test_an_opq_rotation_on_wide_vectors_trains_for_fewer_iterations(monkeypatch):
    """An OPQ iteration solves a d x d SVD: FAISS's 50 took 818 s on 9,000 x 1536 rows; wider inputs than
    OPQ_WIDE_DIM train for OPQ_WIDE_ITERATIONS, narrower ones keep FAISS's count."""
    import faiss

    from embedtune.index.codecs import faiss_codes

    monkeypatch.setattr(faiss_codes, "OPQ_WIDE_DIM", 32)
    rotation = lambda index: faiss.downcast_VectorTransform(index.chain.at(0))  # noqa: E731
    default = rotation(faiss.index_factory(32, "OPQ8,PQ8")).niter
    assert rotation(faiss_codes.new_factory_index(64, "OPQ8,PQ8")).niter == faiss_codes.OPQ_WIDE_ITERATIONS < default
    assert rotation(faiss_codes.new_factory_index(32, "OPQ8,PQ8")).niter == default
    x = np.random.default_rng(0).standard_normal((2000, 64)).astype(np.float32)
    index = faiss_codes.new_factory_index(64, "OPQ8,PQ8")
    index.train(x)  # trains, and keeps the capped count
    assert index.is_trained and rotation(index).niter == faiss_codes.OPQ_WIDE_ITERATIONS


def test_ivf_and_rotated_factories_and_bad_bit_counts():
    assert factory_code_bytes("IVF4,RaBitQ", 64) == 8 + 8 + 8  # + the 8-byte list id
    assert factory_code_bytes("IVF4,SQtqmse4", 64) == 32 + 8
    assert factory_code_bytes("RR,SQtqmse4", 64) == 32 and factory_code_bytes("PCAR32,RaBitQ", 64) == 4 + 8
    with pytest.raises(ValueError, match="1 to 9 bits"):
        Precision("faiss:RaBitQ12")
    with pytest.raises(ValueError, match="SQtqmse takes 1, 2, 3, 4, 8 bits"):
        Precision("faiss:SQtqmse5")


@pytest.mark.parametrize("name", NEW)
def test_new_precisions_build_and_search(name, vectors):
    xb, xq = vectors
    index = QuantizedIndex.build(xb, name)
    D, I = index.search(xq, 10)
    assert I.shape == (20, 10) and I.dtype == np.int64 and ((I >= 0) & (I < len(xb))).all()
    assert (np.diff(D, axis=1) <= 0).all()  # best first
    sources = np.arange(0, 600, 30)[:20]  # each query is a noisy copy of one doc: found, first for all but 1-bit codes
    assert (I[:, :3] == sources[:, None]).any(axis=1).all() and (I[:, 0] == sources).mean() >= (0.8 if name.endswith("1") else 0.95)
    _, I_exact = exact_search(xq, xb, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I, I_exact)])
    assert recall >= {"rabitq1": 0.3, "turboquant1": 0.3}.get(name, 0.6), recall
    if name == "rabitq1-rescore":
        np.testing.assert_array_equal(D, rescore(xq, xb, I))  # float32 scores of the RaBitQ candidates
        assert recall >= 0.95


def test_rescore_reads_the_float_vectors_given(vectors, tmp_path):
    xb, xq = vectors
    path = tmp_path / "vectors.npy"
    np.save(path, xb)
    on_disk = np.load(path, mmap_mode="r")
    index = QuantizedIndex.build(xb, Precision("rabitq1-rescore", candidates=50), float_vectors=on_disk)
    assert index.float_vectors is on_disk
    D, I = index.search(xq, 5)
    _, I_50 = QuantizedIndex.build(xb, "rabitq1").search(xq, 50)
    assert all(set(a) <= set(b) for a, b in zip(I, I_50))  # rescored within RaBitQ's own top 50


@pytest.mark.parametrize("name", NEW)
def test_precision_and_index_round_trip(name, vectors, tmp_path):
    xb, xq = vectors
    index = QuantizedIndex.build(xb, Precision(name, candidates=40))
    index.save_precision(tmp_path / "p")
    saved = json.loads((tmp_path / "p" / "precision.json").read_text())
    assert saved["factory"] == FAISS_PRECISIONS[name] and saved["dim"] == 64
    precision, calibration = load_precision(tmp_path / "p")
    assert precision == Precision(name, candidates=40) and calibration is None
    # The FAISS index written and read back (what `index build` stores) answers the same.
    faiss.write_index(index.backend, str(tmp_path / "index.faiss"))
    reread = QuantizedIndex(precision, 64, faiss.read_index(str(tmp_path / "index.faiss")), len(xb), float_vectors=index.float_vectors)
    for a, b in zip(index.search(xq, 10), reread.search(xq, 10)):
        np.testing.assert_array_equal(a, b)


def test_missing_index_type_names_the_faiss_release(vectors, monkeypatch):
    xb, _ = vectors
    installed = faiss.__version__
    monkeypatch.delattr(faiss, "IndexRaBitQ")
    with pytest.raises(EmbedtuneError, match=rf"'rabitq1'.*RaBitQ codes.*faiss-cpu 1\.11\.0; the installed faiss is {installed}.*"
                                             r"pip install -U 'faiss-cpu>=1\.11\.0'"):
        QuantizedIndex.build(xb, "rabitq1")
    with pytest.raises(EmbedtuneError, match=r"faiss-cpu 1\.11\.0"):
        new_index("RaBitQ", 64)  # `index build --kind RaBitQ`
    monkeypatch.delattr(faiss.ScalarQuantizer, "QT_1bit_tqmse")
    with pytest.raises(EmbedtuneError, match=r"'turboquant4'.*TurboQuant.*faiss-cpu 1\.14\.2"):
        QuantizedIndex.build(xb, "turboquant4")
    with pytest.raises(EmbedtuneError, match=r"faiss-cpu 1\.14\.2"):
        QuantizedIndex.build(xb, "faiss:RR,SQtqmse1")
    monkeypatch.delattr(faiss.RaBitQuantizer, "nb_bits")
    with pytest.raises(EmbedtuneError, match=r"multi-bit RaBitQ codes.*faiss-cpu 1\.13\.1"):
        QuantizedIndex.build(xb, "rabitq4")
    QuantizedIndex.build(xb, "int4")  # SQ4 is in every FAISS

    class OldFaiss:  # a FAISS before RaBitQ: no IndexRaBitQ, no TurboQuant types
        __version__ = "1.10.0"

        class ScalarQuantizer:
            QT_4bit = 1

    with pytest.raises(EmbedtuneError, match=r"faiss-cpu 1\.13\.1; the installed faiss is 1\.10\.0"):
        check_faiss_supports("RaBitQ4", "rabitq4", OldFaiss)
    check_faiss_supports("SQ4", "int4", OldFaiss)


def test_peer_kinds():
    assert QUANTISER_PEERS == {"rabitq": ("rabitq1", "rabitq1-rescore", "rabitq4"), "turboquant": ("turboquant1", "turboquant4"),
                               "int4": ("int4",)}
    assert peer_factories(384, [16, 48], ("pq", "rabitq", "turboquant", "int4")) == ["PQ16", "PQ48"]  # no factory strings of theirs
    with pytest.raises(ValueError, match="rabitq, turboquant, int4"):
        peer_factories(384, [16], ("rabitq2",))


# -- compress plan and index build --plan --------------------------------------------------------
@pytest.fixture
def toy(tmp_path):
    """60 unit docs in 24-d, 40 queries each judged relevant to one doc (as tests/test_plan.py's), as files."""
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((60, 24)).astype(np.float32)
    targets = rng.permutation(60)[:40]
    queries = _unit(docs[targets] + 0.6 * rng.standard_normal((40, 24)).astype(np.float32))
    docs = _unit(docs)
    doc_ids, query_ids = [f"d{i}" for i in range(60)], [f"q{i}" for i in range(40)]
    root = write_beir(tmp_path / "toy", [{"_id": i, "text": i} for i in doc_ids], [{"_id": q, "text": q} for q in query_ids],
                      [(q, doc_ids[t], 1) for q, t in zip(query_ids, targets)])
    files = {}
    for name, ids, array in (("doc", doc_ids, docs), ("query", query_ids, queries)):
        np.save(tmp_path / f"{name}.npy", array)
        (tmp_path / f"{name}.txt").write_text("".join(i + "\n" for i in ids))
        files[name] = (tmp_path / f"{name}.npy", tmp_path / f"{name}.txt")
    return root, files


def _experiment(toy):
    root, files = toy
    return load_experiment(root, doc_embeddings=files["doc"][0], doc_ids=files["doc"][1],
                           query_embeddings=files["query"][0], query_ids=files["query"][1])


def test_plan_scores_the_quantiser_peers_on_the_frozen_vectors(toy, tmp_path):
    experiment = _experiment(toy)
    plan = run_plan(experiment, tmp_path / "plan", budget_bytes=64, methods=["pca"], dims=[16], precisions=["int8", "rabitq1"],
                    peers=["rabitq", "turboquant", "int4"], rounds=1)
    rows = {r["setting"]: r for r in plan["sweep"]}
    for name in NEW:
        row = rows[f"frozen-24/{name}"]
        assert row["ram_bytes"] == Precision(name).ram_bytes(24) and row["method"] == "frozen"
    assert rows["frozen-24/rabitq4"]["ram_bytes"] == 3 + 9 + 8 + 12 and rows["frozen-24/turboquant1"]["ram_bytes"] == 3
    assert rows["frozen-24/rabitq1-rescore"]["disk_bytes"] == 3 + 8 + 4 * 24
    assert rows["frozen-24/rabitq1"]["family"] == "frozen (quantised)"  # also a swept precision: scored once, not twice
    assert rows["frozen-24/turboquant4"]["family"] == "FAISS RaBitQ/TurboQuant/SQ4"
    assert rows["pca-16/rabitq1"]["ram_bytes"] == 2 + 8  # any compressor's output at the new precision
    assert len(rows) == len(plan["sweep"])


@pytest.mark.parametrize("name", NEW)
def test_plan_folder_and_index_build_search_as_scored(name, toy, tmp_path):
    experiment = _experiment(toy)
    pca = get_compressor_class("pca-uncentred")
    compressor = pca(pca.config_class(dim=16)).fit(training_data(experiment, "train"))
    out = tmp_path / "plan"
    write_plan(out, compressor, Precision(name, candidates=20), experiment.embeddings.doc_embeddings, {"chosen": {"setting": name}})
    info, loaded, precision, calibration = load_plan(out)
    assert precision.name == name and info["ram_bytes"] == Precision(name).ram_bytes(16) and info["index_kind"] == FAISS_PRECISIONS[name]
    index_dir = build_planned_index(toy[1]["doc"][0], tmp_path / "index", out, ids=toy[1]["doc"][1])
    index = load_index(index_dir)
    assert index.manifest["kind"] == FAISS_PRECISIONS[name] and (index.vectors is not None) == (name == "rabitq1-rescore")
    queries = loaded.transform(experiment.embeddings.queries(experiment.split.test))
    docs = loaded.transform(experiment.embeddings.doc_embeddings)
    D_plan, I_plan = QuantizedIndex.build(docs, precision, calibration=calibration).search(queries, 10)
    D_index, I_index = index.search(queries, 10)
    np.testing.assert_array_equal(I_plan, I_index)
    np.testing.assert_allclose(D_plan, D_index, rtol=1e-5, atol=1e-6)
