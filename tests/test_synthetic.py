"""The synthetic false-negative dataset: shapes, determinism, ground truth, and its geometry."""

from __future__ import annotations

import numpy as np
import pytest

from embedtune.data.synthetic import FalseNegativeDataset, make_false_negative_dataset

ARGS = dict(n_queries=10, n_docs=1200, dim=32, positives_per_query=8, near_duplicates_per_positive=3, judged_fraction=0.25, seed=4)


@pytest.fixture(scope="module")
def dataset() -> FalseNegativeDataset:
    return make_false_negative_dataset(**ARGS)


def test_shapes_ids_and_unpacking(dataset):
    query_ids, queries, doc_ids, docs, qrels = dataset
    assert len(tuple(dataset)) == 5
    assert queries.shape == (10, 32) and docs.shape == (1200, 32)
    assert queries.dtype == np.float32 and docs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, atol=1e-5)
    assert len(set(query_ids)) == 10 and len(set(doc_ids)) == 1200
    assert set(qrels) == set(query_ids)


def test_ground_truth_is_consistent(dataset):
    query_ids, _, doc_ids, _, qrels = dataset
    judged_per_query = round(0.25 * 8)
    relevant_per_query = 8 * (1 + 3)
    all_docs = set(doc_ids)
    for query_id in query_ids:
        truth = dataset.true_qrels[query_id]
        assert len(qrels[query_id]) == judged_per_query
        assert len(truth) == relevant_per_query
        assert set(qrels[query_id]) <= set(truth) <= all_docs
        assert dataset.unjudged_relevant[query_id] == set(truth) - set(qrels[query_id])
        assert not dataset.distractors[query_id] & set(truth)
    # Each relevant doc belongs to one query, and every near-duplicate copies a relevant original of its query.
    owners = [doc for query_id in query_ids for doc in dataset.true_qrels[query_id]]
    assert len(owners) == len(set(owners)) == 10 * relevant_per_query
    assert len(dataset.near_duplicate_of) == 10 * 8 * 3
    for duplicate, source in dataset.near_duplicate_of.items():
        (query_id,) = [q for q in query_ids if duplicate in dataset.true_qrels[q]]
        assert source in dataset.true_qrels[query_id] and source not in dataset.near_duplicate_of
        assert duplicate not in qrels[query_id]  # near-duplicates are never judged


def test_deterministic_and_seed_dependent():
    first, again = make_false_negative_dataset(**ARGS), make_false_negative_dataset(**ARGS)
    other = make_false_negative_dataset(**{**ARGS, "seed": 5})
    for a, b in zip(first, again):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
        else:
            assert a == b
    assert first.true_qrels == again.true_qrels and first.near_duplicate_of == again.near_duplicate_of
    assert not np.array_equal(first.doc_emb, other.doc_emb) and first.qrels != other.qrels


def test_near_duplicates_and_unjudged_relevant_rank_high(dataset):
    query_ids, queries, doc_ids, docs, qrels = dataset
    row = {doc_id: i for i, doc_id in enumerate(doc_ids)}
    scores = queries @ docs.T
    n_relevant = 8 * (1 + 3)
    precision = []
    for q, query_id in enumerate(query_ids):
        # Near-duplicates score almost exactly like their source.
        for duplicate in dataset.true_qrels[query_id]:
            source = dataset.near_duplicate_of.get(duplicate)
            if source is not None:
                assert abs(scores[q, row[duplicate]] - scores[q, row[source]]) < 0.05
        # The frozen top ranks are the relevant docs, most of them unjudged: naive hard mining's false negatives.
        top = [doc_ids[i] for i in np.argsort(-scores[q])[:n_relevant]]
        precision.append(np.mean([doc in dataset.true_qrels[query_id] for doc in top]))
        unjudged_top = [doc for doc in top if doc not in qrels[query_id]]
        assert np.mean([doc in dataset.unjudged_relevant[query_id] for doc in unjudged_top]) > 0.8
        # Distractors sit between the relevant docs and the background.
        distractor_scores = [scores[q, row[d]] for d in dataset.distractors[query_id]]
        relevant_scores = [scores[q, row[d]] for d in dataset.true_qrels[query_id]]
        background = [scores[q, i] for i, d in enumerate(doc_ids)
                      if d not in dataset.true_qrels[query_id] and d not in dataset.distractors[query_id]]
        assert np.median(background) < np.median(distractor_scores) < np.median(relevant_scores)
    assert min(precision) > 0.8 and np.mean(precision) > 0.9


def test_judged_fraction_keeps_at_least_one_judged_doc():
    dataset = make_false_negative_dataset(**{**ARGS, "judged_fraction": 0.01})
    assert all(len(judged) == 1 for judged in dataset.qrels.values())
    full = make_false_negative_dataset(**{**ARGS, "judged_fraction": 1.0, "near_duplicates_per_positive": 0})
    assert all(not unjudged for unjudged in full.unjudged_relevant.values())


def test_shared_topics_and_query_shift():
    plain = make_false_negative_dataset(**ARGS)
    topics = make_false_negative_dataset(**{**ARGS, "n_topics": 2, "topic_spread": 0.3})
    shifted = make_false_negative_dataset(**{**ARGS, "query_shift": 0.6})
    off_diagonal = ~np.eye(10, dtype=bool)
    for dataset in (topics, shifted):
        # The truth keeps its structure: same counts of judged and relevant docs per query.
        assert [len(dataset.qrels[q]) for q in dataset.query_ids] == [len(plain.qrels[q]) for q in plain.query_ids]
        assert [len(dataset.true_qrels[q]) for q in dataset.query_ids] == [len(plain.true_qrels[q]) for q in plain.query_ids]
        np.testing.assert_allclose(np.linalg.norm(dataset.query_emb, axis=1), 1.0, atol=1e-5)
    # Queries of one topic (q and q + 2) are closer to each other than to the other topic's.
    similarity = topics.query_emb @ topics.query_emb.T
    same = np.equal.outer(np.arange(10) % 2, np.arange(10) % 2) & off_diagonal
    assert similarity[same].mean() > similarity[~same & off_diagonal].mean() + 0.3
    # The shared offset makes queries similar to one another, not to the documents.
    plain_similarity = (plain.query_emb @ plain.query_emb.T)[off_diagonal].mean()
    shifted_similarity = (shifted.query_emb @ shifted.query_emb.T)[off_diagonal].mean()
    assert shifted_similarity > plain_similarity + 0.15
    assert np.array_equal(shifted.doc_emb, plain.doc_emb) and shifted.qrels == plain.qrels


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_docs": 100}, "cannot hold"),
        ({"judged_fraction": 0.0}, "judged_fraction"),
        ({"judged_fraction": 1.5}, "judged_fraction"),
        ({"positives_per_query": 0}, "positives_per_query"),
        ({"near_duplicates_per_positive": -1}, "near_duplicates_per_positive"),
        ({"distractors_per_query": 10_000}, "distractors_per_query"),
        ({"n_topics": 0}, "n_topics"),
        ({"topic_spread": -0.1}, "topic_spread"),
        ({"query_shift": float("nan")}, "query_shift"),
    ],
)
def test_invalid_arguments(change, message):
    with pytest.raises(ValueError, match=message):
        make_false_negative_dataset(**{**ARGS, **change})
