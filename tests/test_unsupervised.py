"""Fitting on corpus vectors alone: the trait, every method that supports it, DIVE's unsupervised mode."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from embedtune.compress import (
    DIVECompressor,
    DIVEConfig,
    TrainingData,
    available_methods,
    get_compressor_class,
    load_compressor,
    make_compressor,
    unsupervised_methods,
)
from embedtune.compress.losses import neighbor_rank_distillation_loss
from embedtune.compress.mrl_adaptor import MRLAdaptorCompressor, MRLAdaptorConfig

torch.set_num_threads(1)  # tiny tensors on a busy machine

D, K = 32, 8
FAST = {"dim": K, "epochs": 2, "unsupervised_epochs": 1, "batch_size": 32, "progress": False, "device": "cpu", "seed": 5}


@pytest.fixture(scope="module")
def corpus() -> np.ndarray:
    """200 documents in 8 clusters with a few dominant directions (so PCA and neighbourhoods mean something)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(8, D)) * np.linspace(3, 0.5, D)
    docs = centres[rng.integers(0, 8, 200)] + 0.7 * rng.normal(size=(200, D)) + 2.0  # an offset: centring matters
    return docs.astype(np.float32)


def _build(method: str, **overrides):
    cls = get_compressor_class(method)
    preset = cls.get_preset(cls.unsupervised_preset).settings if cls.unsupervised_preset else {}
    known = {field.name for field in dataclasses.fields(cls.config_class)}
    values = {**preset, **{k: v for k, v in {**FAST, **overrides}.items() if k in known}}
    return cls(cls.config_class(**values))


def test_the_trait_lists_methods_and_the_others_refuse_with_the_fix(corpus):
    library = [m for m in available_methods() if get_compressor_class(m).__module__.startswith("embedtune.")]
    assert {"frozen", "truncate", "pca", "pca-uncentred", "autoencoder", "mrl-adaptor", "dive"} <= set(unsupervised_methods())
    for method in library:
        cls = get_compressor_class(method)
        if cls.supports_unsupervised:
            continue
        with pytest.raises(ValueError, match=f"{method} cannot be fitted without labels.*unsupervised_methods"):
            _build(method).fit_unsupervised(corpus)


@pytest.mark.parametrize("method", [m for m in unsupervised_methods() if get_compressor_class(m).__module__.startswith("embedtune.")])
def test_every_unsupervised_method_fits_on_documents_alone_and_ignores_queries(method, corpus, tmp_path):
    rng = np.random.default_rng(1)
    compressor = _build(method).fit_unsupervised(corpus)
    assert compressor.is_unsupervised
    out = compressor.transform(corpus[:7])
    assert out.shape == (7, compressor.output_dim) and np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)
    # Queries and labels handed over with the documents are dropped: the same fit.
    queries = rng.normal(size=(5, D)).astype(np.float32)
    with_queries = TrainingData([f"q{i}" for i in range(5)], queries, [f"d{i}" for i in range(len(corpus))], corpus,
                                {"q0": {"d0": 1}}, np.array([[0, 0, 1]]))
    again = _build(method).fit_unsupervised(with_queries)
    np.testing.assert_allclose(again.transform(corpus[:7]), out, atol=1e-6)
    # The mode survives save/load.
    loaded = load_compressor(compressor.save(tmp_path / method))
    assert loaded.is_unsupervised
    np.testing.assert_allclose(loaded.transform(corpus[:7]), out, atol=1e-6)


def test_mrl_adaptor_unsupervised_stage_runs_alone(corpus):
    compressor = MRLAdaptorCompressor(MRLAdaptorConfig(**{**FAST, "epochs": 0, "unsupervised_epochs": 2}))
    compressor.fit(TrainingData.corpus_only(corpus))  # epochs=0: no triplets needed
    assert [row["stage"] for row in compressor.history_] == ["mrl-adaptor/unsupervised"] * 2
    assert compressor.adapter_.down.weight.abs().sum() > 0  # the corpus stage trained
    with pytest.raises(ValueError, match="needs training triplets"):
        MRLAdaptorCompressor(MRLAdaptorConfig(**FAST)).fit(TrainingData.corpus_only(corpus))
    with pytest.raises(ValueError, match="leave nothing to train"):
        MRLAdaptorConfig(dim=K, epochs=0, unsupervised_epochs=0)
    with pytest.raises(ValueError, match="unsupervised_epochs=0"):
        MRLAdaptorCompressor(MRLAdaptorConfig(dim=K, unsupervised_epochs=0)).fit_unsupervised(corpus)


def test_neighbor_rank_distillation_is_zero_on_a_perfect_copy_and_leaves_the_anchor_out():
    rng = np.random.default_rng(2)
    pool = torch.nn.functional.normalize(torch.tensor(rng.normal(size=(12, 6)), dtype=torch.float32), dim=-1)
    slots = torch.tensor([0, 3, 5])
    assert float(neighbor_rank_distillation_loss(pool[slots], pool, pool[slots], pool, slots)) == pytest.approx(0.0, abs=1e-6)
    shuffled = pool[torch.randperm(12, generator=torch.Generator().manual_seed(0))]
    student = shuffled.clone().requires_grad_(True)
    loss = neighbor_rank_distillation_loss(student[slots], student, pool[slots], pool, slots)
    assert float(loss.detach()) > 0.01
    loss.backward()
    assert torch.isfinite(student.grad).all()
    # One anchor whose own pool row differs: only the (excluded) self-similarity changes.
    moved = pool.clone()
    moved[0] = torch.nn.functional.normalize(torch.ones(6), dim=0)
    one = torch.tensor([0])
    assert float(neighbor_rank_distillation_loss(pool[one], moved, pool[one], pool, one)) == pytest.approx(0.0, abs=1e-6)
    assert float(neighbor_rank_distillation_loss(pool[one], moved, pool[one], pool, torch.tensor([-1]))) > 0.01
    # Standardised, the loss ignores the scale of the similarities (an anisotropic space); raw, it does not.
    scaled = pool * 3.0
    kwargs = {"temperature": 0.5}
    reference = neighbor_rank_distillation_loss(shuffled[slots], shuffled, pool[slots], pool, slots, **kwargs)
    assert float(neighbor_rank_distillation_loss(shuffled[slots], shuffled, scaled[slots], scaled, slots, **kwargs)) == pytest.approx(float(reference), rel=1e-5)
    raw = {"temperature": 0.5, "standardize": False}
    assert float(neighbor_rank_distillation_loss(shuffled[slots], shuffled, scaled[slots], scaled, slots, **raw)) != pytest.approx(
        float(neighbor_rank_distillation_loss(shuffled[slots], shuffled, pool[slots], pool, slots, **raw)), rel=1e-3)


def test_neighbor_rank_distillation_has_a_finite_gradient_when_every_score_is_equal():
    """Identical pool items (duplicate documents) give an anchor equal scores: the standardisation's floor must not make NaN."""
    same = torch.nn.functional.normalize(torch.ones(5, 4), dim=-1)
    student = same.clone().requires_grad_(True)
    query = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), dim=-1).requires_grad_(True)
    loss = neighbor_rank_distillation_loss(query, student, query.detach(), same, torch.tensor([-1]))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-6)
    assert torch.isfinite(student.grad).all() and torch.isfinite(query.grad).all()


def test_dive_unsupervised_starts_at_the_better_pca_projection(corpus):
    """With no epochs, unsupervised DIVE is exactly the PCA projection (centred or not) that recovers held-out neighbours better."""
    dive = DIVECompressor(DIVEConfig.preset("unsupervised", dim=K, epochs=0, progress=False, device="cpu", seed=5))
    dive.fit_unsupervised(corpus)
    start = dive.history_[0]
    assert start["epoch"] == 0 and start["start"] in ("centred", "uncentred")
    winner = "pca" if start["start"] == "centred" else "pca-uncentred"
    # The PCA baselines see raw rows; DIVE normalises its input first: compare on unit rows.
    unit = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    pca = make_compressor(winner, dim=K).fit_unsupervised(unit)
    np.testing.assert_allclose(np.abs(dive.transform(unit)), np.abs(pca.transform(unit)), atol=1e-4)
    # The offset of the corpus makes the two starts differ, so the choice was a real one.
    other = make_compressor("pca-uncentred" if winner == "pca" else "pca", dim=K).fit_unsupervised(unit)
    assert not np.allclose(np.abs(other.transform(unit)), np.abs(pca.transform(unit)), atol=1e-2)
    assert dive.selected_epoch_ == 0


def test_dive_unsupervised_keeps_the_best_epoch_on_held_out_documents_and_is_deterministic(corpus):
    config = DIVEConfig.preset("unsupervised", dim=K, epochs=4, batch_size=32, progress=False, device="cpu", seed=5, holdout_docs=40)
    dive = DIVECompressor(config).fit_unsupervised(corpus)
    kls = {row["epoch"]: row["holdout_rank_kl"] for row in dive.history_[1:]}
    start = min(value for key, value in dive.history_[0].items() if key.startswith("holdout_rank_kl_"))
    kls[0] = start
    best = min(kls.values())
    assert kls[dive.selected_epoch_] == best
    assert min(e for e, s in kls.items() if s == best) == dive.selected_epoch_  # ties keep the earlier epoch
    assert dive.selected_epoch_ == 0 or best < start  # never worse than the better PCA start on the selection signal
    assert all(0 <= row["holdout_neighbor_recall@10"] <= 1 for row in dive.history_[1:])
    assert dive.fit_details()["start"].endswith("PCA")
    again = DIVECompressor(config).fit_unsupervised(corpus)
    np.testing.assert_array_equal(again.transform(corpus), dive.transform(corpus))
    # With patience, training stops that many epochs after the last improvement (or at the cap).
    patient = DIVECompressor(dataclasses.replace(config, epochs=30, patience=2)).fit_unsupervised(corpus)
    ran = len(patient.history_) - 1
    assert ran == 30 or ran - patient.selected_epoch_ == 2
    assert ran < 30  # this corpus plateaus long before the cap


def test_dive_unsupervised_trains_away_from_the_start_when_that_helps():
    """Clusters that a k=2 projection merges but a curved map can keep apart: training must beat the start."""
    rng = np.random.default_rng(3)
    # 6 tight clusters spread over 6 equal-variance directions: any 2-d linear projection merges some.
    centres = np.eye(12)[:6] * 3.0
    docs = (centres[rng.integers(0, 6, 300)] + 0.05 * rng.normal(size=(300, 12))).astype(np.float32)
    config = DIVEConfig.preset("unsupervised", dim=2, epochs=15, batch_size=64, heads=2, progress=False, device="cpu",
                               seed=1, holdout_docs=30, learning_rate=3e-3)
    dive = DIVECompressor(config).fit_unsupervised(docs)
    start = dive.history_[0]
    assert dive.selected_epoch_ > 0
    selected = dive.history_[dive.selected_epoch_]
    assert selected["holdout_rank_kl"] < 0.9 * min(v for k, v in start.items() if k.startswith("holdout_rank_kl_"))
    assert selected["holdout_neighbor_recall@10"] > max(v for k, v in start.items() if k.startswith("holdout_neighbor_recall@10_"))


def test_dive_unsupervised_config_checks():
    with pytest.raises(ValueError, match="mode must be one of"):
        DIVEConfig(mode="self")
    with pytest.raises(ValueError, match="neighbor_temperature"):
        DIVEConfig(mode="unsupervised", neighbor_temperature=0)
    with pytest.raises(ValueError, match="max_train_docs"):
        DIVEConfig(max_train_docs=1)
    tiny = np.random.default_rng(0).normal(size=(8, D)).astype(np.float32)
    with pytest.raises(ValueError, match="leave none"):
        DIVECompressor(DIVEConfig(dim=K, progress=False, device="cpu")).fit_unsupervised(tiny)
    # The switch is recorded in the config (so save() keeps it) and the supervised path is untouched.
    assert DIVECompressor.unsupervised_config(DIVEConfig(dim=K)).mode == "unsupervised"
    with pytest.raises(ValueError, match="needs training triplets"):
        DIVECompressor(DIVEConfig(dim=K, progress=False)).fit(TrainingData.corpus_only(tiny))
