"""Unsupervised baselines, and the losses of Matryoshka-Adaptor and Search-Adaptor, against references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embedtune.compress import TrainingData, make_compressor
from embedtune.compress.autoencoder import AutoencoderConfig
from embedtune.compress.mrl_adaptor import (
    MRLAdaptorConfig,
    default_nested_dims,
    mine_corpus_neighbors,
    pairwise_similarity_loss,
    reconstruction_loss,
    topk_similarity_loss,
)
from embedtune.compress.pca import flip_signs
from embedtune.compress.search_adaptor import SearchAdaptorConfig, prediction_loss, recovery_loss
from embedtune.compress.smec import SMECConfig

# Tiny tensors: one thread is fastest and stays fast on a busy 2-core machine.
torch.set_num_threads(1)


def make_train(n_queries=20, n_docs=60, d=32, seed=0, triplets=None, rank=None):
    rng = np.random.default_rng(seed)
    if rank is None:
        docs = rng.normal(size=(n_docs, d))
    else:  # low-rank structure plus a little noise
        docs = rng.normal(size=(n_docs, rank)) @ rng.normal(size=(rank, d)) + 0.05 * rng.normal(size=(n_docs, d))
    queries = rng.normal(size=(n_queries, d))
    return TrainingData(
        [f"q{i}" for i in range(n_queries)], queries, [f"d{i}" for i in range(n_docs)], docs, {}, triplets
    )


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# -- unsupervised -------------------------------------------------------------------------------


def test_pca_matches_numpy_svd():
    train = make_train(n_docs=80, d=16, seed=3)
    pca = make_compressor("pca", dim=5).fit(train)
    corpus = train.doc_embeddings.astype(np.float64)
    mean = corpus.mean(axis=0)
    _, singular_values, vt = np.linalg.svd(corpus - mean, full_matrices=False)
    reference = flip_signs(vt[:5])
    np.testing.assert_allclose(pca.mean_, mean, atol=1e-6)
    np.testing.assert_allclose(pca.components_, reference, atol=1e-5)
    np.testing.assert_allclose(pca.explained_variance_, singular_values[:5] ** 2 / (len(corpus) - 1), rtol=1e-5)
    queries = train.query_embeddings
    np.testing.assert_allclose(pca.transform(queries), unit((queries - mean) @ reference.T), atol=1e-5)


def test_pca_sign_convention_is_largest_entry_positive():
    train = make_train(n_docs=50, d=12, seed=4)
    components = make_compressor("pca", dim=4).fit(train).components_
    pivots = np.argmax(np.abs(components), axis=1)
    assert (components[np.arange(4), pivots] > 0).all()


def test_pca_dim_limits():
    with pytest.raises(ValueError, match="dim=40"):
        make_compressor("pca", dim=40).fit(make_train(d=32))
    with pytest.raises(ValueError, match="n_docs=6"):
        make_compressor("pca", dim=8).fit(make_train(n_docs=6, d=32))


def test_truncate_and_frozen():
    train = make_train()
    X = train.query_embeddings
    np.testing.assert_allclose(make_compressor("truncate", dim=8).fit(train).transform(X), unit(X[:, :8]), atol=1e-6)
    frozen = make_compressor("frozen", dim=8).fit(train)
    assert frozen.output_dim == 32
    np.testing.assert_allclose(frozen.transform(X), unit(X), atol=1e-6)
    with pytest.raises(ValueError, match="dim=64"):
        make_compressor("truncate", dim=64).fit(train)


def test_autoencoder_reconstruction_loss_decreases():
    train = make_train(n_docs=200, d=32, rank=6, seed=5)
    autoencoder = make_compressor("autoencoder", dim=8, epochs=10, batch_size=40, progress=False, device="cpu").fit(train)
    losses = [record["loss"] for record in autoencoder.history_]
    assert len(losses) == 10
    assert losses[-1] < 0.7 * losses[0]
    assert autoencoder.transform(train.doc_embeddings).shape == (200, 8)


# -- Matryoshka-Adaptor losses ------------------------------------------------------------------


def cos(a, b):
    return F.cosine_similarity(a, b, dim=0).item()


def test_default_nested_dims():
    assert default_nested_dims(128, 4096) == (128, 256, 512, 1024, 2048, 4096)
    assert default_nested_dims(8, 32) == (8, 16, 32)
    assert default_nested_dims(12, 32) == (12, 24, 32)
    assert default_nested_dims(32, 32) == (32,)


def test_mrl_pair_topk_rec_losses_match_naive_loops():
    generator = torch.Generator().manual_seed(0)
    n, K, d, dims = 5, 3, 8, (2, 4, 8)
    frozen, adapted = torch.randn(n, d, generator=generator), torch.randn(n, d, generator=generator)
    frozen_nb, adapted_nb = torch.randn(n, K, d, generator=generator), torch.randn(n, K, d, generator=generator)

    pair = sum(
        abs(cos(frozen[i], frozen[j]) - cos(adapted[i, :m], adapted[j, :m]))
        for i, j in itertools.product(range(n), range(n))
        if i != j
        for m in dims
    )
    assert pairwise_similarity_loss(frozen, adapted, dims, reduction="sum").item() == pytest.approx(pair, rel=1e-5)
    assert pairwise_similarity_loss(frozen, adapted, dims).item() == pytest.approx(pair / (n * (n - 1)), rel=1e-5)

    topk = sum(
        abs(cos(frozen[i], frozen_nb[i, j]) - cos(adapted[i, :m], adapted_nb[i, j, :m]))
        for i in range(n)
        for j in range(K)
        for m in dims
    )
    got = topk_similarity_loss(frozen, adapted, frozen_nb, adapted_nb, dims, reduction="sum")
    assert got.item() == pytest.approx(topk, rel=1e-5)
    assert topk_similarity_loss(frozen, adapted, frozen_nb, adapted_nb, dims).item() == pytest.approx(topk / (n * K), rel=1e-5)

    residual = adapted - frozen
    rec = sum(residual[i].abs().sum().item() for i in range(n))
    assert reconstruction_loss(residual, reduction="sum").item() == pytest.approx(rec, rel=1e-5)
    assert reconstruction_loss(residual).item() == pytest.approx(rec / residual.numel(), rel=1e-5)  # per item and coordinate


def test_mrl_losses_vanish_at_identity():
    x = torch.randn(6, 8)
    # Only the full width m = d is identical; a prefix changes the geometry.
    assert pairwise_similarity_loss(x, x.clone(), (8,)).item() == pytest.approx(0.0, abs=1e-6)
    assert pairwise_similarity_loss(x, x.clone(), (4,)).item() > 0


def test_mine_corpus_neighbors_matches_brute_force():
    rng = np.random.default_rng(2)
    corpus = unit(rng.normal(size=(30, 8))).astype(np.float32)
    neighbors = mine_corpus_neighbors(corpus, 4)
    similarity = corpus @ corpus.T
    np.fill_diagonal(similarity, -np.inf)
    np.testing.assert_array_equal(neighbors, np.argsort(-similarity, axis=1, kind="stable")[:, :4])
    # A duplicate row may outrank the row itself; the row still never lists itself.
    with_duplicate = np.vstack([corpus, corpus[:1]])
    neighbors = mine_corpus_neighbors(with_duplicate, 3)
    assert neighbors.shape == (31, 3)
    assert not (neighbors == np.arange(31)[:, None]).any()
    assert neighbors[0, 0] == 30 and neighbors[30, 0] == 0


# -- Search-Adaptor losses ----------------------------------------------------------------------


def test_search_adaptor_losses_match_naive_loops():
    generator = torch.Generator().manual_seed(3)
    q, q_hat = torch.randn(3, 6, generator=generator), torch.randn(3, 6, generator=generator)
    c, c_hat = torch.randn(4, 6, generator=generator), torch.randn(4, 6, generator=generator)
    predicted = torch.randn(4, 6, generator=generator)
    relevance = torch.tensor([[1.0, 0, 0, 2], [0, 0, 0, 0], [0, 1, 1, 0]])

    rec_q = sum((q_hat[i] - q[i]).abs().sum().item() for i in range(3))
    rec_c = sum((c_hat[j] - c[j]).abs().sum().item() for j in range(4))
    assert recovery_loss(q, q_hat, c, c_hat, reduction="sum").item() == pytest.approx(rec_q + rec_c, rel=1e-5)
    assert recovery_loss(q, q_hat, c, c_hat).item() == pytest.approx(rec_q / (3 * 6) + rec_c / (4 * 6), rel=1e-5)  # per item and coordinate

    pred = sum(
        relevance[i, j].item() * (q_hat[i] - predicted[j]).abs().sum().item() for i in range(3) for j in range(4)
    )
    assert prediction_loss(q_hat, predicted, relevance, reduction="sum").item() == pytest.approx(pred, rel=1e-5)
    assert prediction_loss(q_hat, predicted, relevance).item() == pytest.approx(pred / relevance.sum().item() / 6, rel=1e-5)


# -- configs and presets ------------------------------------------------------------------------


@pytest.mark.parametrize("config_class", [MRLAdaptorConfig, SearchAdaptorConfig, SMECConfig, AutoencoderConfig])
def test_presets_build_valid_configs(config_class):
    config = config_class.preset("dive-paper", dim=64)
    assert config.dim == 64 and config.epochs == 50 and config.batch_size == 128
    with pytest.raises(ValueError, match="unknown preset"):
        config_class.preset("no-such-paper")


def test_dive_paper_learning_rates():
    assert MRLAdaptorConfig.preset("dive-paper").learning_rate == 2e-4
    assert SearchAdaptorConfig.preset("dive-paper").learning_rate == 2e-4
    assert SMECConfig.preset("dive-paper").learning_rate == 5e-6
    assert {"own-paper"} <= set(MRLAdaptorConfig.PRESETS) & set(SearchAdaptorConfig.PRESETS) & set(SMECConfig.PRESETS)


@pytest.mark.parametrize(
    "config_class, values, message",
    [
        (MRLAdaptorConfig, {"epochs": -1}, "epochs"),
        (MRLAdaptorConfig, {"dim": 8, "nested_dims": (16, 32)}, "must contain"),
        (MRLAdaptorConfig, {"unsupervised_epochs": -1}, "unsupervised_epochs"),
        (SearchAdaptorConfig, {"alpha": -0.1}, "alpha"),
        (SearchAdaptorConfig, {"activation": "swish"}, "activation"),
        (SMECConfig, {"memory_size": 0}, "memory_size"),
        (SMECConfig, {"initial_temperature": 0.0}, "initial_temperature must be a finite number > 0"),
        (AutoencoderConfig, {"learning_rate": 0.0}, "learning_rate"),
        (AutoencoderConfig, {"device": "gpu-please"}, "device"),
    ],
)
def test_configs_reject_bad_values(config_class, values, message):
    with pytest.raises(ValueError, match=message):
        config_class(**values)


def test_mrl_nested_dims_are_normalised_and_round_trip():
    config = MRLAdaptorConfig(dim=8, nested_dims=[32, 8, 16, 8])
    assert config.nested_dims == (8, 16, 32)
    assert MRLAdaptorConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("method", ["mrl-adaptor", "search-adaptor", "smec"])
def test_supervised_methods_need_triplets(method):
    with pytest.raises(ValueError, match="triplets"):
        make_compressor(method, dim=8, epochs=1, progress=False, device="cpu").fit(make_train())
