"""DIVE options beyond the paper: PCA-rotated init, best-epoch selection, norm-preserving output, presets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedtune.compress import TrainingData, load_compressor
from embedtune.compress.base import l2_normalize
from embedtune.compress.dive import DIVECompressor, DIVEConfig, corpus_pca_rotation, holdout_split
from embedtune.compress.pca import principal_axes

torch.set_num_threads(1)

DIM_IN = 32


def _fast(**overrides) -> DIVEConfig:
    values = dict(dim=8, heads=4, epochs=4, batch_size=32, learning_rate=3e-3, device="cpu", progress=False)
    values.update(overrides)
    return DIVEConfig(**values)


@pytest.fixture(scope="module")
def toy() -> TrainingData:
    rng = np.random.default_rng(1)
    n_queries, n_docs = 50, 240
    # Anisotropic corpus, so the principal directions are far from the coordinate axes.
    mixing = rng.standard_normal((DIM_IN, DIM_IN)) * np.linspace(3.0, 0.1, DIM_IN)[:, None]
    docs = (rng.standard_normal((n_docs, DIM_IN)) @ mixing + 0.5).astype(np.float32)
    targets = rng.choice(n_docs, size=n_queries, replace=False)
    queries = docs[targets] + 0.5 * rng.standard_normal((n_queries, DIM_IN)).astype(np.float32)
    query_ids = [f"q{i}" for i in range(n_queries)]
    doc_ids = [f"d{i}" for i in range(n_docs)]
    qrels = {qid: {doc_ids[t]: 1} for qid, t in zip(query_ids, targets)}
    negatives = rng.integers(0, n_docs, size=(n_queries, 4))
    triplets = np.array(
        [[q, targets[q], n] for q in range(n_queries) for n in negatives[q] if n != targets[q]], dtype=np.int64
    )
    return TrainingData(query_ids, queries, doc_ids, docs, qrels, triplets)


def test_pca_rotation_is_orthogonal_and_sorted_by_variance(toy):
    rotation = corpus_pca_rotation(toy.doc_embeddings)
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(DIM_IN), atol=1e-5)
    units = l2_normalize(toy.doc_embeddings)
    variances = ((units - units.mean(0)) @ rotation).var(0)
    assert np.all(np.diff(variances) <= 1e-6)
    # Applied without centring: inner products are unchanged.
    np.testing.assert_allclose((units @ rotation) @ (units @ rotation).T, units @ units.T, atol=1e-5)


def test_pca_init_head_one_is_uncentred_projection_on_top_components(toy):
    X = toy.doc_embeddings
    compressor = DIVECompressor(_fast(epochs=0, init="pca")).fit(toy)
    _, components, _ = principal_axes(l2_normalize(X), 8)
    expected = l2_normalize(l2_normalize(X) @ components.T.astype(np.float32))
    np.testing.assert_allclose(compressor.transform(X), expected, atol=1e-5)
    identity = DIVECompressor(_fast(epochs=0)).fit(toy)
    assert not np.allclose(identity.transform(X), expected, atol=1e-3)


def test_pca_init_trains_saves_and_loads(toy, tmp_path):
    compressor = DIVECompressor(_fast(init="pca")).fit(toy)
    assert compressor.adapter_.mlp.down.weight.abs().sum() > 0
    compressor.save(tmp_path / "dive")
    loaded = load_compressor(tmp_path / "dive")
    assert loaded.config.init == "pca"
    assert np.array_equal(loaded.transform(toy.doc_embeddings), compressor.transform(toy.doc_embeddings))


def test_weights_without_rotation_do_not_load_as_pca(toy, tmp_path):
    import json

    DIVECompressor(_fast(epochs=1)).fit(toy).save(tmp_path / "dive")
    config_path = tmp_path / "dive" / "config.json"
    meta = json.loads(config_path.read_text())
    meta["config"]["init"] = "pca"
    config_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="rotation"):
        load_compressor(tmp_path / "dive")


def test_holdout_split_is_query_disjoint_and_deterministic(toy):
    fit_a, held_a = holdout_split(toy, 0.2, seed=7)
    fit_b, held_b = holdout_split(toy, 0.2, seed=7)
    assert held_a.query_ids == held_b.query_ids and np.array_equal(fit_a.triplets, fit_b.triplets)
    assert len(held_a.query_ids) == 10
    fit_queries = {toy.query_ids[row] for row in np.unique(fit_a.triplets[:, 0])}
    assert fit_queries.isdisjoint(held_a.query_ids)
    assert len(fit_queries) + len(held_a.query_ids) == 50
    _, held_other = holdout_split(toy, 0.2, seed=8)
    assert held_other.query_ids != held_a.query_ids


def test_best_epoch_selection_keeps_the_initialisation_when_training_hurts(toy):
    # Triplets with positive and negative swapped teach the adapter to rank wrongly.
    swapped = TrainingData(toy.query_ids, toy.query_embeddings, toy.doc_ids, toy.doc_embeddings, toy.qrels, toy.triplets[:, [0, 2, 1]])
    config = dict(init="pca", epochs=6, learning_rate=2e-2, geometry_weight=0.0)
    selected = DIVECompressor(_fast(epoch_selection="best", **config)).fit(swapped)
    assert selected.selected_epoch_ == 0
    initial = DIVECompressor(_fast(epochs=0, init="pca")).fit(swapped)
    np.testing.assert_allclose(selected.transform(toy.doc_embeddings), initial.transform(toy.doc_embeddings), atol=1e-6)
    last = DIVECompressor(_fast(**config)).fit(swapped)
    assert not np.allclose(last.transform(toy.doc_embeddings), initial.transform(toy.doc_embeddings), atol=1e-3)
    holdout_rows = [row for row in selected.history_ if row.get("phase") == "select"]
    assert len(holdout_rows) == 6 and all("holdout_ndcg@10" in row for row in holdout_rows)


def test_best_epoch_selection_refits_for_the_selected_epochs_and_persists_it(toy, tmp_path):
    compressor = DIVECompressor(_fast(epoch_selection="best", epochs=5)).fit(toy)
    epoch = compressor.selected_epoch_
    assert 0 <= epoch <= 5
    assert [row["epoch"] for row in compressor.history_ if row.get("phase") == "refit"] == list(range(1, epoch + 1))
    compressor.save(tmp_path / "dive")
    assert load_compressor(tmp_path / "dive").selected_epoch_ == epoch
    # Deterministic: same seed and data, same selection and weights.
    again = DIVECompressor(_fast(epoch_selection="best", epochs=5)).fit(toy)
    assert again.selected_epoch_ == epoch
    assert np.array_equal(again.transform(toy.doc_embeddings), compressor.transform(toy.doc_embeddings))


def test_output_norm_input_keeps_direction_and_input_norm(toy):
    X = toy.doc_embeddings * np.linspace(0.5, 3.0, len(toy.doc_embeddings))[:, None].astype(np.float32)
    unit = DIVECompressor(_fast()).fit(toy)
    scaled = DIVECompressor(_fast(output_norm="input")).fit(toy)
    out = scaled.transform(X)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), np.linalg.norm(X, axis=1), rtol=1e-5)
    np.testing.assert_allclose(l2_normalize(out), unit.transform(X), atol=1e-6)
    module = scaled.torch_module()
    with torch.no_grad():
        np.testing.assert_allclose(module(torch.from_numpy(X)).numpy(), out, rtol=1e-4, atol=1e-5)


def test_presets_and_validation():
    assert DIVEConfig.preset("paper") == DIVEConfig()
    with pytest.raises(ValueError, match="unknown preset"):
        DIVEConfig.preset("nope")
    for field, value in (("init", "random"), ("epoch_selection", "first"), ("output_norm", "l1"), ("selection_fraction", 1.0)):
        with pytest.raises(ValueError, match=field):
            DIVEConfig(**{field: value})
