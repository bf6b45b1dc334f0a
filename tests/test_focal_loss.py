"""Focal Embedding Loss against a naive per-query implementation (PACE Eq. 3-7)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from embedtune.finetune.losses import FocalEmbeddingLoss, focal_embedding_loss, focal_weights


def naive_focal_loss(queries, candidates, similarity, temperature, weight_temperature, gamma):
    """Loop over queries with Python floats for the weights, so they cannot carry gradient."""
    n = len(queries)
    losses, weights = [], []
    for i in range(n):
        q = queries[i]
        if similarity == "cosine":
            scores = torch.stack([torch.dot(q, c) / (q.norm() * c.norm()) for c in candidates])
        else:
            scores = torch.stack([torch.dot(q, c) for c in candidates])
        log_pi = scores[i] / temperature - torch.logsumexp(scores / temperature, dim=0)
        losses.append(-log_pi)
        with torch.no_grad():
            cos = torch.stack([torch.dot(q, c) / (q.norm() * c.norm()) for c in candidates])
            p = math.exp(cos[i].item() / weight_temperature) / float(torch.exp(cos / weight_temperature).sum())
        weights.append((1.0 - p) ** gamma)
    total = sum(weights)
    return sum(w * l for w, l in zip(weights, losses)) / total, torch.tensor(weights, dtype=torch.float64)


def make_batch(seed=0, n=6, k=2, d=8, scale=3.0):
    generator = torch.Generator().manual_seed(seed)
    queries = (torch.randn(n, d, generator=generator) * scale).double().requires_grad_()
    candidates = (torch.randn(n * (1 + k), d, generator=generator) * scale).double().requires_grad_()
    return queries, candidates


@pytest.mark.parametrize("similarity,temperature", [("cosine", 0.1), ("dot", 5.0)])
@pytest.mark.parametrize("gamma", [0.5, 2.0, 4.0])
def test_matches_naive_value_and_gradient(similarity, temperature, gamma):
    queries, candidates = make_batch()
    out = focal_embedding_loss(queries, candidates, similarity=similarity, temperature=temperature, weight_temperature=0.2, gamma=gamma)
    fast_grads = torch.autograd.grad(out.loss, (queries, candidates))
    ref, ref_weights = naive_focal_loss(queries, candidates, similarity, temperature, 0.2, gamma)
    ref_grads = torch.autograd.grad(ref, (queries, candidates))
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-10)
    torch.testing.assert_close(out.weights, ref_weights.to(out.weights.dtype), rtol=1e-10, atol=1e-12)
    for fast, slow in zip(fast_grads, ref_grads):
        torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-12)


def test_weights_carry_no_gradient():
    queries, candidates = make_batch(1)
    out = focal_embedding_loss(queries, candidates, gamma=2.0)
    assert not out.weights.requires_grad and not out.confidence.requires_grad
    grad_stopped = torch.autograd.grad(out.loss, queries)[0]
    # The same objective with differentiable weights has a different gradient: the stop-gradient matters.
    from embedtune.finetune.losses import per_query_contrastive_loss

    per_query, _ = per_query_contrastive_loss(queries, candidates, torch.arange(len(queries)), "cosine", 0.1)
    p = torch.exp(-per_query)  # with τ_w = τ and cosine, p_i = π_i
    live = (1 - p) ** 2
    grad_live = torch.autograd.grad((live * per_query).sum() / live.sum(), queries, retain_graph=True)[0]
    detached = live.detach()
    grad_detached = torch.autograd.grad((detached * per_query).sum() / detached.sum(), queries)[0]
    torch.testing.assert_close(grad_stopped, grad_detached)
    assert not torch.allclose(grad_stopped, grad_live)


def test_unit_mean_normalisation():
    queries, candidates = make_batch(2)
    out = focal_embedding_loss(queries, candidates, gamma=2.0)
    normalised = out.weights / out.weights.mean()
    assert normalised.mean().item() == pytest.approx(1.0)
    assert out.loss.item() == pytest.approx((normalised * out.per_query_loss).mean().item(), rel=1e-12)
    # Weights are confidence-ordered: the least confident query gets the largest weight.
    assert torch.argmax(out.weights) == torch.argmin(out.confidence)


def test_gamma_zero_and_none_are_infonce_like_sentence_transformers():
    from sentence_transformers import SentenceTransformer  # noqa: F401  (model-free use below)
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    queries, candidates = make_batch(3, n=5, k=2)
    n = len(queries)
    columns = [queries, *candidates.split(n)]
    mnrl = MultipleNegativesRankingLoss.__new__(MultipleNegativesRankingLoss)
    torch.nn.Module.__init__(mnrl)
    from sentence_transformers.util import cos_sim

    mnrl.scale, mnrl.similarity_fct, mnrl.gather_across_devices = 10.0, cos_sim, False
    mnrl.directions, mnrl.partition_mode, mnrl.hardness_mode, mnrl.hardness_strength = ("query_to_doc",), "joint", None, 0.0
    expected = mnrl.compute_loss_from_embeddings(columns, None)
    for kwargs in ({"weighting": "none"}, {"gamma": 0.0}):
        out = focal_embedding_loss(queries, candidates, temperature=0.1, **kwargs)
        assert out.loss.item() == pytest.approx(expected.item(), rel=1e-9)


def test_confidence_uses_cosine_even_for_dot_training():
    queries, candidates = make_batch(4)
    scaled = (queries * 7.0).detach().requires_grad_()
    a = focal_embedding_loss(queries, candidates, similarity="dot", temperature=5.0)
    b = focal_embedding_loss(scaled, candidates, similarity="dot", temperature=5.0)
    torch.testing.assert_close(a.confidence, b.confidence)  # norms do not change p_i ...
    assert not torch.allclose(a.per_query_loss, b.per_query_loss)  # ... but they change the dot logits


def test_variant_weights():
    queries, candidates = make_batch(5)
    q, c = queries.detach(), candidates.detach()
    positives = torch.arange(len(q))
    cos = torch.nn.functional.normalize(q, dim=1) @ torch.nn.functional.normalize(c, dim=1).T
    qp, _ = focal_weights(q, c, positives, "qp", gamma=2.0)
    torch.testing.assert_close(qp, ((1 - cos.diagonal()) / 2) ** 2)
    qn, _ = focal_weights(q, c, positives, "qn", gamma=2.0)
    masked = cos.clone()
    masked[positives, positives] = -2
    torch.testing.assert_close(qn, ((1 + masked.max(dim=1).values) / 2) ** 2)
    none, _ = focal_weights(q, c, positives, "none")
    assert torch.equal(none, torch.ones(len(q), dtype=none.dtype))
    r1, _ = focal_weights(q, c, positives, "random", generator=torch.Generator().manual_seed(3))
    r2, _ = focal_weights(q, c, positives, "random", generator=torch.Generator().manual_seed(3))
    assert torch.equal(r1, r2) and (r1 >= 0).all() and (r1 <= 1).all()


def test_local_normalisation_is_per_block_mean():
    queries, candidates = make_batch(6, n=6)
    out_local = focal_embedding_loss(queries, candidates, normalize="local", groups=2)
    out_global = focal_embedding_loss(queries, candidates, normalize="global", groups=2)
    a, l = out_local.weights, out_local.per_query_loss.detach()
    blocks = [(a[s] * l[s]).sum() / a[s].sum() for s in (slice(0, 3), slice(3, 6))]
    assert out_local.loss.item() == pytest.approx(float(sum(blocks) / 2))
    assert out_global.loss.item() == pytest.approx(float((a * l).sum() / a.sum()))
    with pytest.raises(ValueError, match="equal blocks"):
        focal_embedding_loss(queries[:5], candidates, normalize="local", groups=2)


def test_components_and_positive_accuracy():
    queries = torch.eye(4, dtype=torch.float64) * 2
    candidates = torch.cat([torch.eye(4, dtype=torch.float64), -torch.eye(4, dtype=torch.float64)])
    out = focal_embedding_loss(queries, candidates)
    components = out.components()
    assert components["positive_accuracy"] == 1.0
    assert set(components) == {"loss", "mean_weight", "mean_confidence", "positive_accuracy"}
    assert 0 < components["mean_confidence"] <= 1 and components["mean_weight"] >= 0


def test_invalid_options_list_the_valid_ones():
    model = torch.nn.Identity()
    with pytest.raises(ValueError, match=r"\['cosine', 'dot'\]"):
        FocalEmbeddingLoss(model, similarity="euclid")
    with pytest.raises(ValueError, match="focal"):
        FocalEmbeddingLoss(model, weighting="hard")
    with pytest.raises(ValueError, match="global"):
        FocalEmbeddingLoss(model, normalize="batch")
    with pytest.raises(ValueError, match="temperature"):
        FocalEmbeddingLoss(model, temperature=0)


def test_module_on_tiny_model_logs_components(tiny_bert_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    loss = FocalEmbeddingLoss(model, similarity="dot", temperature=2.0)
    texts = [["what about topic 1", "what about topic 2"], ["document number 1", "document number 2"], ["title 3", "title 4"]]
    features = [model.preprocess(column) for column in texts]
    value = loss(features, None)
    value.backward()
    assert value.ndim == 0 and math.isfinite(value.item())
    assert any(p.grad is not None for p in model.parameters())
    components = loss.pop_components()
    assert components and loss.pop_components() == {}
    json.dumps(loss.get_config_dict())
    assert "PACE" in loss.citation
