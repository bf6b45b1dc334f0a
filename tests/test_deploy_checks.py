"""What was scored is what is deployed, and every plan, cache and index file is checked before use.

One test per defect; each printed a wrong number with exit 0 before. Small synthetic vectors (and
the tiny random BERT where a command encodes text); no quality claims.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import write_beir
from embedtune.cli import main
from embedtune.compress import load_compressor, make_compressor
from embedtune.compress.base import TrainingData
from embedtune.index.codecs import Calibration
from embedtune.evaluate.search import unit_rows
from embedtune.index import build_index, load_index
from embedtune.index.planned import build_planned_index
from embedtune.io import IntegrityError, read_json_verified, sha256_file, write_json_with_digest, xxh3_file
from embedtune.workflows.experiment import load_experiment
from embedtune.index.plan_format import load_plan
from embedtune.workflows.plan import run_plan

D = 24


def _toy(tmp_path: Path, seed: int = 0, name: str = "toy") -> tuple[Path, dict[str, tuple[Path, Path]]]:
    """60 docs and 40 queries, 24-d, of very different norms (raw vectors, as a dot-product model or an API gives them)."""
    rng = np.random.default_rng(seed)
    docs = rng.standard_normal((60, D)).astype(np.float32) + 0.5
    targets = rng.permutation(60)[:40]
    queries = docs[targets] + 0.6 * rng.standard_normal((40, D)).astype(np.float32)
    docs *= rng.uniform(0.2, 5.0, size=(60, 1)).astype(np.float32)
    doc_ids, query_ids = [f"d{i}" for i in range(60)], [f"q{i}" for i in range(40)]
    folder = tmp_path / name
    root = write_beir(folder / "beir", [{"_id": i, "text": i} for i in doc_ids], [{"_id": q, "text": q} for q in query_ids],
                      [(q, doc_ids[t], 1) for q, t in zip(query_ids, targets)])
    files = {}
    for kind, ids, vectors in (("doc", doc_ids, docs), ("query", query_ids, queries)):
        np.save(folder / f"{kind}.npy", vectors.astype(np.float32))
        (folder / f"{kind}.txt").write_text("".join(i + "\n" for i in ids))
        files[kind] = (folder / f"{kind}.npy", folder / f"{kind}.txt")
    return root, files


def _experiment(root, files):
    return load_experiment(root, doc_embeddings=files["doc"][0], doc_ids=files["doc"][1],
                           query_embeddings=files["query"][0], query_ids=files["query"][1])


def _vectors_flags(files):
    return ["--doc-embeddings", str(files["doc"][0]), "--doc-ids", str(files["doc"][1])]


# -- fit and deploy are one function -------------------------------------------------------------
def test_compress_apply_and_index_build_feed_a_cosine_fit_unit_rows(tmp_path, capsys):
    _, files = _toy(tmp_path)
    adapter = tmp_path / "A"
    assert main(["compress", "fit", "--method", "pca", "--dim", "8", *_vectors_flags(files), "--out", str(adapter)]) == 0
    compressor = load_compressor(adapter)
    assert compressor.input_normalization_ == "unit"  # fitted on unit rows (cosine), and says so
    raw = np.load(files["doc"][0])
    scored = compressor.transform(unit_rows(raw))  # what fitting and scoring fed it
    assert np.abs(compressor.transform_validated(raw) - scored).max() > 1e-2  # raw rows give other vectors

    assert main(["compress", "apply", "--adapter", str(adapter), "--input", str(files["doc"][0]), "--out", str(tmp_path / "c.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), scored, atol=1e-6)
    np.testing.assert_allclose(compressor.transform(raw), scored, atol=1e-6)

    assert main(["index", "build", "--adapter", str(adapter), "--embeddings", str(files["doc"][0]), "--ids", str(files["doc"][1]),
                 "--out", str(tmp_path / "index")]) == 0
    index = load_index(tmp_path / "index")
    assert index.manifest["adapter"]["input_normalization"] == "unit"
    np.testing.assert_allclose(index.faiss_index.reconstruct_n(0, len(raw)), scored, atol=1e-6)


def test_an_index_built_from_a_plan_holds_the_vectors_the_plan_scored(tmp_path):
    root, files = _toy(tmp_path)
    experiment = _experiment(root, files)  # cosine: the experiment normalises the raw vectors
    out = tmp_path / "plan"
    run_plan(experiment, out, budget_bytes=4 * 8, methods=["pca"], dims=[8], precisions=["float32"], peers=[], rounds=1)
    _, compressor, _, _ = load_plan(out)
    scored = compressor.transform(experiment.embeddings.doc_embeddings)
    index = load_index(build_planned_index(files["doc"][0], tmp_path / "index", out, ids=files["doc"][1]))
    np.testing.assert_allclose(index.faiss_index.reconstruct_n(0, 60), scored, atol=1e-6)


def _raw_32d(tmp_path: Path) -> list[str]:
    """Flags of 32-d raw document vectors (the tiny BERT's width) of very different norms."""
    rng = np.random.default_rng(3)
    np.save(tmp_path / "docs32.npy", (rng.normal(size=(50, 32)) * rng.uniform(0.2, 5, size=(50, 1))).astype(np.float32))
    (tmp_path / "docs32.txt").write_text("".join(f"d{i}\n" for i in range(50)))
    return ["--doc-embeddings", str(tmp_path / "docs32.npy"), "--doc-ids", str(tmp_path / "docs32.txt")]


def test_the_export_normalises_before_a_cosine_fit(tiny_bert_dir, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    adapter, exported = tmp_path / "A", tmp_path / "model"
    assert main(["compress", "fit", "--method", "pca", "--dim", "4", *_raw_32d(tmp_path), "--out", str(adapter)]) == 0
    compressor = load_compressor(adapter)
    assert compressor.input_normalization_ == "unit"
    assert main(["compress", "export", "--adapter", str(adapter), "--model", str(tiny_bert_dir), "--out", str(exported)]) == 0
    texts = ["document number 3 about topic 3", "what about topic 1 number 11"]
    base = SentenceTransformer(str(tiny_bert_dir), device="cpu").encode(texts)
    np.testing.assert_allclose(SentenceTransformer(str(exported), device="cpu").encode(texts), compressor.transform(unit_rows(base)),
                               atol=1e-5)


def test_exported_weights_get_the_permissions_the_umask_allows(tiny_bert_dir, tmp_path, capsys):
    import os

    adapter, exported = tmp_path / "A", tmp_path / "model"
    assert main(["compress", "fit", "--method", "pca", "--dim", "4", *_raw_32d(tmp_path), "--out", str(adapter)]) == 0
    old = os.umask(0o022)
    try:
        assert main(["compress", "export", "--adapter", str(adapter), "--model", str(tiny_bert_dir), "--out", str(exported)]) == 0
    finally:
        os.umask(old)
    modes = {p.relative_to(exported).as_posix(): p.stat().st_mode & 0o777 for p in exported.rglob("*") if p.is_file()}
    assert modes and all(mode == 0o644 for name, mode in modes.items()), modes


# -- search checks the adapter, the index and --top-k ----------------------------------------------
def _pca(X: np.ndarray, dim: int = 8):
    ids = [f"x{i}" for i in range(len(X))]
    return make_compressor("pca", dim=dim).fit(TrainingData(ids, X, ids, X, {}))


def test_search_refuses_an_adapter_refitted_after_index_build(tmp_path, tiny_bert_dir, capsys):
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(50, 32)).astype(np.float32)
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(50)))
    adapter = tmp_path / "A"
    _pca(docs).save(adapter)
    assert main(["index", "build", "--adapter", str(adapter), "--embeddings", str(tmp_path / "docs.npy"), "--ids", str(tmp_path / "ids.txt"),
                 "--model", str(tiny_bert_dir), "--out", str(tmp_path / "index")]) == 0
    search = ["search", "--index", str(tmp_path / "index"), "--json", "document number 3"]
    assert main(search) == 0
    capsys.readouterr()
    _pca(rng.normal(size=(50, 32)).astype(np.float32)).save(adapter)  # refitted in place
    assert main(search) == 2
    err = capsys.readouterr().err
    assert f"{adapter}: its fitted state" in err and "refitted or edited after the index was built" in err and "Fix:" in err
    other = tmp_path / "B"
    _pca(rng.normal(size=(50, 32)).astype(np.float32)).save(other)
    assert main([*search, "--adapter", str(other)]) == 2  # another adapter, named explicitly: refused too
    assert "refitted or edited" in capsys.readouterr().err


@pytest.mark.parametrize("top_k", ["0", "-2"])
def test_search_top_k_below_one_is_refused(tmp_path, top_k, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["search", "--index", str(tmp_path), "--top-k", top_k, "q"])
    assert exit_.value.code == 2 and "--top-k: must be an integer >= 1" in capsys.readouterr().err


def test_an_index_file_that_disagrees_with_its_manifest_is_refused(tmp_path):
    import faiss

    rng = np.random.default_rng(0)
    xb = rng.normal(size=(20, 8)).astype(np.float32)
    folder = build_index_from(tmp_path, xb)
    other = faiss.IndexFlatIP(16)  # from another run: same count, other dimension
    other.add(rng.normal(size=(20, 16)).astype(np.float32))
    faiss.write_index(other, str(folder / "index.faiss"))
    manifest, _ = read_json_verified(folder / "manifest.json", "")
    manifest["xxh3_128"]["index.faiss"] = xxh3_file(folder / "index.faiss")  # digests recomputed: only consistency can tell
    write_json_with_digest(folder / "manifest.json", manifest)
    with pytest.raises(IntegrityError, match=r"index\.faiss: holds 16-d vectors but field 'dim' is 8, which disagrees with .*manifest\.json"):
        load_index(folder)
    other = faiss.IndexFlatIP(8)
    other.add(xb[:10])
    faiss.write_index(other, str(folder / "index.faiss"))
    manifest["xxh3_128"]["index.faiss"] = xxh3_file(folder / "index.faiss")
    write_json_with_digest(folder / "manifest.json", manifest)
    with pytest.raises(IntegrityError, match="holds 10 vectors but field 'ntotal' is 20"):
        load_index(folder)


def build_index_from(tmp_path: Path, xb: np.ndarray, kind: str = "flat") -> Path:
    np.save(tmp_path / "xb.npy", xb)
    return build_index(tmp_path / "xb.npy", tmp_path / "index", ids=[f"d{i}" for i in range(len(xb))], kind=kind)


# -- compress plan: cached fits keyed by their inputs; plan files checked ---------------------------
def test_a_plan_rerun_with_other_vectors_refits(tmp_path, caplog):
    root, files = _toy(tmp_path, seed=0, name="a")
    rng = np.random.default_rng(5)
    other_files = {}
    for kind, (vectors, ids) in files.items():  # the same ids and labels, other vectors
        x = np.load(vectors)
        np.save(tmp_path / f"other-{kind}.npy", (x + 0.5 * np.linalg.norm(x, axis=1, keepdims=True) * rng.normal(size=x.shape) / 5).astype(np.float32))
        other_files[kind] = (tmp_path / f"other-{kind}.npy", ids)
    # One --work folder met by other vectors (the default sweep folder is per data, so it never is).
    options = dict(budget_bytes=4 * 8, methods=["pca"], dims=[8], precisions=["float32"], peers=[], rounds=1, work=tmp_path / "sweep")
    out = tmp_path / "plan"
    run_plan(_experiment(root, files), out, **options)
    with caplog.at_level(logging.WARNING, logger="embedtune.workflows.plan"):
        rerun = run_plan(_experiment(root, other_files), out, **options)  # the same folder, other vectors
    fresh = run_plan(_experiment(root, other_files), tmp_path / "fresh", **{**options, "work": tmp_path / "fresh-sweep"})
    scores = lambda plan: {r["setting"]: r["ndcg@10"] for r in plan["sweep"]}  # noqa: E731
    assert scores(rerun) == scores(fresh)
    assert any("refitting pca-8" in r.getMessage() and "data.doc_embeddings" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="embedtune.workflows.plan"):
        assert scores(run_plan(_experiment(root, other_files), out, **options)) == scores(fresh)  # same inputs: reused
    assert not any("refitting" in r.getMessage() for r in caplog.records)


def test_two_plans_without_work_share_one_sweep_per_data(tmp_path, monkeypatch):
    """The README's second plan (another --out, no --work) reuses the first one's fits; other data gets its own folder."""
    import embedtune.workflows.plan as plan_module

    fits = []
    real_fit = plan_module.fit_compressor
    monkeypatch.setattr(plan_module, "fit_compressor", lambda *a, **k: fits.append(a[1]) or real_fit(*a, **k))
    root, files = _toy(tmp_path)
    options = dict(methods=["pca"], dims=[8], precisions=["float32"], peers=[], rounds=1)
    first = run_plan(_experiment(root, files), tmp_path / "plan-a", budget_bytes=32, **options)
    assert len(fits) == 2  # the sweep's fit on train and the chosen one's refit on train+val
    second = run_plan(_experiment(root, files), tmp_path / "plan-b", budget_bytes=32, final=True, **options)
    assert len(fits) == 2, "the second plan refitted instead of reusing the shared sweep"
    assert {r["setting"]: r["ndcg@10"] for r in second["sweep"]} == {r["setting"]: r["ndcg@10"] for r in first["sweep"]}
    shared = plan_module.default_sweep_dir(plan_module.experiment_fingerprint(_experiment(root, files)))
    assert shared.parent == Path(os.environ["EMBEDTUNE_CACHE"]) / "plan-sweeps" and (shared / "train").is_dir()
    assert not (tmp_path / "plan-a" / "sweep").exists()
    other_root, other_files = _toy(tmp_path / "other", seed=3)
    run_plan(_experiment(other_root, other_files), tmp_path / "plan-c", budget_bytes=32, **options)
    assert len(fits) == 4  # other vectors: a folder of their own, fitted afresh
    assert len(list(shared.parent.iterdir())) == 2


@pytest.fixture
def int8_plan(tmp_path):
    root, files = _toy(tmp_path)
    out = tmp_path / "plan"
    run_plan(_experiment(root, files), out, budget_bytes=8, methods=["pca"], dims=[8], precisions=["int8"], peers=[], rounds=1)
    assert load_plan(out)[2].name == "int8"
    return out, files


def _rewrite_plan(out: Path, **changes) -> None:
    plan, _ = read_json_verified(out / "plan.json", "")
    write_json_with_digest(out / "plan.json", {**plan, **changes})


def test_index_build_plan_refuses_an_edited_plan_file(int8_plan, tmp_path):
    out, files = int8_plan
    build = lambda: build_planned_index(files["doc"][0], tmp_path / "index", out, ids=files["doc"][1])  # noqa: E731
    text = (out / "plan.json").read_text()
    (out / "plan.json").write_text(text.replace('"index_kind": "sq8"', '"index_kind": "flat"'))
    with pytest.raises(IntegrityError, match=r"plan\.json: content sha256 mismatch"):
        build()
    (out / "plan.json").write_text(text)
    _rewrite_plan(out, index_kind="flat")  # edited, its own digest recomputed
    with pytest.raises(IntegrityError, match=r"plan\.json: field 'index_kind' is 'flat' but its precision says 'sq8'"):
        build()
    (out / "plan.json").write_text(text)
    assert not (tmp_path / "index").exists()
    assert load_index(build()).manifest["kind"] == "sq8"


def test_index_build_plan_refuses_edited_int8_ranges_or_precision(int8_plan, tmp_path):
    out, files = int8_plan
    original = Calibration.load(out / "calibration.safetensors")
    Calibration(original.vmin * 2, original.vmax * 2).save(out / "calibration.safetensors")
    with pytest.raises(IntegrityError, match=r"calibration\.safetensors: sha256 mismatch"):
        build_planned_index(files["doc"][0], tmp_path / "index", out, ids=files["doc"][1])
    plan, _ = read_json_verified(out / "plan.json", "")
    precision, _ = read_json_verified(out / "precision.json", "")
    # precision.json records the calibration's sha256 too: an edit that updates plan.json alone is still refused.
    _rewrite_plan(out, files_sha256={**plan["files_sha256"], "calibration.safetensors": sha256_file(out / "calibration.safetensors")})
    with pytest.raises(IntegrityError, match=r"calibration\.safetensors: sha256 mismatch"):
        build_planned_index(files["doc"][0], tmp_path / "index", out, ids=files["doc"][1])
    # With both digests rewritten, the two calibration files still have to agree.
    write_json_with_digest(out / "precision.json", {**precision, "files_sha256": {
        **precision["files_sha256"], "calibration.safetensors": sha256_file(out / "calibration.safetensors")}})
    _rewrite_plan(out, files_sha256={**plan["files_sha256"], "calibration.safetensors": sha256_file(out / "calibration.safetensors"),
                                     "precision.json": sha256_file(out / "precision.json")})
    with pytest.raises(IntegrityError, match=r"calibration\.safetensors: its ranges differ from .*calibration\.json"):
        build_planned_index(files["doc"][0], tmp_path / "index", out, ids=files["doc"][1])
    original.save(out / "calibration.safetensors")
    write_json_with_digest(out / "precision.json", precision)
    _rewrite_plan(out, files_sha256=plan["files_sha256"])
    (out / "precision.json").write_text((out / "precision.json").read_text().replace('"int8"', '"float32"'))
    with pytest.raises(IntegrityError, match=r"precision\.json: sha256 mismatch"):
        build_planned_index(files["doc"][0], tmp_path / "index", out, ids=files["doc"][1])


def test_a_plan_without_digests_is_refused(int8_plan, tmp_path):
    out, files = int8_plan
    plan, _ = read_json_verified(out / "plan.json", "")
    (out / "plan.json").write_text(json.dumps({k: v for k, v in plan.items() if k != "files_sha256"}))
    with pytest.raises(IntegrityError, match=r"plan\.json: field 'content_sha256' is missing"):
        load_plan(out)


def test_a_damaged_cached_faiss_file_is_rebuilt_not_used(tmp_path, caplog):
    import faiss

    root, files = _toy(tmp_path)
    experiment = _experiment(root, files)
    options = dict(budget_bytes=1, methods=["truncate"], dims=[8], precisions=["binary"], peers=["pq-fs"], rounds=1, work=tmp_path / "sweep")
    out = tmp_path / "plan"
    first = run_plan(experiment, out, **options)
    cached = sorted((tmp_path / "sweep" / "frozen-faiss").rglob("*.faiss"))
    assert cached
    peer = lambda plan: {r["setting"]: r["ndcg@10"] for r in plan["sweep"] if "faiss:" in r["setting"]}  # noqa: E731
    # Swapped in from another run: a valid index of the same kind, trained on other vectors.
    swapped = faiss.index_factory(D, "PQ2x4fs", faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(9)
    swapped.train(rng.normal(size=(200, D)).astype(np.float32))
    swapped.add(rng.normal(size=(60, D)).astype(np.float32))
    faiss.write_index(swapped, str(cached[0]))
    with caplog.at_level(logging.WARNING, logger="embedtune.workflows.plan"):
        again = run_plan(experiment, out, **options)
    assert peer(again) == peer(first)
    assert any("not used, it will be rebuilt" in r.getMessage() and "sha256 mismatch" in r.getMessage() for r in caplog.records)
    data = bytearray(cached[0].read_bytes())
    cached[0].write_bytes(bytes(data[: len(data) // 2]))  # truncated
    assert peer(run_plan(experiment, out, **options)) == peer(first)
