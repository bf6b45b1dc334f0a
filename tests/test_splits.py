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
