"""FAISS factory indexes are trained without polysemous training: the same scores, a fraction of the time."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from embedtune.index.ann import build_factory_index
from embedtune.index.codecs.faiss_codes import new_factory_index, without_polysemous_training


def _product_quantisers(index):
    node = faiss.downcast_index(index)
    while isinstance(node, faiss.IndexPreTransform):
        node = faiss.downcast_index(node.index)
    return node


@pytest.mark.parametrize("factory", ["PQ8", "OPQ8,PQ8", "IVF4,PQ8", "PCA16,PQ8"])
def test_factory_indexes_are_made_without_polysemous_training(factory):
    assert faiss.downcast_index(faiss.index_factory(32, "PQ8", faiss.METRIC_INNER_PRODUCT)).do_polysemous_training, \
        "FAISS's factory turns it on for PQ, which is why the switch exists"
    assert not _product_quantisers(new_factory_index(32, factory)).do_polysemous_training


def test_the_switch_leaves_every_decoded_vector_and_score_unchanged():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 32)).astype(np.float32)
    queries = rng.standard_normal((20, 32)).astype(np.float32)
    results = []
    for polysemous in (True, False):
        index = faiss.index_factory(32, "PQ4", faiss.METRIC_INNER_PRODUCT)
        if not polysemous:
            without_polysemous_training(index)
        assert faiss.downcast_index(index).do_polysemous_training == polysemous
        index.train(x)
        index.add(x)
        decoded = index.sa_decode(index.sa_encode(x))
        scores, ids = index.search(queries, 10)
        results.append((decoded, scores, ids))
    (decoded_p, scores_p, ids_p), (decoded, scores, ids) = results
    np.testing.assert_allclose(decoded, decoded_p, rtol=0, atol=1e-6)
    np.testing.assert_allclose(scores, scores_p, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(ids, ids_p)


def test_indexes_built_for_the_ann_benchmarks_skip_it_too():
    x = np.random.default_rng(1).standard_normal((2000, 16)).astype(np.float32)
    index, _ = build_factory_index(x, "PQ4")
    assert not faiss.downcast_index(index).do_polysemous_training
    assert index.ntotal == len(x)
