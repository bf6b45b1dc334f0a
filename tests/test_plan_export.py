"""A plan exports as a sentence-transformers folder that carries its precision, and encodes new texts as deployed.

``export_plan`` (``compress export --plan``) ships the int8 ranges or the trained FAISS tables
(int4, RaBitQ, TurboQuant) in ``OUT/embedtune_precision/``; ``DeployedCodec.load(OUT).encode``
then gives the codes the plan scored, batch by batch with the same parameters, and
``index build --plan`` stores vectors with the same trained tables.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.compress import make_compressor
from embedtune.index import load_index
from embedtune.index.codecs import CODEC_FILE, PRECISION_SUBFOLDER, Calibration, DeployedCodec, Precision, QuantizedIndex
from embedtune.index.plan_export import export_plan, plan_codec
from embedtune.index.plan_format import PLAN_FILE, load_plan, write_plan
from embedtune.index.planned import build_planned_index
from embedtune.io import IntegrityError, read_json_verified, sha256_file, write_json_with_digest

TEXTS = [f"document number {i} about topic" for i in range(40)]
NEW_TEXTS = ["what title 3", "topic 12 number", "about what document 7", "title"]


@pytest.fixture(scope="module")
def corpus(tiny_bert_dir):
    """The tiny model's embeddings of 40 texts, spread by noise so every direction has variance, and a PCA-16 fitted on them."""
    from sentence_transformers import SentenceTransformer

    base = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    rng = np.random.default_rng(0)
    docs = base.encode(TEXTS)
    docs = (docs + 0.5 * np.std(docs) * rng.standard_normal(docs.shape)).astype(np.float32)
    return base, docs, make_compressor("pca", dim=16).fit_unsupervised(docs)


def _plan(tmp_path, corpus, precision: str):
    _, docs, compressor = corpus
    out = tmp_path / f"plan-{precision}"
    write_plan(out, compressor, Precision(precision), docs, {"chosen": {"setting": f"pca-16/{precision}"}})
    return out


@pytest.mark.parametrize("precision", ["int8", "int4", "rabitq1", "rabitq4", "turboquant4", "binary-asym", "float16"])
def test_the_exported_folder_encodes_as_the_plan_scored(tmp_path, corpus, tiny_bert_dir, precision):
    from sentence_transformers import SentenceTransformer

    base, docs, compressor = corpus
    plan = _plan(tmp_path, corpus, precision)
    assert ((plan / CODEC_FILE).is_file()) == Precision(precision).uses_factory
    out = export_plan(plan, str(tiny_bert_dir), tmp_path / "model")
    model = SentenceTransformer(str(out), device="cpu")  # plain s-t: the precision subfolder is ignored
    codec = DeployedCodec.load(out)
    assert codec.precision.name == precision and codec.dim == 16
    embeddings = model.encode(NEW_TEXTS)
    codes = codec.encode(embeddings)
    # The plan's own index (what it scored), built on the corpus through the compressor: the same codes.
    scored = DeployedCodec.from_index(QuantizedIndex.build(compressor.transform(docs), precision))
    np.testing.assert_array_equal(codes, scored.encode(embeddings))
    # One text at a time: the same codes (nothing is refitted per batch, unlike quantize_embeddings' ranges).
    np.testing.assert_array_equal(np.concatenate([codec.encode(embeddings[i : i + 1]) for i in range(len(NEW_TEXTS))]), codes)
    if precision == "int8":
        saved = Calibration.load(out / PRECISION_SUBFOLDER / "calibration.safetensors")
        assert np.array_equal(saved.vmin, load_plan(plan)[3].vmin)
        index = QuantizedIndex.build(compressor.transform(docs), "int8", calibration=saved)
        np.testing.assert_array_equal(codes, index.backend.sa_encode(np.ascontiguousarray(embeddings)))  # FAISS SQ8's codes
    if Precision(precision).uses_factory:
        assert codes.shape == (len(NEW_TEXTS), codec.code_size) and codes.dtype == np.uint8


@pytest.mark.parametrize("precision", ["int4", "rabitq1-rescore", "faiss:PQ4x4fs"])
def test_index_build_plan_uses_the_planned_faiss_tables(tmp_path, corpus, precision):
    import faiss

    _, docs, compressor = corpus
    plan = _plan(tmp_path, corpus, precision)
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(len(docs))))
    index = load_index(build_planned_index(tmp_path / "docs.npy", tmp_path / "index", plan, ids=tmp_path / "ids.txt"))
    assert index.manifest["plan"]["codec"] == CODEC_FILE
    trained = faiss.clone_index(index.faiss_index)
    trained.reset()
    planned = plan_codec(plan).trained_index
    assert np.array_equal(faiss.serialize_index(trained), faiss.serialize_index(planned))
    xq = compressor.transform(docs[:5])
    D_plan, I_plan = QuantizedIndex.build(compressor.transform(docs), precision).search(xq, 10)
    D_index, I_index = index.search(xq, 10)
    np.testing.assert_array_equal(I_plan, I_index)


def test_export_plan_cli_and_refusals(tmp_path, corpus, tiny_bert_dir, capsys):
    plan = _plan(tmp_path, corpus, "rabitq1")
    assert main(["compress", "export", "--plan", str(plan), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / PRECISION_SUBFOLDER / CODEC_FILE).is_file()
    assert DeployedCodec.load(tmp_path / "m").precision.name == "rabitq1"
    # A PQ/OPQ peer (faiss:FACTORY) ships its tables too: the ones the plan trained on the corpus (the README's
    # 48-byte plan chose one on a slice of SciFact, and exporting it failed).
    faiss_plan = _plan(tmp_path, corpus, "faiss:PQ4x4fs")  # 16 centroids: the 40 toy documents train it
    assert (faiss_plan / CODEC_FILE).is_file()
    assert main(["compress", "export", "--plan", str(faiss_plan), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "m2")]) == 0
    pq = DeployedCodec.load(tmp_path / "m2")
    _, docs, compressor = corpus
    assert pq.precision.name == "faiss:PQ4x4fs" and pq.code_size == 2
    np.testing.assert_array_equal(pq.encode(compressor.transform(docs[:3])), plan_codec(faiss_plan).encode(compressor.transform(docs[:3])))
    # A plan written before plans kept a PQ peer's tables: refused with the fix, nothing exported.
    (faiss_plan / CODEC_FILE).unlink()
    old_precision, _ = read_json_verified(faiss_plan / "precision.json", "")
    (faiss_plan / "precision.json").write_text(json.dumps({k: v for k, v in old_precision.items() if k != "files_sha256"}))
    info, _ = read_json_verified(faiss_plan / PLAN_FILE, "")
    write_json_with_digest(faiss_plan / PLAN_FILE, {**info, "files_sha256": {
        **{k: v for k, v in info["files_sha256"].items() if k != CODEC_FILE}, "precision.json": sha256_file(faiss_plan / "precision.json")}})
    with pytest.raises(FileNotFoundError, match=r"needs codec\.faiss .*write the plan again"):
        export_plan(faiss_plan, str(tiny_bert_dir), tmp_path / "m4")
    assert not (tmp_path / "m4").exists()
    # An edited codec.faiss is not the plan's: refused before anything is exported.
    (plan / CODEC_FILE).write_bytes((plan / CODEC_FILE).read_bytes()[:-1] + b"\x00")
    with pytest.raises(IntegrityError, match=CODEC_FILE):
        export_plan(plan, str(tiny_bert_dir), tmp_path / "m3")
    assert (plan / PLAN_FILE).is_file() and not (tmp_path / "m3").exists()
    # The codec refuses vectors of another width, naming the fix.
    with pytest.raises(ValueError, match="16-d vectors"):
        DeployedCodec.load(tmp_path / "m").encode(np.zeros((2, 32), np.float32))


def test_plan_export_index_database_round_trip(tmp_path, tiny_bert_dir):
    """``compress plan`` → ``compress export --plan`` → ``index build --plan`` → LanceDB: one deployment, the same top-10 everywhere."""
    lancedb = pytest.importorskip("lancedb")  # noqa: F841
    from sentence_transformers import SentenceTransformer

    from conftest import write_beir
    from embedtune.index.codecs import binary_codes
    from embedtune.index.lancedb_store import lancedb_recipe_of, load_plan_into_lancedb, search_lancedb
    from embedtune.workflows.experiment import load_experiment
    from embedtune.workflows.plan import run_plan

    base = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    doc_texts = [f"document number {i} about topic {i % 5}" for i in range(60)]
    query_texts = [f"what title {i} about topic {i % 5}" for i in range(40)]
    doc_ids, query_ids = [f"d{i}" for i in range(60)], [f"q{i}" for i in range(40)]
    root = write_beir(tmp_path / "data", [{"_id": d, "text": t} for d, t in zip(doc_ids, doc_texts)],
                      [{"_id": q, "text": t} for q, t in zip(query_ids, query_texts)], [(q, f"d{i}", 1) for i, q in enumerate(query_ids)])
    for name, ids, texts in (("doc", doc_ids, doc_texts), ("query", query_ids, query_texts)):
        np.save(tmp_path / f"{name}.npy", base.encode(texts, normalize_embeddings=True))
        (tmp_path / f"{name}.txt").write_text("".join(i + "\n" for i in ids))
    experiment = load_experiment(root, doc_embeddings=tmp_path / "doc.npy", doc_ids=tmp_path / "doc.txt",
                                 query_embeddings=tmp_path / "query.npy", query_ids=tmp_path / "query.txt")
    plan = tmp_path / "plan"
    info = run_plan(experiment, plan, budget_bytes=2, methods=["pca"], dims=[16], precisions=["binary-rescore"], peers=[], rounds=1,
                    allow_disk=True)  # binary-rescore reads float32 vectors from disk: chosen only when allowed
    assert info["chosen"]["setting"] == "pca-16/binary-rescore" and info["deployment"]["lancedb"]["exact"]
    model_dir = export_plan(plan, str(tiny_bert_dir), tmp_path / "model")
    model = SentenceTransformer(str(model_dir), device="cpu")
    codec = DeployedCodec.load(model_dir)
    compressed_docs = model.encode(doc_texts)
    np.testing.assert_array_equal(codec.encode(compressed_docs), binary_codes(compressed_docs))  # the codes the index stores
    index = load_index(build_planned_index(tmp_path / "doc.npy", tmp_path / "index", plan, ids=tmp_path / "doc.txt"))
    table = load_plan_into_lancedb(plan, np.load(tmp_path / "doc.npy"), doc_ids, tmp_path / "lancedb")
    queries = model.encode(query_texts)  # the exported model compresses the queries
    _, I_index = index.search(queries, 10)
    _, I_lance = search_lancedb(table, lancedb_recipe_of(plan), queries, 10)
    np.testing.assert_array_equal(I_lance, I_index)


def test_a_chosen_peer_is_not_retrained_when_the_plan_is_written(tmp_path, monkeypatch):
    """write_plan reuses the sweep's PQ index for the frozen choice (same tables), and builds its own after any other compressor."""
    rng = np.random.default_rng(3)
    docs = rng.standard_normal((600, 32)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    precision = Precision("faiss:PQ8x4fs")
    swept = QuantizedIndex.build(docs, precision)
    frozen = make_compressor("frozen", dim=32).fit_unsupervised(docs)
    built: list[str] = []
    real_build = QuantizedIndex.build
    monkeypatch.setattr(QuantizedIndex, "build", staticmethod(lambda x, p, *a, **k: built.append(str(p)) or real_build(x, p, *a, **k)))
    reused = tmp_path / "reused"
    write_plan(reused, frozen, precision, docs, {"chosen": {"setting": "frozen-32/faiss:PQ8x4fs"}}, prebuilt=swept)
    assert built == []
    swept.save_precision(tmp_path / "swept")
    assert (reused / CODEC_FILE).read_bytes() == (tmp_path / "swept" / CODEC_FILE).read_bytes()  # the tables the sweep scored
    assert load_plan(reused)[2].name == "faiss:PQ8x4fs"
    # A compressor that changes the vectors, or an index of another precision, never borrows it.
    write_plan(tmp_path / "pca", make_compressor("pca", dim=32).fit_unsupervised(docs), precision, docs, {"chosen": {}}, prebuilt=swept)
    write_plan(tmp_path / "other", frozen, Precision("faiss:PQ16x4fs"), docs, {"chosen": {}}, prebuilt=swept)
    assert len(built) == 2
