"""Quantisation-aware DIVE: straight-through quantisers, the deployed hinge, the config option, save/load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedtune.compress import TrainingData, load_compressor
from embedtune.compress.dive import DIVECompressor, DIVEConfig
from embedtune.compress.losses import self_limiting_triplet_loss
from embedtune.index.codecs import Calibration
from embedtune.compress.quantization_aware import (
    deployed_view,
    quantization_aware_triplet_loss,
    straight_through_int8,
    straight_through_sign,
)
from embedtune.data.triplets import mine_triplets

torch.set_num_threads(1)


def test_straight_through_sign_forward_is_signs_backward_is_identity():
    x = torch.tensor([[0.6, -0.8, 0.0, 0.2]], requires_grad=True)
    y = straight_through_sign(x)
    norm = float(x.detach().norm())
    assert torch.allclose(y, torch.tensor([[1.0, -1.0, -1.0, 1.0]]) * norm / 2)
    (y * torch.tensor([[1.0, 2.0, 3.0, 4.0]])).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[1.0, 2.0, 3.0, 4.0]]))


def test_straight_through_int8_matches_the_sq8_codes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 6)).astype(np.float32)
    calibration = Calibration.fit(x)
    expected = calibration.decode(calibration.encode(x))
    t = torch.from_numpy(x).requires_grad_()
    y = straight_through_int8(t)
    np.testing.assert_allclose(y.detach().numpy(), expected, atol=1e-6)
    y.sum().backward()
    assert torch.equal(t.grad, torch.ones_like(t))
    _, docs = deployed_view("int8", x[:3], x)
    np.testing.assert_allclose(docs, expected, atol=1e-6)


def test_deployed_hinge_sees_the_quantised_documents():
    rng = np.random.default_rng(1)
    q, p, n = (torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32)) for _ in range(3))
    plain, _ = quantization_aware_triplet_loss(None, q, p, n, 0.4)
    assert torch.equal(plain, self_limiting_triplet_loss(q, p, n, 0.4)[0])
    binary, ratio = quantization_aware_triplet_loss("binary", q, p, n, 0.4)
    sign = lambda t: torch.where(t > 0, 1.0, -1.0)  # noqa: E731
    expected = 0.5 * (self_limiting_triplet_loss(q, sign(p), sign(n), 0.4)[0] + self_limiting_triplet_loss(sign(q), sign(p), sign(n), 0.4)[0])
    assert torch.allclose(binary, expected) and not torch.allclose(binary, plain)
    assert 0 <= float(ratio) <= 1
    with pytest.raises(ValueError, match="quantization_aware must be"):
        quantization_aware_triplet_loss("int4", q, p, n, 0.4)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def toy() -> TrainingData:
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((150, 32)).astype(np.float32)
    targets = rng.choice(150, size=30, replace=False)
    queries = docs[targets] + 0.8 * rng.standard_normal((30, 32)).astype(np.float32)
    query_ids, doc_ids = [f"q{i}" for i in range(30)], [f"d{i}" for i in range(150)]
    qrels = {qid: {doc_ids[t]: 1} for qid, t in zip(query_ids, targets)}
    triplets = mine_triplets(query_ids, queries, doc_ids, docs, qrels, n_negatives=2, negatives="random", seed=2027)
    return TrainingData(query_ids, queries, doc_ids, docs, qrels, triplets)


def test_dive_option_trains_differently_and_round_trips(toy, tmp_path):
    config = dict(dim=8, heads=2, epochs=3, batch_size=32, learning_rate=3e-3, device="cpu", progress=False)
    with pytest.raises(ValueError, match="quantization_aware must be"):
        DIVEConfig(**config, quantization_aware="int4")
    float_fit = DIVECompressor(DIVEConfig(**config)).fit(toy)
    binary_fit = DIVECompressor(DIVEConfig(**config, quantization_aware="binary")).fit(toy)
    assert not np.array_equal(float_fit.transform(toy.doc_embeddings), binary_fit.transform(toy.doc_embeddings))
    binary_fit.save(tmp_path / "qat")
    loaded = load_compressor(tmp_path / "qat")
    assert loaded.config.quantization_aware == "binary"
    assert np.array_equal(loaded.transform(toy.doc_embeddings), binary_fit.transform(toy.doc_embeddings))
    # Epoch selection scores the deployed precision, and the fit is deterministic.
    selected = dict(config, epoch_selection="best", selection_fraction=0.5, quantization_aware="int8")
    a = DIVECompressor(DIVEConfig(**selected)).fit(toy)
    b = DIVECompressor(DIVEConfig(**selected)).fit(toy)
    assert a.selected_epoch_ == b.selected_epoch_
    assert np.array_equal(a.transform(toy.doc_embeddings), b.transform(toy.doc_embeddings))
