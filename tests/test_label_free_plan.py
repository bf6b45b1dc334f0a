"""compress plan --label-free: chosen without labels, on a slice of the bundled SciFact MiniLM vectors.

Agreement (recall@10 of the exact float32 top-10 on held-out documents, or on unlabelled queries)
and pseudo-queries (the held-out documents' titles, each retrieving its own document) choose
among unsupervised compressors, every precision and the peers; nothing is downloaded or encoded
(pseudo-queries are encoded by a stand-in that maps a title near its document's vector).
"""

from __future__ import annotations

import dataclasses
import logging
import inspect
import json
from collections.abc import Mapping
from importlib.resources import files

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.cli.plan import run_plan_command
from embedtune.data.beir import load_beir
from embedtune.data.pseudo_queries import pseudo_query_texts
from embedtune.encoders.dataset import DatasetEmbeddings
from embedtune.index.plan_format import load_plan
from embedtune.workflows.experiment import Experiment
from embedtune.workflows.label_free import (
    LABEL_FREE_METHODS,
    agreement_queries,
    exact_top_k,
    held_out_documents,
    label_free_validation,
    run_label_free_plan,
)

N_DOCS, N_QUERIES = 400, 30
FAST_METHODS = [m for m in LABEL_FREE_METHODS if m != "dive"]  # DIVE's unsupervised fit takes minutes; its contract is tested elsewhere
# One codec budget: the default codecs are in every sweep here, but their fits at four budgets would double these tests' time.
SWEEP = {"dims": [64, 32], "precisions": ["float32", "int8", "binary", "binary-rescore", "rabitq1", "int4"], "peers": ["pq-fs", "turboquant"],
         "codec_budgets": (16,), "rounds": 0}


class _TitleEncoder:
    """Stands in for the model: a document's pseudo-query text encodes near that document's vector (seeded noise)."""

    fingerprint = "title-encoder"

    def __init__(self, by_text: dict[str, np.ndarray]) -> None:
        self.by_text = by_text

    def recipe(self, kind):
        return {"kind": kind}

    def encode(self, texts, kind="query"):
        rng = np.random.default_rng(len(texts))
        rows = np.stack([self.by_text[t] for t in texts]) + 0.05 * rng.standard_normal((len(texts), 384)).astype(np.float32)
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


class _PoisonedQrels(Mapping):
    """Qrels that fail the test the moment anything reads them."""

    def __getitem__(self, key):
        raise AssertionError(f"the label-free path read qrels[{key!r}]")

    def __iter__(self):
        raise AssertionError("the label-free path iterated the qrels")

    def __len__(self):
        raise AssertionError("the label-free path counted the qrels")


@pytest.fixture(scope="module")
def scifact_slice():
    bundled = np.load(files("embedtune.datasets") / "scifact-minilm-vectors.npz")
    docs = np.ascontiguousarray(bundled["document"][:N_DOCS], dtype=np.float32)
    doc_ids = [str(i) for i in bundled["document_ids"][:N_DOCS]]
    queries = np.ascontiguousarray(bundled["query"][:N_QUERIES], dtype=np.float32)
    query_ids = [str(i) for i in bundled["query_ids"][:N_QUERIES]]
    dataset = load_beir("scifact", "test")
    dataset.corpus = {doc_id: dataset.corpus[doc_id] for doc_id in doc_ids}
    _, owners, texts = pseudo_query_texts(dataset.corpus, doc_ids, "title")
    row = {doc_id: i for i, doc_id in enumerate(doc_ids)}
    encoder = _TitleEncoder({text: docs[row[owner]] for owner, text in zip(owners, texts)})
    return dataset, DatasetEmbeddings(doc_ids, docs, query_ids, queries, {}, {}), encoder


def _experiment(scifact_slice, poisoned: bool = False) -> Experiment:
    dataset, embeddings, _ = scifact_slice
    if poisoned:
        dataset = dataclasses.replace(dataset, qrels=_PoisonedQrels())
    return Experiment(dataset, embeddings, None, "cosine", {"model": "precomputed"})


def test_held_out_documents_are_hashed_seeded_and_capped():
    ids = [f"d{i}" for i in range(5000)]
    held = held_out_documents(ids, 0.1, 1000, seed=1)
    assert len(held) == 500 and held == [d for d in ids if d in set(held)]  # corpus order
    assert held == held_out_documents(list(reversed(ids)), 0.1, 1000, seed=1)[::-1]  # depends on the ids, not their order
    assert held != held_out_documents(ids, 0.1, 1000, seed=2)
    assert len(held_out_documents(ids, 0.5, 300)) == 300


def test_exact_top_k_against_brute_force_and_never_itself():
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((50, 8)).astype(np.float32)
    xq = xb[[3, 7, 11]]
    I = exact_top_k(xq, xb, 5, exclude=np.array([3, 7, -1]), block=2)
    for q, own in enumerate([3, 7, -1]):
        scores = xb @ xq[q]
        if own >= 0:
            scores[own] = -np.inf
        assert list(I[q]) == list(np.argsort(-scores)[:5])
    assert 11 in I[2] and 3 not in I[0]
    targets = agreement_queries([f"d{i}" for i in range(50)], xb, ["d3", "d7"], xb[[3, 7]], documents=True, k=5)
    assert all(len(t) == 5 and qid not in t for qid, t in targets.judgments.items())


def test_uncentred_pca_is_in_the_label_free_sweep(scifact_slice, tmp_path):
    """Uncentred PCA must be swept: on held-out data it was the setting validation preferred at 16 B."""
    assert {"truncate", "pca", "pca-uncentred"} <= set(LABEL_FREE_METHODS)
    assert inspect.signature(run_label_free_plan).parameters["methods"].default == LABEL_FREE_METHODS
    plan = run_label_free_plan(_experiment(scifact_slice), tmp_path / "plan", "agreement", budget_bytes=16, methods=FAST_METHODS, **SWEEP,
                               work=tmp_path / "work", full_sweep=True)
    settings = {r["setting"] for r in plan["sweep"]}
    assert {"pca-uncentred-32/int4", "pca-uncentred-64/rabitq1", "pca-32/binary-rescore", "truncate-64/int8"} <= settings
    assert {"frozen-384/rabitq1", "frozen-384/int4", "frozen-384/turboquant1", "frozen-384/faiss:PQ32x4fs"} <= settings  # the peers
    frozen = next(r for r in plan["sweep"] if r["setting"] == "frozen-384/float32")
    assert frozen["objective"] == pytest.approx(1.0)  # the uncompressed vectors agree with themselves
    assert plan["chosen"]["ram_bytes"] <= 16 and plan["objective"]["objective"] == "agreement"
    assert plan["objective"]["labels_read"] is False and plan["objective"]["held_out_documents"] == 40
    assert plan["objective"]["fit_documents"] == N_DOCS - 40
    # The CLI's default label-free sweep is the same list.
    assert "LABEL_FREE_METHODS if label_free" in inspect.getsource(run_plan_command)


def test_label_free_plan_never_reads_qrels(scifact_slice, tmp_path):
    """With the qrels poisoned (any read fails) and no split, the plan is the same one."""
    kwargs = dict(budget_bytes=16, methods=["pca", "pca-uncentred"], **SWEEP)
    for objective in ("agreement", "pseudo-queries"):
        encoder = scifact_slice[2]
        clean = run_label_free_plan(_experiment(scifact_slice), tmp_path / f"clean-{objective}", objective, work=tmp_path / "w1",
                                    encoder=encoder, cache=False, **kwargs)
        poisoned = run_label_free_plan(_experiment(scifact_slice, poisoned=True), tmp_path / f"poisoned-{objective}", objective,
                                       work=tmp_path / "w2", encoder=encoder, cache=False, **kwargs)
        assert poisoned["chosen"]["setting"] == clean["chosen"]["setting"]
        assert {r["setting"]: r["objective"] for r in poisoned["sweep"]} == {r["setting"]: r["objective"] for r in clean["sweep"]}
        assert poisoned["compressor_state_sha256"] == clean["compressor_state_sha256"]


def test_pseudo_query_objective_scores_each_title_against_its_own_document(scifact_slice, tmp_path):
    experiment = _experiment(scifact_slice)
    validation = label_free_validation(experiment, "pseudo-queries", encoder=scifact_slice[2], cache=False)
    held = set(validation.held_out)
    assert validation.queries.ids and all(qid.removeprefix("pseudo:") in held for qid in validation.queries.ids)
    assert all(list(t) == [qid.removeprefix("pseudo:")] for qid, t in validation.queries.judgments.items())
    assert not held & set(validation.fit_doc_ids)
    plan = run_label_free_plan(experiment, tmp_path / "plan", "pseudo-queries", target_retention=0.9, methods=["pca-uncentred"],
                               encoder=scifact_slice[2], cache=False, work=tmp_path / "work", **SWEEP)
    recorded = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert recorded["objective"]["objective"] == "pseudo-queries" and recorded["objective"]["queries"].startswith("held-out pseudo-queries")
    assert plan["chosen"]["objective"] >= 0.9 * plan["reference"]["objective"]
    load_plan(tmp_path / "plan")  # a deployable plan folder


def test_agreement_on_unlabelled_queries_fits_every_document(scifact_slice, tmp_path):
    _, embeddings, _ = scifact_slice
    queries = (embeddings.query_ids, embeddings.query_embeddings)
    plan = run_label_free_plan(_experiment(scifact_slice), tmp_path / "plan", "agreement", budget_bytes=48, methods=["pca"], queries=queries,
                               work=tmp_path / "work", **SWEEP)
    assert plan["objective"]["queries"] == "unlabelled queries" and plan["objective"]["fit_documents"] == N_DOCS
    assert plan["objective"]["n_queries"] == N_QUERIES
    with pytest.raises(ValueError, match="agreement"):
        label_free_validation(_experiment(scifact_slice), "pseudo-queries", queries=queries)
    with pytest.raises(ValueError, match="needs relevance labels"):
        run_label_free_plan(_experiment(scifact_slice), tmp_path / "x", "agreement", budget_bytes=48, methods=["search-adaptor"])
    with pytest.raises(ValueError, match="objective must be one of"):
        label_free_validation(_experiment(scifact_slice), "labels")


def test_cli_label_free_plan_reads_only_the_corpus_and_refuses_conflicting_flags(scifact_slice, tmp_path, capsys):
    """The CLI plans from a corpus.jsonl and its vectors alone: no queries, no qrels exist anywhere."""
    root = tmp_path / "vectors"
    root.mkdir()
    dataset, embeddings, _ = scifact_slice
    np.save(root / "docs.npy", embeddings.doc_embeddings)
    (root / "docs.txt").write_text("".join(i + "\n" for i in embeddings.doc_ids))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d, "title": dataset.corpus[d].get("title", ""), "text": dataset.corpus[d]["text"]}) + "\n"
                              for d in embeddings.doc_ids))
    common = ["compress", "plan", "--data", str(corpus), "--doc-embeddings", str(root / "docs.npy"), "--doc-ids", str(root / "docs.txt"),
              "--budget-bytes", "16", "--dims", "32", "--precisions", "binary", "int4", "--peers", "", "--codec-budgets", "16"]
    out = tmp_path / "plan"
    assert main([*common, "--label-free", "agreement", "--methods", "pca", "pca-uncentred", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no labels read" in printed and "chosen:" in printed
    plan = json.loads((out / "plan.json").read_text())
    assert plan["objective"]["objective"] == "agreement" and plan["chosen"]["ram_bytes"] <= 16
    # --final scores the choice on labelled test queries, so it needs them.
    assert main([*common, "--label-free", "agreement", "--methods", "pca", "--final", "--out", str(tmp_path / "y")]) == 2
    capsys.readouterr()
    for extra, message in ((["--label-free", "agreement", "--methods", "dive", "smec"], "needs relevance labels"),
                           (["--label-free", "agreement", "--variants", "qat-binary"], "--variants"),
                           (["--label-free", "pseudo-queries", "--unlabelled-queries", str(root / "q.tsv")], "use --label-free agreement"),
                           (["--unlabelled-queries", str(root / "q.tsv")], "add --label-free"),
                           (["--label-free", "agreement", "--held-out-fraction", "1.5"], "held-out-fraction")):
        assert main([*common, *extra, "--out", str(tmp_path / "x")]) == 2, extra
        assert message in capsys.readouterr().err


def test_a_label_free_plan_on_own_vectors_reads_no_dataset(scifact_slice, tmp_path, monkeypatch):
    """Without --data it names the vectors, not the bundled SciFact, and a folder called scifact where it runs is no dataset."""
    _, embeddings, _ = scifact_slice
    np.save(tmp_path / "mine.npy", embeddings.doc_embeddings)
    (tmp_path / "mine.txt").write_text("".join(i + "\n" for i in embeddings.doc_ids))
    (tmp_path / "scifact").mkdir()  # e.g. an earlier --out scifact: the old default --data resolved to it and failed
    monkeypatch.chdir(tmp_path)
    args = ["compress", "plan", "--label-free", "agreement", "--doc-embeddings", "mine.npy", "--doc-ids", "mine.txt", "--budget-bytes", "16",
            "--dims", "32", "--precisions", "int4", "--peers", "", "--codec-budgets", "16", "--methods", "pca", "--out", "plan"]
    assert main(args) == 0
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["dataset"] == "mine"


def test_a_corpus_smaller_than_a_dimension_leaves_those_projections_out(scifact_slice, tmp_path, caplog):
    """The README in order: 120 documents, 108 fitting, swept at 384 dims failed in PCA; now those cells are left out."""
    dataset, embeddings, encoder = scifact_slice
    keep = embeddings.doc_ids[:120]
    small = DatasetEmbeddings(keep, embeddings.doc_embeddings[:120], embeddings.query_ids, embeddings.query_embeddings, {}, {})
    small_dataset = dataclasses.replace(dataset, corpus={d: dataset.corpus[d] for d in keep})
    experiment = Experiment(small_dataset, small, None, "cosine", {"model": "precomputed"})
    with caplog.at_level(logging.INFO, logger="embedtune.workflows.label_free"):
        plan = run_label_free_plan(experiment, tmp_path / "plan", "agreement", budget_bytes=64, methods=["truncate", "pca-uncentred"],
                                   dims=[384, 64], precisions=["float32", "int8"], peers=[], rounds=1, work=tmp_path / "work",
                                   held_out_fraction=0.1, full_sweep=True)
    settings = {r["setting"] for r in plan["sweep"]}
    fitting = plan["objective"]["fit_documents"]
    assert fitting < 384 and "pca-uncentred-64/int8" in settings and "truncate-64/int8" in settings and "frozen-384/int8" in settings
    assert not any(s.startswith("truncate-384/") for s in settings)  # the uncompressed vectors, scored once, as frozen-384
    assert not any(s.startswith("pca-uncentred-384/") for s in settings)
    assert "pca-uncentred-384 are left out" in caplog.text


def test_the_corpus_is_hashed_once_per_plan_not_once_per_candidate(scifact_slice, tmp_path, monkeypatch):
    """A sweep fits many candidates on one corpus: its vectors are hashed once (plus once for the fitting subset)."""
    from embedtune.workflows import label_free, plan as plan_module

    hashed: list[int] = []
    real = plan_module.vectors_sha256

    def counting(vectors):
        hashed.append(len(vectors))
        return real(vectors)

    monkeypatch.setattr(label_free, "vectors_sha256", counting)
    monkeypatch.setattr(plan_module, "vectors_sha256", counting)
    held: list[tuple[str, bool]] = []
    real_lock = plan_module.exclusive_lock

    def recording_lock(path, waiting=None):
        held.append((str(path), bool(waiting)))
        return real_lock(path, waiting)

    monkeypatch.setattr(plan_module, "exclusive_lock", recording_lock)  # the one sweep engine takes the sweep folder's lock
    kwargs = dict(budget_bytes=16, methods=["pca", "pca-uncentred", "truncate"], **SWEEP)
    first = run_label_free_plan(_experiment(scifact_slice), tmp_path / "plan", "agreement", work=tmp_path / "work", **kwargs)
    assert sorted(hashed) == [N_DOCS - 40, N_DOCS]  # six fits and the FAISS cache, two hashes
    assert held == [(str(tmp_path / "work" / ".lock"), True)]  # one plan at a time in a sweep folder
    # The cached fits are still found by the same keys: a second plan rewrites no fit and chooses the same.
    keys = {path: path.stat().st_mtime_ns for path in (tmp_path / "work").rglob("key.json")}
    assert len(keys) >= 6
    hashed.clear()
    second = run_label_free_plan(_experiment(scifact_slice), tmp_path / "plan2", "agreement", work=tmp_path / "work", **kwargs)
    assert sorted(hashed) == [N_DOCS - 40, N_DOCS]
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / "work").rglob("key.json")} == keys
    assert second["chosen"]["setting"] == first["chosen"]["setting"]
    assert label_free._array_sha(scifact_slice[1].doc_embeddings) == label_free._array_sha(scifact_slice[1].doc_embeddings, real(scifact_slice[1].doc_embeddings))


def test_a_cached_label_free_fit_is_not_reused_once_a_config_default_changes(tmp_path, monkeypatch):
    """The fit's key holds the whole resolved config, defaults included, not only the settings a candidate names."""
    from embedtune.workflows import label_free
    from embedtune.workflows.plan import candidate_for

    docs = np.random.default_rng(0).standard_normal((80, 16)).astype(np.float32)
    ids = [f"d{i}" for i in range(80)]
    candidate = candidate_for("pca", 4)
    first, _ = label_free.fit_label_free(candidate, ids, docs, seed=0, work=tmp_path)
    again, _ = label_free.fit_label_free(candidate, ids, docs, seed=0, work=tmp_path)
    assert again.state_sha256() == first.state_sha256()
    keys = list(tmp_path.rglob("key.json"))
    written = {path: path.stat().st_mtime_ns for path in keys}
    real_build = label_free.build_config

    def other_default(method, dim, seed, overrides=None):
        config = real_build(method, dim, seed, overrides)
        return dataclasses.replace(config, center=not config.center)  # as if the default had changed

    monkeypatch.setattr(label_free, "build_config", other_default)
    label_free.fit_label_free(candidate, ids, docs, seed=0, work=tmp_path)
    assert {path: path.stat().st_mtime_ns for path in keys} != written  # fitted again, under the new key


def test_the_choice_says_when_its_tables_outweigh_the_codes_of_the_corpus():
    from embedtune.cli.plan import tables_said

    # PRQ2x16x8 on SciFact's 5,183 documents: 32 B of codes, 12.6 MB of codebooks.
    said = tables_said({"ram_bytes": 32, "fixed_bytes": 12_583_636, "amortized_bytes": 32 + 12_583_636 / 5183})
    assert "tables (12.6 MB) outweigh its codes on this corpus: 2,460 bytes per vector with their share" in said
    assert "they weigh less than the codes from about 393,239 vectors" in said
    # Tables smaller than the codes (a large corpus), or no tables at all: nothing to say.
    assert tables_said({"ram_bytes": 32, "fixed_bytes": 12_583_636, "amortized_bytes": 32 + 12_583_636 / 1_000_000}) == ""
    assert tables_said({"ram_bytes": 384, "fixed_bytes": 0, "amortized_bytes": 384.0}) == ""
    assert tables_said({"ram_bytes": 32}) == ""
    # A PCA map in front (96 x 384 and its bias) is held once as a codec's rotation is, and counted with the tables:
    # pca-96/int4 on MED's 1,033 documents.
    said = tables_said({"ram_bytes": 48, "fixed_bytes": 0, "transform_bytes": 147_840, "amortized_bytes": 48 + 147_840 / 1033})
    assert "tables (0.148 MB) outweigh its codes on this corpus: 191 bytes per vector with their share" in said
    assert "from about 3,080 vectors" in said
