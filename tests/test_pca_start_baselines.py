"""The baselines' safety net starts at the stronger of the two PCA variants, as DIVE's does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedtune.compress import TrainingData, get_compressor_class
from embedtune.compress.export_layers import apply_layers
from embedtune.compress.holdout import holdout_split
from embedtune.compress.selection import InputRotation, pca_start_scores
from embedtune.evaluate.search import unit_rows
from embedtune.data.triplets import mine_triplets
from embedtune.workflows.fit_and_score import build_config

ROTATED = ["mrl-adaptor", "search-adaptor", "smec"]
K = 8


def _data(seed: int = 0) -> TrainingData:
    """Unit rows sharing a strong common direction (as real embeddings do), so centring matters."""
    rng = np.random.default_rng(seed)
    dim, n_docs, n_queries = 32, 400, 60
    common = rng.normal(size=dim)
    docs = rng.normal(size=(n_docs, dim)) + 4.0 * common / np.linalg.norm(common)
    docs = (docs / np.linalg.norm(docs, axis=1, keepdims=True)).astype(np.float32)
    queries = docs[:n_queries] + 0.4 * rng.normal(size=(n_queries, dim)).astype(np.float32)
    query_ids, doc_ids = [f"q{i}" for i in range(n_queries)], [f"d{i}" for i in range(n_docs)]
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(n_queries)}
    triplets = mine_triplets(query_ids, queries, doc_ids, docs, qrels, n_negatives=2, seed=1)
    return TrainingData(query_ids, queries, doc_ids, docs, qrels, triplets)


def _fit(method: str, train: TrainingData, **settings):
    config = build_config(method, K, 2027, {"init": "pca", "progress": False, **settings} if "progress" in
                          get_compressor_class(method).config_class.__dataclass_fields__ else {"init": "pca", **settings})
    return get_compressor_class(method)(config).fit(train)


@pytest.mark.parametrize("start,baseline", [("uncentred", "pca-uncentred"), ("centred", "pca")])
def test_each_start_reads_that_pca_variant(start, baseline):
    """The adapters start as "the first k rotated coordinates": with the offset that is the pca baseline."""
    train = _data()
    rotation = InputRotation.fit("pca", train.doc_embeddings, start)
    x = train.doc_embeddings[:50]
    untrained = unit_rows(rotation(torch.from_numpy(unit_rows(x))).numpy()[:, :K])
    reference = get_compressor_class(baseline)(build_config(baseline, K, 2027, {})).fit(train)
    np.testing.assert_allclose(untrained, reference.transform(x), atol=1e-5)
    assert (rotation.offset is None) == (start == "uncentred")
    scores = pca_start_scores(TrainingData(train.query_ids, train.query_embeddings, train.doc_ids, train.doc_embeddings, train.qrels),
                              train.doc_embeddings, K)
    assert set(scores) == {"uncentred", "centred"}


@pytest.mark.parametrize("method", ROTATED)
def test_a_centred_start_exports_and_reloads_as_it_transforms(method, tmp_path):
    train = _data()
    compressor = _fit(method, train, epochs=1, pca_start="centred")
    assert compressor.fit_details()["start"] == "centred PCA"
    x = train.doc_embeddings[:50]
    np.testing.assert_allclose(apply_layers(compressor.export_layers(), x), compressor.transform(x), atol=1e-5)
    compressor.save(tmp_path / method)
    loaded = type(compressor).load(tmp_path / method)
    np.testing.assert_allclose(loaded.transform(x), compressor.transform(x), atol=1e-6)


def test_stronger_start_is_chosen_on_the_selection_queries():
    train = _data()
    _, holdout = holdout_split(train, 0.5, 2027)
    scores = pca_start_scores(holdout, train.doc_embeddings, K)
    expected = max(scores, key=lambda name: (scores[name], name == "uncentred"))
    compressor = _fit("mrl-adaptor", train, epochs=1, pca_start="stronger", epoch_selection="best", selection_fraction=0.5)
    assert compressor.pca_start_ == expected
    assert compressor.fit_details()["start"] == f"{expected} PCA"
    with pytest.raises(ValueError, match="pca_start must be one of"):
        build_config("smec", K, 2027, {"pca_start": "middle"})
