"""Seen/unseen subsets, the new-documents protocol and selection memorisation cannot fool."""

from __future__ import annotations

import numpy as np
import pytest

from embedtune.data.beir import BeirDataset
from embedtune.data.new_documents import new_document_queries, withheld_documents, without_documents
from embedtune.data.splits import QuerySplit
from embedtune.data.synthetic_popular import make_popular_documents_dataset
from embedtune.encoders.dataset import DatasetEmbeddings
from embedtune.evaluate.subsets import query_subsets, subset_means, training_positives
from embedtune.workflows.experiment import Experiment
from embedtune.workflows.new_documents import withhold_new_documents
from embedtune.workflows.subset_report import subset_block, subset_lines


def popular_experiment(**options) -> Experiment:
    """The synthetic popular-documents set as an Experiment: train/val from its training queries, test as built."""
    ds = make_popular_documents_dataset(**options)
    dataset = BeirDataset("popular", {d: {"title": "", "text": ""} for d in ds.doc_ids}, {q: "" for q in ds.query_ids},
                          ds.qrels, "test", {"synthetic": "popular"}, "synthetic")
    embeddings = DatasetEmbeddings(ds.doc_ids, ds.doc_emb, ds.query_ids, ds.query_emb, {}, {})
    # Every fifth training query validates, so both parts mix popular and unique queries.
    train = [q for i, q in enumerate(ds.train_ids) if i % 5]
    val = [q for i, q in enumerate(ds.train_ids) if not i % 5]
    split = QuerySplit(train, val, ds.test_ids, 0, (0.6, 0.2, 0.2), "popular", "test", {})
    return Experiment(dataset, embeddings, split)


def test_subsets_follow_the_training_positives():
    train = {"q1": {"d1": 1, "d0": 0}, "q2": {"d2": 2}}
    test = {"t1": {"d1": 1}, "t2": {"d9": 1}, "t3": {"d2": 1, "d8": 1}, "t4": {"d0": 1}, "t5": {"d1": 0}}
    seen = training_positives(train)
    assert seen == {"d1", "d2"}  # a judged non-relevant document is not a training positive
    groups = query_subsets(test, seen)
    assert groups == {"seen": ["t1"], "unseen": ["t2", "t4"], "mixed": ["t3"]}  # t5 has no positive: in no subset
    per_query = {"t1": {"ndcg@10": 1.0, "recall@10": 1.0}, "t2": {"ndcg@10": 0.0, "recall@10": 0.0},
                 "t3": {"ndcg@10": 0.5, "recall@10": 0.5}, "t4": {"ndcg@10": 0.5, "recall@10": 1.0}}
    means = subset_means(per_query, groups)
    assert means["all"] == {"n_queries": 4, "ndcg@10": 0.5, "recall@10": 0.625}
    assert means["seen"]["ndcg@10"] == 1.0 and means["unseen"] == {"n_queries": 2, "ndcg@10": 0.25, "recall@10": 0.5}
    assert means["mixed"]["n_queries"] == 1


def test_subset_block_gives_paired_tests_per_subset_and_says_when_nothing_is_unseen():
    per_query = {"a": {"t1": {"ndcg@10": 1.0, "recall@10": 1.0}, "t2": {"ndcg@10": 0.2, "recall@10": 0.0}},
                 "b": {"t1": {"ndcg@10": 0.5, "recall@10": 1.0}, "t2": {"ndcg@10": 0.4, "recall@10": 1.0}}}
    block = subset_block(per_query, {"t1": {"d1": 1}, "t2": {"d9": 1}}, {"q1": {"d1": 1}}, main="a")
    assert block["counts"] == {"all": 2, "seen": 1, "unseen": 1, "mixed": 0}
    tests = block["comparisons"]["b"]
    assert tests["seen"]["mean_difference"] == pytest.approx(0.5) and tests["unseen"]["mean_difference"] == pytest.approx(-0.2)
    assert tests["all"]["n_queries"] == 2
    text = "\n".join(subset_lines(block))
    assert "unseen" in text and "+0.5000" in text and "-0.2000" in text
    only_seen = subset_block(per_query, {"t1": {"d1": 1}, "t2": {"d1": 1}}, {"q1": {"d1": 1}}, main="a")
    assert "No scored query is unseen" in "\n".join(subset_lines(only_seen))


def test_withheld_documents_are_deterministic_and_sized():
    ids = [f"d{i}" for i in range(1000)]
    first, again = withheld_documents(ids, 0.2, 7), withheld_documents(list(reversed(ids)), 0.2, 7)
    assert first == again and len(first) == 200
    assert withheld_documents(ids, 0.2, 8) != first
    with pytest.raises(ValueError, match="fraction"):
        withheld_documents(ids, 1.0)
    qrels = {"q1": {"a": 1, "b": 1}, "q2": {"a": 1}, "q3": {"b": 1, "c": 0}}
    assert new_document_queries(qrels, ["q1", "q2", "q3"], {"b", "c"}) == ["q3"]
    assert without_documents(qrels, {"b"}) == {"q1": {"a": 1}, "q2": {"a": 1}}  # q3 has no positive left


def test_fitting_never_sees_the_withheld_documents():
    experiment = popular_experiment()
    view = withhold_new_documents(experiment, 0.2, seed=3)
    fit = view.fit
    assert not view.withheld & set(fit.embeddings.doc_ids)
    assert len(fit.embeddings.doc_ids) + len(view.withheld) == len(experiment.embeddings.doc_ids)
    for part in ("train", "val"):
        for qid in fit.part_ids(part):
            assert not view.withheld & set(fit.dataset.qrels[qid]), "a withheld document is still judged for a fitting query"
    assert view.query_ids and all(set(experiment.dataset.qrels[q]) <= view.withheld for q in view.query_ids)
    assert set(view.query_ids) <= set(experiment.split.test)
    # The fit view's doc vectors are the same rows, not re-encoded or reordered.
    rows = {doc: i for i, doc in enumerate(experiment.embeddings.doc_ids)}
    picked = [rows[d] for d in fit.embeddings.doc_ids[:5]]
    np.testing.assert_array_equal(fit.embeddings.doc_embeddings[:5], experiment.embeddings.doc_embeddings[picked])


def _unseen(result, method: str) -> float:
    return result.subsets["methods"][method]["unseen"]["ndcg@10"]


def test_default_selection_keeps_unseen_queries_at_pca_where_static_corpus_memorises():
    """The guarantee on a set with popular documents: the default never trades unseen queries for seen ones.

    Both presets train the same adapter the same way; only what selects the epoch differs. The
    training is made aggressive (no self-limiting, a high learning rate, no distillation) so that
    memorising the popular documents is fast and large, and the set can tell whether selection
    stops it. ``static-corpus`` (selected on queries that share the fit's positives) must fall
    below PCA on unseen queries while rising on seen ones, or the set would prove nothing; the
    default (selected on queries whose positives the fit never sees) must not fall below the
    stronger PCA variant, within 0.005 nDCG@10.
    """
    import warnings

    from embedtune.workflows.train_compressor import fit_compressor

    experiment = popular_experiment(n_style=0, query_noise=2.0, popular_query_noise=2.0)
    aggressive = {"triplet_loss": "softplus", "learning_rate": 1e-2, "geometry_weight": 0.0, "progress": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # softplus is the 'w/o self-limiting' ablation and says so
        default = fit_compressor(experiment, "dive", 16, final=True, compare=["pca", "pca-uncentred"], settings=aggressive)
        static = fit_compressor(experiment, "dive", 16, preset="static-corpus", final=True, settings=aggressive)
    pca_unseen = max(_unseen(default, "pca"), _unseen(default, "pca-uncentred"))
    static_means = static.subsets["methods"]["dive"]
    assert static_means["unseen"]["ndcg@10"] < pca_unseen - 0.01, "the control did not memorise: the set cannot test the guarantee"
    assert static_means["seen"]["ndcg@10"] > default.subsets["methods"]["pca-uncentred"]["seen"]["ndcg@10"]
    assert _unseen(default, "dive") >= pca_unseen - 0.005, (
        f"default DIVE unseen {_unseen(default, 'dive'):.4f} fell below the stronger PCA variant's {pca_unseen:.4f}")
    assert default.subsets["counts"]["unseen"] == 120 and default.subsets["counts"]["seen"] == 60
    # static-corpus says what it trades, by name; the default does not.
    from embedtune.compress.dive import STATIC_CORPUS_WARNING
    assert STATIC_CORPUS_WARNING in static.notes and STATIC_CORPUS_WARNING not in default.notes
    assert "{" not in STATIC_CORPUS_WARNING, "the warning's measured figures are filled in"


def test_disjoint_holdout_shares_no_positive_with_the_fit_part():
    from embedtune.compress.base import TrainingData
    from embedtune.compress.holdout import holdout_split
    from embedtune.data.splits import positive_components

    qrels = {"a": {"d1": 1}, "b": {"d1": 1, "d2": 1}, "c": {"d2": 1}, "d": {"d3": 1}, "e": {"d4": 1}, "f": {"d5": 1, "d0": 0}}
    assert sorted(map(sorted, positive_components(qrels, list(qrels)))) == [["a", "b", "c"], ["d"], ["e"], ["f"]]
    ids = list(qrels)
    docs = [f"d{i}" for i in range(6)]
    triplets = np.array([[i, docs.index(next(d for d, r in qrels[q].items() if r > 0)), 0] for i, q in enumerate(ids)])
    data = TrainingData(ids, np.eye(6, dtype=np.float32), docs, np.eye(6, dtype=np.float32), qrels, triplets)
    for seed in range(20):
        fit, held = holdout_split(data, 0.5, seed)
        fit_queries = {ids[row] for row in np.unique(fit.triplets[:, 0])}
        assert fit_queries and held.query_ids and not fit_queries & set(held.query_ids)
        fit_positives = {d for q in fit_queries for d, r in qrels[q].items() if r > 0}
        assert not fit_positives & {d for q in held.query_ids for d, r in qrels[q].items() if r > 0}
    # One group only: said, and the stated fallback (hash-ranked queries) is used.
    shared = {q: {"d1": 1} for q in ids}
    fit, held = holdout_split(TrainingData(ids, data.query_embeddings, docs, data.doc_embeddings, shared, triplets), 0.5, 0)
    assert len(held.query_ids) == 3


def test_compress_plan_chooses_on_validation_queries_whose_positives_training_never_saw(caplog):
    from embedtune.workflows.plan import MIN_UNSEEN_VALIDATION, selection_view

    experiment = popular_experiment(n_train_unique=200)  # 40 unique validation queries: enough to choose on
    view, record = selection_view(experiment)
    seen = training_positives(experiment.qrels_for(experiment.split.train))
    assert view.split.val and all(not set(experiment.dataset.qrels[q]) & seen for q in view.split.val)
    assert record["n_unseen_val"] == len(view.split.val) < record["n_val"] == len(experiment.split.val)
    assert view.split.train == experiment.split.train and view.split.test == experiment.split.test
    # Too few unseen validation queries: every validation query is kept, and the plan says so.
    import dataclasses
    few = dataclasses.replace(experiment, split=dataclasses.replace(
        experiment.split, val=[q for q in experiment.split.val if set(experiment.dataset.qrels[q]) & seen][:30] + view.split.val[:3]))
    kept, said = selection_view(few)
    assert kept.split.val == few.split.val and str(MIN_UNSEEN_VALIDATION) in said["rule"]
    assert "rewards memorising" in caplog.text


def test_compress_train_new_documents_on_own_vectors_and_pairs(tmp_path, capsys, monkeypatch):
    """The new-documents protocol on the own-data inputs (vectors and a pairs file, the paper split), through the CLI."""
    import json

    from embedtune.cli import main

    ds = make_popular_documents_dataset(n_docs=600, n_popular=6, train_per_popular=6, n_train_unique=40, n_test_seen=10, n_test_unseen=60)
    np.save(tmp_path / "docs.npy", ds.doc_emb)
    np.save(tmp_path / "queries.npy", ds.query_emb)
    (tmp_path / "docs.txt").write_text("".join(f"{d}\n" for d in ds.doc_ids))
    (tmp_path / "queries.txt").write_text("".join(f"{q}\n" for q in ds.query_ids))
    (tmp_path / "pairs.tsv").write_text("".join(f"{q}\t{d}\n" for q, docs in ds.qrels.items() for d in docs))
    monkeypatch.chdir(tmp_path)
    assert main(["--threads", "1", "compress", "train", "--method", "dive", "--dim", "8", "--epochs", "2", "--final",
                 "--doc-embeddings", "docs.npy", "--doc-ids", "docs.txt", "--query-embeddings", "queries.npy", "--query-ids", "queries.txt",
                 "--pairs", "pairs.tsv", "--new-documents", "0.3", "--compare", "frozen", "--out", "run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    block = report["new_documents"]
    assert block["fraction"] == 0.3 and block["n_withheld_documents"] == 180 and block["n_queries"] > 0
    assert set(block["methods"]) == {"dive", "frozen"} and "frozen" in block["comparisons"]
    assert report["subsets"]["counts"]["all"] == report["n_queries"]
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["new_documents"]["n_queries"] == block["n_queries"] and "subsets" in saved
