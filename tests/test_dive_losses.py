"""DIVE's three losses against naive loop implementations, and the hinge's zero gradient."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from embedtune.compress.dive import DIVEAdapter
from embedtune.compress.losses import (
    GeometryDistillationLoss,
    HeadwiseNTXentLoss,
    SelfLimitingTripletLoss,
    geometry_distillation_loss,
    headwise_ntxent_loss,
    self_limiting_triplet_loss,
)

torch.set_num_threads(1)  # tiny tensors: a second thread only adds sync cost on a busy 2-core machine


def _unit(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=generator, dtype=torch.float64), dim=-1)


def _triplets_with_known_deltas(margin: float):
    """Rows 0-2 satisfy the margin by construction, rows 3-5 violate it."""
    k = 6
    query = torch.zeros(6, k, dtype=torch.float64)
    query[:, 0] = 1.0
    positive = _unit(6, k, seed=1).clone()
    negative = _unit(6, k, seed=2).clone()
    positive[:3] = F.normalize(query[:3] + 0.05 * positive[:3], dim=-1)  # cos(q, p) ≈ 1
    negative[:3, 0] = -1.0  # cos(q, n) < 0
    negative[:3] = F.normalize(negative[:3], dim=-1)
    negative[3:] = F.normalize(query[3:] + 0.05 * negative[3:], dim=-1)  # cos(q, n) ≈ 1, so Δ ≈ cos(q,p) - 1 < m
    tensors = [t.clone().requires_grad_(True) for t in (query, positive, negative)]
    delta = (tensors[0] * tensors[1]).sum(-1) - (tensors[0] * tensors[2]).sum(-1)
    assert (delta[:3] >= margin).all() and (delta[3:] < margin).all()
    return tensors, delta.detach()


def test_hinge_gradient_is_exactly_zero_for_satisfied_triplets_only():
    margin = 0.7
    (query, positive, negative), delta = _triplets_with_known_deltas(margin)
    loss, active_ratio = self_limiting_triplet_loss(query, positive, negative, margin, "hinge")
    loss.backward()
    for tensor in (query, positive, negative):
        assert torch.equal(tensor.grad[:3], torch.zeros_like(tensor.grad[:3]))
        assert (tensor.grad[3:].abs().sum(-1) > 0).all()
    assert active_ratio.item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(torch.clamp(margin - delta, min=0).mean().item())


def test_softplus_ablation_keeps_gradient_on_satisfied_triplets():
    margin = 0.7
    (query, positive, negative), delta = _triplets_with_known_deltas(margin)
    loss, active_ratio = self_limiting_triplet_loss(query, positive, negative, margin, "softplus")
    loss.backward()
    assert (query.grad[:3].abs().sum(-1) > 0).all()
    assert active_ratio.item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(F.softplus(margin - delta).mean().item())


def test_triplet_loss_matches_naive_loop():
    query, positive, negative = (torch.randn(9, 5, generator=torch.Generator().manual_seed(s)) for s in (3, 4, 5))
    loss, active_ratio = self_limiting_triplet_loss(query, positive, negative, margin=0.3)
    hinges, active = [], 0
    for q, p, n in zip(query.tolist(), positive.tolist(), negative.tolist()):
        def cos(a, b):
            return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

        delta = cos(q, p) - cos(q, n)
        hinges.append(max(0.0, 0.3 - delta))
        active += delta < 0.3
    assert loss.item() == pytest.approx(sum(hinges) / 9, abs=1e-6)
    assert active_ratio.item() == pytest.approx(active / 9)


def _naive_ntxent(heads: torch.Tensor, temperature: float) -> torch.Tensor:
    batch, n_heads, _ = heads.shape
    total = heads.new_zeros(())
    for i in range(batch):
        for h in range(n_heads):
            anchor = heads[i, h]
            denominator = heads.new_zeros(())
            for j in range(batch):
                for g in range(n_heads):
                    if (j, g) != (i, h):
                        denominator = denominator + torch.exp(anchor @ heads[j, g] / temperature)
            term = heads.new_zeros(())
            for h2 in range(n_heads):
                if h2 != h:
                    term = term + torch.log(torch.exp(anchor @ heads[i, h2] / temperature) / denominator)
            total = total - term / (n_heads - 1)
    return total / (batch * n_heads)


@pytest.mark.parametrize("batch,n_heads,temperature", [(5, 3, 0.1), (1, 2, 0.5), (4, 4, 1.0)])
def test_headwise_ntxent_matches_naive_loop_value_and_gradient(batch, n_heads, temperature):
    heads = _unit(batch, n_heads, 6, seed=batch * 10 + n_heads).requires_grad_(True)
    fast = headwise_ntxent_loss(heads, temperature)
    (fast_grad,) = torch.autograd.grad(fast, heads)
    slow = _naive_ntxent(heads, temperature)
    (slow_grad,) = torch.autograd.grad(slow, heads)
    assert fast.item() == pytest.approx(slow.item(), rel=1e-10)
    assert torch.allclose(fast_grad, slow_grad, rtol=1e-8, atol=1e-12)


def test_headwise_ntxent_rejects_a_single_head():
    with pytest.raises(ValueError, match="at least 2 heads"):
        headwise_ntxent_loss(_unit(4, 1, 3, seed=0))


def _naive_smooth_l1(x: float, y: float, beta: float = 1.0) -> float:
    diff = abs(x - y)
    return 0.5 * diff * diff / beta if diff < beta else diff - 0.5 * beta


def test_geometry_distillation_matches_naive_loop_on_both_smooth_l1_branches():
    generator = torch.Generator().manual_seed(7)
    student = 1.5 * torch.randn(7, 4, generator=generator, dtype=torch.float64)  # unnormalised: reach |diff| > 1
    teacher = _unit(7, 9, seed=8)
    fast = geometry_distillation_loss(student, teacher)
    terms, branches = [], set()
    for i in range(7):
        for j in range(7):
            if i != j:
                s = float(student[i] @ student[j])
                t = float(teacher[i] @ teacher[j])
                branches.add(abs(s - t) < 1.0)
                terms.append(_naive_smooth_l1(s, t))
    assert branches == {True, False}
    assert fast.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)


def test_geometry_distillation_is_zero_for_a_single_item():
    assert geometry_distillation_loss(_unit(1, 4, seed=0), _unit(1, 8, seed=1)).item() == 0.0


def test_loss_modules_embed_then_delegate_to_the_pure_functions():
    torch.manual_seed(0)
    adapter = DIVEAdapter(input_dim=32, dim=8, heads=4, hidden_dim=16)
    torch.nn.init.normal_(adapter.mlp.down.weight, std=0.1)  # leave the identity, so heads differ from inputs
    batch = {name: torch.randn(6, 32) for name in ("query", "positive", "negative")}
    heads = {name: adapter(x) for name, x in batch.items()}

    triplet = SelfLimitingTripletLoss(adapter, margin=0.7)
    loss, ratio = triplet(batch)
    expected, expected_ratio = self_limiting_triplet_loss(*(heads[n][:, 0] for n in ("query", "positive", "negative")), 0.7)
    assert torch.allclose(loss, expected) and torch.equal(ratio, expected_ratio)

    view = HeadwiseNTXentLoss(adapter, temperature=0.1)
    expected_view = sum(headwise_ntxent_loss(h, 0.1) for h in heads.values()) / 3
    assert torch.allclose(view(batch), expected_view)

    geometry = GeometryDistillationLoss(adapter)
    stacked = torch.cat(list(batch.values()))
    expected_geo = geometry_distillation_loss(adapter(stacked)[:, 0], F.normalize(stacked, dim=-1))
    assert torch.allclose(geometry(batch), expected_geo)

    for module in (triplet, view, geometry):
        json.dumps(module.get_config_dict())
        assert "2605.20689" in module.citation


def test_invalid_options_list_the_valid_ones():
    adapter = DIVEAdapter(input_dim=8, dim=4, heads=2, hidden_dim=4)
    with pytest.raises(ValueError, match="hinge.*softplus"):
        SelfLimitingTripletLoss(adapter, kind="squared")
    with pytest.raises(ValueError, match="temperature"):
        HeadwiseNTXentLoss(adapter, temperature=0.0)
