"""`compress fit` / fit_on_all and `compress train --protocol beir-train`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.compress import load_compressor
from embedtune.workflows.fit import fit_on_all, supported_paths
from embedtune.workflows.train_compressor import UNTRAINED_WON, training_notes

from conftest import write_beir

DIM = 24


@pytest.fixture
def own(tmp_path):
    """Clustered random vectors (float64, as from an API), ids and a pairs file; no texts anywhere."""
    rng = np.random.default_rng(0)
    topics = rng.normal(size=(6, DIM))
    docs = topics[np.arange(120) % 6] + 0.6 * rng.normal(size=(120, DIM))
    relevant = [rng.choice(np.flatnonzero(np.arange(120) % 6 == q % 6), 2, replace=False) for q in range(30)]
    queries = np.stack([docs[rel].mean(0) + 0.2 * rng.normal(size=DIM) for rel in relevant])
    np.save(tmp_path / "docs.npy", docs)
    np.save(tmp_path / "queries.npy", queries.astype(np.float32))
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(120)))
    (tmp_path / "queries.txt").write_text("".join(f"q{i}\n" for i in range(30)))
    (tmp_path / "pairs.tsv").write_text("".join(f"q{q}\td{d}\n" for q, rel in enumerate(relevant) for d in rel))
    return tmp_path


def vectors(folder, queries=True):
    paths = {"doc_embeddings": folder / "docs.npy", "doc_ids": folder / "docs.txt"}
    if queries:
        paths.update(query_embeddings=folder / "queries.npy", query_ids=folder / "queries.txt")
    return paths


def test_supervised_fit_on_all_own_vectors_writes_one_compressor(own, one_torch_thread):
    out = own / "fit"
    result = fit_on_all("mrl-adaptor", 8, labels=own / "pairs.tsv", out=out, settings={"epochs": 2, "unsupervised_epochs": 1},
                        **vectors(own))
    assert result.path == "supervised" and "supervised path" in result.notes[0]
    info = json.loads((out / "fit.json").read_text())
    assert info["labels"] == {"source": str(own / "pairs.tsv"), "queries": 30, "train_queries": 30}
    assert info["provenance"]["model"] == "precomputed" and set(info["provenance"]["vectors"]) == {
        "docs.npy", "docs.txt", "queries.npy", "queries.txt"}
    # The safety net by default: filtered, capped triplets, PCA start, best epoch (held out, then refit on all).
    assert info["preset"] == "robust" and info["config"]["init"] == "pca" and info["config"]["epoch_selection"] == "best"
    assert info["triplets"]["false_negative_margin"] == 0.05 and info["selected_epoch"] is not None
    loaded = load_compressor(out)  # OUT holds the compressor itself
    docs = np.load(own / "docs.npy")
    np.testing.assert_allclose(loaded.transform(docs), result.compressor.transform(docs), atol=1e-6)


def test_val_fraction_holds_queries_out_for_selection_only(own, one_torch_thread):
    result = fit_on_all("search-adaptor", 8, labels=own / "pairs.tsv", val_fraction=0.3, settings={"epochs": 2}, **vectors(own))
    assert result.info["val"] == {"fraction": 0.3, "queries": 9, "rule": "whole groups of queries that share positives"}
    assert result.info["labels"]["train_queries"] == 21
    assert result.compressor.config.epoch_selection == "val" and result.compressor.selected_epoch_ is not None


def test_val_split_file(own, one_torch_thread):
    (own / "val.tsv").write_text("q0\td0\nq1\td1\n")
    result = fit_on_all("dive", 8, labels=own / "pairs.tsv", val_split=own / "val.tsv", settings={"epochs": 2, "progress": False},
                        **vectors(own))
    assert result.info["val"]["queries"] == 2 and result.info["labels"]["train_queries"] == 28
    assert result.compressor.config.epoch_selection == "val"


def test_a_val_split_whose_positives_lack_vectors_is_refused(own, capsys):
    """The defect: such a split was accepted, and selection scored against positives it could never retrieve."""
    (own / "val.tsv").write_text("q0\td0\nq1\td1\nq1\td999\n")
    assert main(["compress", "fit", "--method", "dive", "--dim", "8", "--pairs", str(own / "pairs.tsv"), "--val-split", str(own / "val.tsv"),
                 *[f for key, path in vectors(own).items() for f in (f"--{key.replace('_', '-')}", str(path))],
                 "--epochs", "1", "--out", str(own / "fit")]) == 2
    err = capsys.readouterr().err
    assert f"{own / 'docs.txt'}: no vector for document 'd999', which {own / 'val.tsv'} uses (1 documents missing)" in err


def test_corpus_alone_takes_the_unsupervised_path(own):
    result = fit_on_all("pca", 8, **vectors(own, queries=False))
    assert result.path == "unsupervised" and result.info["documents"] == 120 and "unsupervised path" in result.notes[0]
    # An unsupervised method given labels says it reads none.
    assert "reads no labels" in " ".join(fit_on_all("pca-uncentred", 8, labels=own / "pairs.tsv", **vectors(own)).notes)


def test_a_supervised_only_method_without_labels_lists_the_unsupervised_ones(own):
    with pytest.raises(ValueError, match="supervised-only and no labels were given.*pca, pca-uncentred"):
        fit_on_all("smec", 8, **vectors(own, queries=False))
    assert supported_paths("pca") == ["unsupervised"] and "supervised" in supported_paths("dive")


def test_untrained_start_is_said_plainly():
    assert UNTRAINED_WON in training_notes("dive", [0])[0] and "every seed" in training_notes("dive", [0, 0])[0]
    assert "1 of 2 seeds" in training_notes("dive", [0, 4])[0] and training_notes("dive", [3]) == [] and training_notes("pca", None) == []


def test_a_beir_corpus_alone_is_encoded_and_fitted_unsupervised(toy40, tiny_bert_dir):
    import shutil

    shutil.rmtree(toy40 / "qrels")
    (toy40 / "queries.jsonl").unlink()  # a corpus and nothing else
    result = fit_on_all("pca", 8, data=toy40, model=str(tiny_bert_dir))
    assert result.path == "unsupervised" and result.info["documents"] == 40
    assert result.info["provenance"]["model"] == str(tiny_bert_dir) and "corpus.jsonl" in result.info["provenance"]["data"]


def test_beir_folder_without_the_split_lists_the_available_ones(toy40):
    with pytest.raises(FileNotFoundError, match=r"no qrels/train.tsv to fit on; available splits: \['test'\]"):
        fit_on_all("dive", 8, data=toy40)


def test_compress_train_own_vectors_records_precomputed(own, tmp_path, capsys, one_torch_thread):
    args = ["compress", "train", "--method", "pca", "--dim", "8", "--doc-embeddings", str(own / "docs.npy"), "--doc-ids",
            str(own / "docs.txt"), "--query-embeddings", str(own / "queries.npy"), "--query-ids", str(own / "queries.txt"),
            "--pairs", str(own / "pairs.tsv"), "--final", "--compare", "frozen", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    assert "/ precomputed:" in capsys.readouterr().out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    report = results["details"]
    assert report["model"] == "precomputed" and results["model"]["name"] == "precomputed"
    assert set(results["model"]["vectors"]) == {"docs.npy", "docs.txt", "queries.npy", "queries.txt"}


def test_compress_fit_cli(own, capsys, one_torch_thread):
    args = ["compress", "fit", "--method", "search-adaptor", "--dim", "8", "--doc-embeddings", str(own / "docs.npy"), "--doc-ids",
            str(own / "docs.txt"), "--query-embeddings", str(own / "queries.npy"), "--query-ids", str(own / "queries.txt"),
            "--pairs", str(own / "pairs.tsv"), "--epochs", "2", "--out", str(own / "cli")]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "search-adaptor: supervised path" in printed and "(precomputed)" in printed and "fit.json" in printed
    assert main(["compress", "fit", "--method", "smec", "--dim", "8", "--doc-embeddings", str(own / "docs.npy"), "--doc-ids",
                 str(own / "docs.txt"), "--out", str(own / "none")]) != 0
    assert "pick a method that fits without labels" in capsys.readouterr().err


@pytest.fixture
def beir_train_folder(tmp_path):
    """A BEIR folder with disjoint train (24 queries) and test (16 queries) qrels; 4 topics."""
    corpus = [{"_id": f"d{i}", "text": f"document number {i} about topic {i % 4}"} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": f"what about topic {i % 4} number {i}"} for i in range(40)]
    root = write_beir(tmp_path / "bt", corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(24)], split="train")
    write_beir(root, corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(24, 40)], split="test")
    return root


def test_compress_train_beir_train_scores_all_test_queries_with_paired_tests(beir_train_folder, tiny_bert_dir, tmp_path, capsys,
                                                                             one_torch_thread):
    args = ["compress", "train", "--method", "dive", "--dim", "8", "--data", str(beir_train_folder), "--model", str(tiny_bert_dir),
            "--protocol", "beir-train", "--preset", "best", "--set", "epoch_selection=best", "--epochs", "2",
            "--set", "batch_size=8", "--compare", "frozen", "pca", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "run" / "results.json").read_text())["details"]
    assert report["n_queries"] == 16 and report["queries"] == "all judged test" and report["protocol"] == "beir-train"
    assert set(report["comparisons"]) == {"frozen", "pca", "pca-uncentred"}  # the other PCA variant is added
    assert report["comparisons"]["pca"]["n_queries"] == 16 and 0 < report["comparisons"]["pca"]["p_value"] <= 1
    assert report["gain_over_pca"]["baseline"] in ("pca", "pca-uncentred")
    assert report["results"]["dive"]["summary"]["selected_epochs"] is not None
    rows = {row["method"]: row for row in json.loads((tmp_path / "run" / "results.json").read_text())["rows"]}
    assert rows["dive"]["selected_epochs"] == report["results"]["dive"]["summary"]["selected_epochs"] and "selected_epochs" not in rows["pca"]
    assert "the stronger PCA variant" in printed and "Δ dive (p)" in printed and "± 0.0000" not in printed
