"""GradCache Focal Embedding Loss: gradients equal the uncached loss (tiny random BERT)."""

from __future__ import annotations

import pytest
import torch

from embedtune.finetune.losses import DEEPSPEED_GRADCACHE_MESSAGE, CachedFocalEmbeddingLoss, FocalEmbeddingLoss

TEXTS = [
    [f"what about topic {i % 5} number {i}" for i in range(6)],
    [f"document number {i} about topic {i % 5}" for i in range(6)],
    [f"title {i + 7} about topic {(i + 2) % 5}" for i in range(6)],
    [f"document number {i + 20} about" for i in range(6)],
]


def _gradients(model, loss, texts):
    model.zero_grad()
    features = [model.preprocess(column) for column in texts]
    value = loss(features, None)
    value.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return value.detach(), grads, loss.pop_components()


@pytest.mark.parametrize("similarity,temperature,mini_batch_size", [("cosine", 0.1, 2), ("dot", 3.0, 4)])
def test_cached_gradients_equal_uncached(tiny_bert_dir, similarity, temperature, mini_batch_size):
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    model.eval()  # no dropout: both losses see the same embeddings
    options = dict(similarity=similarity, temperature=temperature, weight_temperature=0.1, gamma=2.0)
    plain_value, plain_grads, plain_components = _gradients(model, FocalEmbeddingLoss(model, **options), TEXTS)
    cached = CachedFocalEmbeddingLoss(model, mini_batch_size=mini_batch_size, **options)
    cached_value, cached_grads, cached_components = _gradients(model, cached, TEXTS)
    assert cached_value.item() == pytest.approx(plain_value.item(), rel=1e-5)
    assert plain_grads.keys() == cached_grads.keys() and plain_grads
    for name in plain_grads:
        torch.testing.assert_close(cached_grads[name], plain_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    for key in plain_components:
        assert cached_components[key] == pytest.approx(plain_components[key], rel=1e-5, abs=1e-6)
    assert cached.similarity == similarity and cached.get_config_dict()["mini_batch_size"] == mini_batch_size


def test_cached_loss_refuses_deepspeed(tiny_bert_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    loss = CachedFocalEmbeddingLoss(model, mini_batch_size=2)

    class DeepSpeedEngine(torch.nn.Module):  # stands in for deepspeed.DeepSpeedEngine (same class name)
        pass

    loss.model = DeepSpeedEngine()
    with pytest.raises(RuntimeError, match="GradCache"):
        loss([model.preprocess(column) for column in TEXTS[:2]], None)


def test_config_refuses_gradcache_with_deepspeed(tmp_path):
    from embedtune.finetune import PACEConfig

    ds_config = tmp_path / "ds.json"
    ds_config.write_text("{}")
    with pytest.raises(ValueError) as error:
        PACEConfig(mini_batch_size=8, deepspeed=str(ds_config))
    assert str(error.value) == DEEPSPEED_GRADCACHE_MESSAGE
