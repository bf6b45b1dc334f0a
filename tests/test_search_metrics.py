import math

import numpy as np
import pytest

from embedtune.evaluate import evaluate_embeddings, evaluate_run, exact_search, search_ids


def test_exact_search_matches_numpy_brute_force(rng):
    xb = rng.normal(size=(500, 24)).astype(np.float32)
    xq = rng.normal(size=(37, 24)).astype(np.float32)
    D, I = exact_search(xq, xb, k=10, batch_size=8)
    scores = xq @ xb.T
    expected = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(I, expected)
    np.testing.assert_allclose(D, np.take_along_axis(scores, expected, axis=1), rtol=1e-5, atol=1e-5)


def test_ties_break_by_row_order():
    xb = np.array([[1, 0], [0, 1], [1, 0], [1, 0], [0.5, 0]], dtype=np.float32)
    xq = np.array([[1, 0]], dtype=np.float32)
    _, I = exact_search(xq, xb, k=2)
    assert I.tolist() == [[0, 2]]
    _, I = exact_search(xq, xb, k=4)
    assert I.tolist() == [[0, 2, 3, 4]]


def test_k_larger_than_corpus(rng):
    D, I = exact_search(rng.normal(size=(2, 4)), rng.normal(size=(3, 4)), k=100)
    assert I.shape == (2, 3) and D.dtype == np.float32


def test_dim_mismatch_raises(rng):
    with pytest.raises(ValueError, match="dim"):
        exact_search(rng.normal(size=(2, 4)), rng.normal(size=(3, 5)))


def test_identical_ids_are_dropped_and_topk_kept():
    docs = np.eye(4, dtype=np.float32)
    queries = np.array([[1, 0.5, 0.1, 0]], dtype=np.float32)
    kept = search_ids(["a"], queries, ["a", "b", "c", "d"], docs, top_k=2, ignore_identical_ids=True)
    assert list(kept["a"]) == ["b", "c"]
    raw = search_ids(["a"], queries, ["a", "b", "c", "d"], docs, top_k=2, ignore_identical_ids=False)
    assert list(raw["a"]) == ["a", "b"]


def _dcg(gains):
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains))


def test_metrics_against_hand_computed_values():
    qrels = {"q1": {"d1": 2, "d3": 1}, "q2": {"d9": 1}}
    run = {
        "q1": {"d2": 0.9, "d1": 0.8, "d4": 0.7, "d3": 0.6},  # relevant at ranks 2 (gain 2) and 4 (gain 1)
        "q2": {"d5": 0.5, "d6": 0.4},  # relevant doc never retrieved
    }
    result = evaluate_run(qrels, run)
    ndcg_q1 = _dcg([0, 2, 0, 1]) / _dcg([2, 1])
    assert result.per_query["q1"]["ndcg@10"] == pytest.approx(ndcg_q1, abs=1e-4)
    assert result.per_query["q2"]["ndcg@10"] == 0.0
    assert result["ndcg@10"] == pytest.approx(ndcg_q1 / 2, abs=1e-4)
    assert result.per_query["q1"]["recall@10"] == 1.0
    assert result.per_query["q1"]["p@1"] == 0.0
    assert result.per_query["q1"]["mrr@10"] == pytest.approx(0.5)
    assert result.n_queries == 2
    np.testing.assert_allclose(result.vector("ndcg@10", ["q2", "q1"]), [0.0, ndcg_q1], atol=1e-4)


def test_query_with_empty_run_scores_zero_and_counts():
    result = evaluate_run({"q1": {"d1": 1}, "q2": {"d1": 1}}, {"q1": {"d1": 1.0}})
    assert result.n_queries == 2 and result["recall@10"] == 0.5


def test_mrr_cutoff():
    qrels = {"q": {"d11": 1}}
    run = {"q": {f"d{i}": 1.0 - i / 100 for i in range(12)}}
    assert evaluate_run(qrels, run)["mrr@10"] == 0.0
    assert evaluate_run(qrels, run, ("mrr@20",))["mrr@20"] == pytest.approx(1 / 12)


def test_unknown_metric():
    with pytest.raises(ValueError, match="unknown metric"):
        evaluate_run({"q": {"d": 1}}, {"q": {"d": 1.0}}, ("bleu@10",))


def test_evaluate_embeddings_end_to_end_and_identical_id_effect():
    doc_ids = ["q1", "d1", "d2"]
    docs = np.array([[1, 0], [0.8, 0.6], [0, 1]], dtype=np.float32)
    query = np.array([[1, 0]], dtype=np.float32)
    qrels = {"q1": {"d1": 1}}
    with_rule = evaluate_embeddings(["q1"], query, doc_ids, docs, qrels)
    without = evaluate_embeddings(["q1"], query, doc_ids, docs, qrels, ignore_identical_ids=False)
    assert with_rule["p@1"] == 1.0 and without["p@1"] == 0.0


def test_the_identical_id_rule_says_when_it_drops_a_judged_pair(caplog):
    import logging

    from embedtune.evaluate.retrieval import evaluate_embeddings

    rng = np.random.default_rng(0)
    docs = rng.standard_normal((6, 4)).astype(np.float32)
    # Queries and documents numbered independently: query "2" is judged relevant to document "2".
    qrels = {"1": {"3": 1}, "2": {"2": 1}}
    with caplog.at_level(logging.WARNING, logger="embedtune.evaluate.retrieval"):
        dropped = evaluate_embeddings(["1", "2"], docs[[3, 2]], [str(i) for i in range(6)], docs, qrels, top_k=5)
    assert "1 judged (query, document) pair(s) share an id" in caplog.text and "--keep-identical-ids" in caplog.text
    kept = evaluate_embeddings(["1", "2"], docs[[3, 2]], [str(i) for i in range(6)], docs, qrels, top_k=5, ignore_identical_ids=False)
    assert kept["ndcg@10"] > dropped["ndcg@10"]
