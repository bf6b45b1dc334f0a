import hashlib
import json

import pytest

from conftest import write_beir
from embedtune.data import load_beir, query_disjoint_split


@pytest.fixture
def hundred(tmp_path):
    corpus = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(100)]
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(103)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(100)]  # q100..q102 are unjudged
    return write_beir(tmp_path / "h", corpus, queries, qrels)


def test_fractions_disjoint_and_complete(hundred):
    split = query_disjoint_split(load_beir(hundred))
    assert (len(split.train), len(split.val), len(split.test)) == (60, 20, 20)
    parts = [set(split.train), set(split.val), set(split.test)]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert set().union(*parts) == {f"q{i}" for i in range(100)}


def test_rank_rule_is_sha256_of_seed_and_id(hundred):
    split = query_disjoint_split(load_beir(hundred), seed=7)
    expected = sorted((f"q{i}" for i in range(100)), key=lambda q: hashlib.sha256(f"7:{q}".encode()).hexdigest())
    assert split.train + split.val + split.test == expected


def test_custom_fractions_and_seed_change_split(hundred):
    ds = load_beir(hundred)
    split = query_disjoint_split(ds, (0.5, 0.25, 0.25), seed=1)
    assert (len(split.train), len(split.val), len(split.test)) == (50, 25, 25)
    assert split.train != query_disjoint_split(ds, (0.5, 0.25, 0.25), seed=2).train


def test_bad_fractions(hundred):
    with pytest.raises(ValueError, match="summing to 1"):
        query_disjoint_split(load_beir(hundred), (0.6, 0.3, 0.3))


def test_manifest_byte_identical_on_rerun(hundred, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    query_disjoint_split(load_beir(hundred)).save(a)
    query_disjoint_split(load_beir(hundred)).save(b)
    assert a.read_bytes() == b.read_bytes()
    manifest = json.loads(a.read_text())
    assert manifest["seed"] == 2027 and manifest["counts"] == {"train": 60, "val": 20, "test": 20}
    assert set(manifest["source_sha256"]) == {"corpus.jsonl", "queries.jsonl", "qrels/test.tsv"}


def test_fingerprint_changes_when_data_changes(hundred, tmp_path):
    before = query_disjoint_split(load_beir(hundred)).manifest()["source_sha256"]
    with open(hundred / "corpus.jsonl", "a") as handle:
        handle.write('{"_id": "extra", "text": "new"}\n')
    after = query_disjoint_split(load_beir(hundred)).manifest()["source_sha256"]
    assert before["corpus.jsonl"] != after["corpus.jsonl"]
    assert before["queries.jsonl"] == after["queries.jsonl"]


def test_scifact_split_sizes():
    split = query_disjoint_split(load_beir("scifact"))
    assert (len(split.train), len(split.val), len(split.test)) == (180, 60, 60)
    assert split.train_val == split.train + split.val


@pytest.fixture
def with_train_qrels(tmp_path):
    corpus = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(60)]
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(60)]
    root = write_beir(tmp_path / "bt", corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(40, 60)], split="test")
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t1" for i in range(40)]
    (root / "qrels" / "train.tsv").write_text("\n".join(lines) + "\n")
    return root


def test_beir_train_protocol_splits_train_qrels_and_tests_on_all_test_queries(with_train_qrels):
    from embedtune.data.splits import train_qrels_split

    split = train_qrels_split(load_beir(with_train_qrels, "train"), load_beir(with_train_qrels, "test"), 0.2, seed=7)
    assert (len(split.train), len(split.val), len(split.test)) == (32, 8, 20)
    assert set(split.train + split.val) == {f"q{i}" for i in range(40)}
    assert set(split.test) == {f"q{i}" for i in range(40, 60)}
    assert not set(split.train) & set(split.val)
    expected_val = sorted((f"q{i}" for i in range(40)), key=lambda q: hashlib.sha256(f"7:{q}".encode()).hexdigest())[:8]
    assert split.val == expected_val
    assert split.qrels_split == "train+test"
    assert split == train_qrels_split(load_beir(with_train_qrels, "train"), load_beir(with_train_qrels, "test"), 0.2, seed=7)


def test_beir_train_protocol_rejects_queries_judged_in_both_files(with_train_qrels):
    from embedtune.data.splits import train_qrels_split

    (with_train_qrels / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq45\td2\t1\n")
    with pytest.raises(ValueError, match="judged in both"):
        train_qrels_split(load_beir(with_train_qrels, "train"), load_beir(with_train_qrels, "test"))


def test_load_experiment_beir_train_merges_qrels(with_train_qrels):
    import numpy as np

    from embedtune.workflows.experiment import load_experiment

    rng = np.random.default_rng(0)
    d = with_train_qrels
    np.save(d / "docs.npy", rng.standard_normal((60, 8)).astype(np.float32))
    np.save(d / "queries.npy", rng.standard_normal((60, 8)).astype(np.float32))
    (d / "doc_ids.json").write_text(json.dumps([f"d{i}" for i in range(60)]))
    (d / "query_ids.json").write_text(json.dumps([f"q{i}" for i in range(60)]))
    experiment = load_experiment(
        d, protocol="beir-train", doc_embeddings=d / "docs.npy", doc_ids=d / "doc_ids.json",
        query_embeddings=d / "queries.npy", query_ids=d / "query_ids.json",
    )
    assert len(experiment.part_ids("test")) == 20 and len(experiment.part_ids("train+val")) == 40
    assert experiment.qrels_for(["q3", "q50"]) == {"q3": {"d3": 1}, "q50": {"d50": 1}}
    assert experiment.evaluate("test").n_queries == 20
    with pytest.raises(ValueError, match="protocol"):
        load_experiment(d, protocol="nope")


@pytest.fixture
def shared_positives(tmp_path):
    """40 queries: q0..q9 all judge d0 (one group of 10), q10..q19 in pairs sharing a document, q20..q39 alone.

    One grade-0 judgment links q39 to d0: it is not a positive, so q39 stays alone.
    """
    corpus = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(41)]  # q40 is unjudged
    qrels = [(f"q{i}", "d0", 1) for i in range(10)] + [(f"q{i}", f"d{i}", 2) for i in range(1, 10)]
    qrels += [(f"q{i}", f"d{10 + (i - 10) // 2}", 1) for i in range(10, 20)]
    qrels += [(f"q{i}", f"d{i}", 1) for i in range(20, 40)] + [("q39", "d0", 0)]
    return write_beir(tmp_path / "sp", corpus, queries, qrels)


def test_positive_components_follow_shared_positives_only():
    from embedtune.data.splits import positive_components

    qrels = {"a": {"d1": 1}, "b": {"d1": 1, "d2": 1}, "c": {"d2": 3}, "e": {"d9": 1}, "f": {"d1": 0, "d8": 1}}
    assert positive_components(qrels, ["e", "c", "a", "f", "b"]) == [["e"], ["c", "a", "b"], ["f"]]  # the given order, kept
    assert positive_components(qrels, ["a", "a", "g"]) == [["a"], ["g"]]  # repeated ids once; a query without judgments alone


def test_positive_disjoint_folds_test_every_query_once_on_unseen_positives(shared_positives):
    from embedtune.data.splits import positive_disjoint_folds

    dataset = load_beir(shared_positives)
    folds = positive_disjoint_folds(dataset, n_folds=4, seed=7)
    judged = set(dataset.judged_query_ids())
    assert len(judged) == 40
    tested = [q for split in folds for q in split.test]
    assert sorted(tested) == sorted(judged)  # every judged query is tested exactly once
    for i, split in enumerate(folds):
        assert split.fold == (i, 4)
        assert set(split.train) | set(split.val) | set(split.test) == judged
        assert not (set(split.train) & set(split.val) or set(split.train_val) & set(split.test))
        positives = lambda ids: {d for q in ids for d, g in dataset.qrels[q].items() if g > 0}  # noqa: E731
        assert not positives(split.test) & positives(split.train_val)  # no test positive was trained on
        assert not positives(split.val) & positives(split.train)
        group_of_ten = {f"q{i}" for i in range(10)}
        assert group_of_ten <= set(split.test) or group_of_ten <= set(split.train) or group_of_ten <= set(split.val)
    assert sorted(len(s.test) for s in folds) == [10, 10, 10, 10]  # the group of 10 fills one fold, the rest balance
    manifest = folds[1].manifest()
    assert (manifest["fold"], manifest["n_folds"]) == (1, 4) and "fold_rule" in manifest
    assert "fold" not in query_disjoint_split(dataset).manifest()  # a single split's manifest is unchanged


def test_positive_disjoint_folds_are_deterministic_and_seeded(shared_positives):
    from embedtune.data.splits import positive_disjoint_folds

    dataset = load_beir(shared_positives)
    first = positive_disjoint_folds(dataset, 4, seed=7)
    assert [s.manifest() for s in first] == [s.manifest() for s in positive_disjoint_folds(load_beir(shared_positives), 4, seed=7)]
    assert [s.test for s in first] != [s.test for s in positive_disjoint_folds(dataset, 4, seed=8)]


def test_positive_disjoint_folds_refuse_impossible_requests(shared_positives, hundred):
    from embedtune.data.splits import positive_disjoint_folds

    with pytest.raises(ValueError, match="at least 2"):
        positive_disjoint_folds(load_beir(hundred), n_folds=1)
    with pytest.raises(ValueError, match="val_fraction"):
        positive_disjoint_folds(load_beir(hundred), val_fraction=1.0)
    tiny = load_beir(shared_positives)
    tiny.qrels = {q: tiny.qrels[q] for q in [f"q{i}" for i in range(10)] + ["q20"]}  # two groups
    with pytest.raises(ValueError, match=r"form 2 groups .* at most 2 folds"):
        positive_disjoint_folds(tiny, n_folds=3)


def test_fold_experiments_pool_beir_train_qrels(with_train_qrels):
    from embedtune.workflows.experiment import Experiment, fold_experiments
    from embedtune.data.splits import train_qrels_split

    train, test = load_beir(with_train_qrels, "train"), load_beir(with_train_qrels, "test")
    split = train_qrels_split(train, test, 0.2, seed=7)
    test.qrels = {**train.qrels, **test.qrels}
    experiment = Experiment(dataset=test, embeddings=None, split=split)  # type: ignore[arg-type]
    folds = fold_experiments(experiment, n_folds=5, seed=7)
    assert sorted(q for f in folds for q in f.part_ids("test")) == sorted(f"q{i}" for i in range(60))
    assert all(f.split.qrels_split == "train+test" and "qrels/train.tsv" in f.split.fingerprints for f in folds)
    assert all(f.dataset is experiment.dataset for f in folds)
    assert experiment.split is split  # the experiment itself keeps its split
