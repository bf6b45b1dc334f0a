"""Triplet mining: determinism, exclusions, the hard pool, and persistence by id."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.data.errors import DataFormatError
from embedtune.data.triplets import load_triplets, mine_triplets, save_triplets


@pytest.fixture()
def corpus():
    """40 docs, 6 queries; q0's relevant docs and the doc with id "q0" are its nearest neighbours."""
    rng = np.random.default_rng(0)
    doc_ids = [f"d{i:02d}" for i in range(39)] + ["q0"]
    docs = rng.standard_normal((40, 16)).astype(np.float32)
    query_ids = [f"q{i}" for i in range(6)]
    queries = rng.standard_normal((6, 16)).astype(np.float32)
    docs[[1, 2, 39]] = queries[0] + 0.01 * rng.standard_normal((3, 16)).astype(np.float32)
    qrels = {
        "q0": {"d01": 1, "d02": 2, "d03": 0},  # d03 judged non-relevant: a valid negative
        "q1": {"d05": 1},
        "q2": {"d07": 1, "d08": 1},
        "q3": {"d09": 0},  # no positive: no triplet
        "q4": {"missing": 1, "d11": 1},  # a relevant doc absent from the corpus is skipped
        "q9": {"d12": 1},  # not a training query
    }
    return query_ids, queries, doc_ids, docs, qrels


def _as_ids(triplets, query_ids, doc_ids):
    return [(query_ids[q], doc_ids[p], doc_ids[n]) for q, p, n in triplets.tolist()]


@pytest.mark.parametrize("negatives", ["hard", "random"])
def test_mining_is_deterministic_and_seed_dependent(corpus, negatives):
    first = mine_triplets(*corpus, negatives=negatives, seed=2027)
    again = mine_triplets(*corpus, negatives=negatives, seed=2027)
    other = mine_triplets(*corpus, negatives=negatives, seed=2028)
    assert first.dtype == np.int64 and first.shape[1] == 3
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize("negatives", ["hard", "random"])
def test_every_positive_pair_gets_distinct_negatives_with_exclusions(corpus, negatives):
    query_ids, queries, doc_ids, docs, qrels = corpus
    triplets = mine_triplets(query_ids, queries, doc_ids, docs, qrels, n_negatives=4, negatives=negatives)
    ids = _as_ids(triplets, query_ids, doc_ids)
    pairs = {}
    for query_id, positive_id, negative_id in ids:
        pairs.setdefault((query_id, positive_id), []).append(negative_id)
        assert qrels[query_id][positive_id] > 0
        assert qrels[query_id].get(negative_id, 0) <= 0, "a relevant doc was used as a negative"
        assert negative_id != query_id, "a doc with the query's own id was used as a negative"
    expected_pairs = {("q0", "d01"), ("q0", "d02"), ("q1", "d05"), ("q2", "d07"), ("q2", "d08"), ("q4", "d11")}
    assert set(pairs) == expected_pairs
    assert all(len(negs) == 4 == len(set(negs)) for negs in pairs.values())


def test_hard_negatives_come_from_the_top_pool_after_exclusions(corpus):
    query_ids, queries, doc_ids, docs, qrels = corpus
    triplets = mine_triplets(query_ids, queries, doc_ids, docs, qrels, n_negatives=3, negatives="hard", hard_pool=5)
    scores = queries @ docs.T
    for query_row, _, negative_row in triplets.tolist():
        query_id = query_ids[query_row]
        ranked = [row for row in np.argsort(-scores[query_row], kind="stable") if doc_ids[row] != query_id and qrels[query_id].get(doc_ids[row], 0) <= 0]
        assert negative_row in ranked[:5]


def test_mining_ignores_row_order(corpus):
    query_ids, queries, doc_ids, docs, qrels = corpus
    permutation = np.random.default_rng(1).permutation(len(doc_ids))
    shuffled_ids = [doc_ids[i] for i in permutation]
    for negatives in ("hard", "random"):
        base = _as_ids(mine_triplets(query_ids, queries, doc_ids, docs, qrels, negatives=negatives), query_ids, doc_ids)
        moved = _as_ids(mine_triplets(query_ids, queries, shuffled_ids, docs[permutation], qrels, negatives=negatives), query_ids, shuffled_ids)
        assert base == moved


def test_small_corpus_gives_every_allowed_negative_once():
    doc_ids = ["a", "b", "c", "d"]
    docs = np.eye(4, dtype=np.float32)
    triplets = mine_triplets(["q"], docs[:1], doc_ids, docs, {"q": {"a": 1}}, n_negatives=10, negatives="random")
    assert sorted(doc_ids[n] for n in triplets[:, 2]) == ["b", "c", "d"]


def test_invalid_arguments():
    docs = np.eye(3, dtype=np.float32)
    with pytest.raises(ValueError, match="hard.*random"):
        mine_triplets(["q"], docs[:1], ["a", "b", "c"], docs, {}, negatives="semi-hard")
    with pytest.raises(ValueError, match="duplicate"):
        mine_triplets(["q"], docs[:1], ["a", "a", "c"], docs, {"q": {"a": 1}})


def test_save_load_round_trip_by_id(corpus, tmp_path):
    query_ids, queries, doc_ids, docs, qrels = corpus
    triplets = mine_triplets(query_ids, queries, doc_ids, docs, qrels, negatives="hard")
    path = save_triplets(tmp_path / "triplets.json", triplets, query_ids, doc_ids, meta={"dataset": "toy", "negatives": "hard"})
    first_bytes = path.read_bytes()
    save_triplets(path, triplets, query_ids, doc_ids, meta={"negatives": "hard", "dataset": "toy"})
    assert path.read_bytes() == first_bytes  # deterministic bytes
    assert not list(tmp_path.glob(".*.tmp"))

    stored = load_triplets(path)
    assert stored.meta == {"dataset": "toy", "negatives": "hard"}
    assert np.array_equal(stored.rows(query_ids, doc_ids), triplets)
    # Other row orders map to the same ids.
    reversed_docs = doc_ids[::-1]
    remapped = stored.rows(query_ids, reversed_docs)
    assert _as_ids(remapped, query_ids, reversed_docs) == _as_ids(triplets, query_ids, doc_ids)
    with pytest.raises(ValueError, match="triplets.json.*not among"):
        stored.rows(query_ids, doc_ids[:5])


def test_load_rejects_bad_files_naming_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_triplets(tmp_path / "nope.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "embedtune.triplets", "version": 1, "trip')
    with pytest.raises(DataFormatError, match="broken.json"):
        load_triplets(broken)
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="foreign.json.*format"):
        load_triplets(foreign)
    truncated = tmp_path / "short.json"
    truncated.write_text(json.dumps({"format": "embedtune.triplets", "version": 1, "n_triplets": 3, "triplets": [["q", "a", "b"]]}))
    with pytest.raises(ValueError, match="short.json.*n_triplets"):
        load_triplets(truncated)
