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
