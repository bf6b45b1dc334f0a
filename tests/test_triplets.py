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


# ---- False-negative filter and cap --------------------------------------------------------------


@pytest.fixture()
def many_positives():
    """A synthetic set with many judged positives and unjudged near-duplicates of them."""
    from embedtune.data.synthetic import make_false_negative_dataset

    return make_false_negative_dataset(n_queries=12, n_docs=1500, dim=32, positives_per_query=10,
                                       near_duplicates_per_positive=2, judged_fraction=0.5, seed=3)


@pytest.mark.parametrize("negatives", ["hard", "random"])
@pytest.mark.parametrize("n_negatives, hard_pool", [(4, 50), (3, 5), (8, 8)])
def test_defaults_reproduce_the_original_miner_exactly(corpus, many_positives, negatives, n_negatives, hard_pool):
    from legacy_triplets import legacy_mine_triplets

    for data in (corpus, tuple(many_positives)):
        for seed in (2027, 7):
            expected = legacy_mine_triplets(*data, n_negatives=n_negatives, negatives=negatives, hard_pool=hard_pool, seed=seed)
            explicit = mine_triplets(*data, n_negatives=n_negatives, negatives=negatives, hard_pool=hard_pool, seed=seed,
                                     skip_top=0, false_negative_margin=None, max_triplets_per_query=None)
            assert np.array_equal(mine_triplets(*data, n_negatives=n_negatives, negatives=negatives, hard_pool=hard_pool, seed=seed), expected)
            assert np.array_equal(explicit, expected)


def _ranked_candidates(query_row, query_ids, queries, doc_ids, docs, qrels):
    """Non-excluded docs of one query in frozen rank order (ties by row), with their scores."""
    query_id = query_ids[query_row]
    scores = docs.astype(np.float64) @ queries[query_row].astype(np.float64)
    order = np.lexsort((np.arange(len(doc_ids)), -(docs @ queries[query_row])))
    ranked = [row for row in order if doc_ids[row] != query_id and qrels.get(query_id, {}).get(doc_ids[row], 0) <= 0]
    return ranked, scores


def test_skip_top_never_uses_the_top_ranked_candidates(many_positives):
    query_ids, queries, doc_ids, docs, qrels = many_positives
    skip, pool = 25, 10
    triplets = mine_triplets(*many_positives, n_negatives=4, hard_pool=pool, skip_top=skip)
    assert len(triplets) == 4 * sum(len(v) for v in qrels.values())
    for query_row, _, negative_row in triplets.tolist():
        ranked, _ = _ranked_candidates(query_row, query_ids, queries, doc_ids, docs, qrels)
        assert negative_row not in ranked[:skip]
        assert negative_row in ranked[skip : skip + pool]


@pytest.mark.parametrize("reference", ["pair", "query-min"])
def test_margin_drops_candidates_within_the_margin_of_the_positive(many_positives, reference):
    query_ids, queries, doc_ids, docs, qrels = many_positives
    margin, pool = 0.05, 20
    triplets = mine_triplets(*many_positives, n_negatives=4, hard_pool=pool, false_negative_margin=margin,
                             false_negative_reference=reference)
    assert len(triplets) == 4 * sum(len(v) for v in qrels.values())  # the window moves down, it does not run dry
    for query_row, positive_row, negative_row in triplets.tolist():
        ranked, scores = _ranked_candidates(query_row, query_ids, queries, doc_ids, docs, qrels)
        positives = [doc_ids.index(d) for d in qrels[query_ids[query_row]]]
        reference_score = scores[positive_row] if reference == "pair" else min(scores[p] for p in positives)
        threshold = reference_score - margin
        assert scores[negative_row] <= threshold
        survivors = [row for row in ranked if scores[row] <= threshold]
        assert negative_row in survivors[:pool]  # the hardest candidates that pass


def test_margin_and_skip_top_remove_the_false_negatives_of_naive_mining(many_positives):
    query_ids, _, doc_ids, _, _ = many_positives

    def false_negative_rate(triplets):
        return np.mean([doc_ids[n] in many_positives.unjudged_relevant[query_ids[q]] for q, _, n in triplets.tolist()])

    naive = false_negative_rate(mine_triplets(*many_positives, hard_pool=20))
    assert naive > 0.9  # the frozen top-20 is mostly unjudged relevant docs (25 per query)
    assert false_negative_rate(mine_triplets(*many_positives, hard_pool=20, skip_top=30)) < 0.05
    assert false_negative_rate(mine_triplets(*many_positives, hard_pool=20, false_negative_margin=0.1)) < 0.15
    strict = mine_triplets(*many_positives, hard_pool=20, false_negative_margin=0.05, false_negative_reference="query-min")
    assert false_negative_rate(strict) < 0.05


def test_a_margin_nothing_passes_gives_no_triplets(corpus, caplog):
    triplets = mine_triplets(*corpus, false_negative_margin=100.0)
    assert triplets.shape == (0, 3)
    assert "fewer than 4 candidate negatives" in caplog.text


def test_cap_holds_spreads_over_positives_and_is_a_subset(many_positives):
    query_ids, _, doc_ids, _, qrels = many_positives
    full = mine_triplets(*many_positives, n_negatives=4)
    for cap in (1, 3, 7, 12, 20, 40):
        capped = mine_triplets(*many_positives, n_negatives=4, max_triplets_per_query=cap)
        assert set(map(tuple, capped.tolist())) <= set(map(tuple, full.tolist()))  # negatives are not redrawn
        for query_row in set(full[:, 0].tolist()):
            rows = capped[capped[:, 0] == query_row]
            n_positives = len(qrels[query_ids[query_row]])
            assert len(rows) == min(cap, 4 * n_positives)
            per_positive = np.bincount(np.unique(rows[:, 1], return_inverse=True)[1])
            if cap >= n_positives:  # every positive kept, quotas differ by at most one
                assert len(per_positive) == n_positives
                assert per_positive.max() - per_positive.min() <= 1
            else:  # as many positives as slots, one triplet each
                assert len(per_positive) == cap and per_positive.max() == 1
        # Order is kept: by query id, then positive id, then draw order.
        keys = [(query_ids[q], doc_ids[p]) for q, p, _ in capped.tolist()]
        assert keys == sorted(keys)
    assert np.array_equal(mine_triplets(*many_positives, max_triplets_per_query=10_000), full)


def test_cap_spreads_when_some_positives_have_fewer_negatives():
    # Inner product with the query is the first coordinate. With a per-pair margin of 0.05 the
    # strong positive (1.0) keeps all four candidates, the weak one (0.3) only 0.2 and 0.1.
    scores = {"p_hi": 1.0, "p_lo": 0.3, "c9": 0.9, "c8": 0.8, "c2": 0.2, "c1": 0.1}
    doc_ids = list(scores)
    docs = np.array([[s, np.sqrt(1 - s * s)] for s in scores.values()], dtype=np.float32)
    query = np.array([[1.0, 0.0]], dtype=np.float32)
    qrels = {"q": {"p_hi": 1, "p_lo": 1}}
    full = mine_triplets(["q"], query, doc_ids, docs, qrels, n_negatives=4, false_negative_margin=0.05)
    pairs = [(doc_ids[p], doc_ids[n]) for _, p, n in full.tolist()]
    assert sorted(n for p, n in pairs if p == "p_lo") == ["c1", "c2"]
    assert sorted(n for p, n in pairs if p == "p_hi") == ["c1", "c2", "c8", "c9"]
    capped = mine_triplets(["q"], query, doc_ids, docs, qrels, n_negatives=4, false_negative_margin=0.05, max_triplets_per_query=5)
    kept = [doc_ids[p] for _, p, _ in capped.tolist()]
    assert kept.count("p_lo") == 2 and kept.count("p_hi") == 3  # the short positive's spare slot goes to the other


@pytest.mark.parametrize("negatives", ["hard", "random"])
def test_robust_mining_is_deterministic_and_seed_dependent(many_positives, negatives):
    options = {"max_triplets_per_query": 9}
    if negatives == "hard":
        options |= {"skip_top": 3, "false_negative_margin": 0.02}
    first = mine_triplets(*many_positives, negatives=negatives, seed=11, **options)
    assert np.array_equal(first, mine_triplets(*many_positives, negatives=negatives, seed=11, **options))
    assert not np.array_equal(first, mine_triplets(*many_positives, negatives=negatives, seed=12, **options))
    # Row order does not matter either.
    query_ids, queries, doc_ids, docs, qrels = many_positives
    permutation = np.random.default_rng(5).permutation(len(doc_ids))
    moved_ids = [doc_ids[i] for i in permutation]
    moved = mine_triplets(query_ids, queries, moved_ids, docs[permutation], qrels, negatives=negatives, seed=11, **options)
    assert _as_ids(moved, query_ids, moved_ids) == _as_ids(first, query_ids, doc_ids)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"skip_top": -1}, "skip_top must be an integer >= 0"),
        ({"skip_top": 1.5}, "skip_top must be an integer >= 0"),
        ({"skip_top": True}, "skip_top must be an integer >= 0"),
        ({"false_negative_margin": float("nan")}, "false_negative_margin must be a finite number or None"),
        ({"false_negative_margin": float("inf")}, "false_negative_margin must be a finite number or None"),
        ({"false_negative_margin": "0.1"}, "false_negative_margin must be a finite number or None"),
        ({"false_negative_reference": "max"}, "false_negative_reference must be one of"),
        ({"max_triplets_per_query": 0}, "max_triplets_per_query must be a positive integer or None"),
        ({"max_triplets_per_query": 2.0}, "max_triplets_per_query must be a positive integer or None"),
        ({"negatives": "random", "skip_top": 2}, "filter hard negatives"),
        ({"negatives": "random", "false_negative_margin": 0.1}, "filter hard negatives"),
    ],
)
def test_robust_options_are_validated(corpus, options, message):
    with pytest.raises(ValueError, match=message):
        mine_triplets(*corpus, **options)


def test_mining_options_lists_only_non_defaults():
    from embedtune.data.triplets import mining_options

    assert mining_options() == {}
    assert mining_options(false_negative_reference="query-min") == {}  # irrelevant without a margin
    assert mining_options(skip_top=5, false_negative_margin=0, max_triplets_per_query=8) == {
        "skip_top": 5, "false_negative_margin": 0.0, "max_triplets_per_query": 8}
    assert mining_options(false_negative_margin=0.1, false_negative_reference="query-min") == {
        "false_negative_margin": 0.1, "false_negative_reference": "query-min"}
