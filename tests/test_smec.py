"""SMEC: the SMRL schedule, ADS selection and its straight-through mask, and the S-XBM loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embedtune.compress import TrainingData, make_compressor
from embedtune.compress.smec import (
    AdaptiveDimensionSelection,
    CrossBatchMemory,
    gumbel_topk_mask,
    smrl_schedule,
    sxbm_loss,
)

# Tiny tensors: one thread is fastest and stays fast on a busy 2-core machine.
torch.set_num_threads(1)


@pytest.mark.parametrize(
    "d, k, expected",
    [
        (4096, 128, (2048, 1024, 512, 256, 128)),
        (32, 8, (16, 8)),
        (48, 20, (24, 20)),
        (4096, 100, (2048, 1024, 512, 256, 128, 100)),
        (10, 9, (9,)),
    ],
)
def test_smrl_schedule_halves_and_lands_on_k(d, k, expected):
    assert smrl_schedule(d, k) == expected


def test_smrl_schedule_needs_compression():
    with pytest.raises(ValueError, match="dim=32"):
        smrl_schedule(32, 32)


def test_ads_selects_exactly_half_distinct_dims_at_inference():
    selector = AdaptiveDimensionSelection(16, 8)
    with torch.no_grad():
        selector.scores.copy_(torch.randn(16, generator=torch.Generator().manual_seed(0)))
    selected = selector.selected_indices()
    assert len(selected) == 8 and len(set(selected.tolist())) == 8
    assert set(selected.tolist()) == set(torch.topk(selector.scores.detach(), 8).indices.tolist())
    assert selected.tolist() == sorted(selected.tolist())
    x = torch.randn(3, 16)
    torch.testing.assert_close(selector(x), x[:, selected])


def test_ads_with_untrained_scores_is_the_prefix():
    assert AdaptiveDimensionSelection(16, 8).selected_indices().tolist() == list(range(8))


def test_gumbel_mask_is_hard_forward_and_soft_backward():
    generator = torch.Generator().manual_seed(1)
    scores = torch.randn(12, generator=generator, requires_grad=True)
    noise = -torch.log(-torch.log(torch.rand(12, generator=generator)))
    weights = torch.randn(12, generator=generator)

    mask, _ = gumbel_topk_mask(scores, 6, temperature=2.0, noise=noise)
    assert set(mask.detach().tolist()) == {0.0, 1.0} and mask.sum().item() == 6
    assert set(torch.nonzero(mask.detach()).flatten().tolist()) == set(torch.topk(scores.detach() + noise, 6).indices.tolist())
    (mask * weights).sum().backward()
    straight_through = scores.grad.clone()

    scores.grad = None
    _, soft = gumbel_topk_mask(scores, 6, temperature=2.0, noise=noise)
    (soft * weights).sum().backward()
    assert straight_through.abs().sum() > 0
    torch.testing.assert_close(straight_through, scores.grad)
    torch.testing.assert_close(soft.detach(), 6 * torch.softmax((scores.detach() + noise) / 2.0, dim=0))


def test_cross_batch_memory_is_fifo_and_replaces_reenqueued_keys():
    memory = CrossBatchMemory(size=4, dim=2)
    memory.enqueue(torch.eye(2).repeat(2, 1), torch.tensor([0, 1, 2, 3]))
    assert len(memory) == 4
    memory.enqueue(torch.ones(2, 2), torch.tensor([4, 5]))  # overwrites the two oldest
    assert sorted(memory.keys[memory.occupied].tolist()) == [2, 3, 4, 5]
    memory.enqueue(torch.full((1, 2), -1.0), torch.tensor([3]))  # key 3 moves to the newest slot
    assert sorted(memory.keys[memory.occupied].tolist()) == [3, 4, 5]
    torch.testing.assert_close(memory.embeddings[memory.keys == 3][memory.occupied[memory.keys == 3]], torch.full((1, 2), -1.0))


def test_sxbm_neighbors_and_loss_match_naive_loop():
    generator = torch.Generator().manual_seed(2)
    d, D, K = 6, 4, 3
    memory = CrossBatchMemory(size=10, dim=d)
    memory_teacher = torch.randn(8, d, generator=generator)
    memory_keys = torch.arange(8)
    memory.enqueue(memory_teacher, memory_keys)
    teacher = torch.cat([memory_teacher[2:3], torch.randn(3, d, generator=generator)])  # row 0 is queue item 2
    keys = torch.tensor([2, 100, 101, 102])
    projection = torch.randn(d, D, generator=generator)

    def student(x):
        return torch.tanh(x @ projection)

    slots, valid = memory.neighbors(teacher, keys, K)
    assert valid.all() and slots.shape == (4, K)
    neighbor_teacher = memory.embeddings[slots]
    loss_sum = sxbm_loss(teacher, student(teacher), neighbor_teacher, student(neighbor_teacher), valid, reduction="sum")
    loss_mean = sxbm_loss(teacher, student(teacher), neighbor_teacher, student(neighbor_teacher), valid)

    expected = 0.0
    for i in range(len(teacher)):
        candidates = [
            (F.cosine_similarity(teacher[i], memory_teacher[j], dim=0).item(), j) for j in range(8) if memory_keys[j] != keys[i]
        ]
        for _, j in sorted(candidates, reverse=True)[:K]:
            teacher_cos = F.cosine_similarity(teacher[i], memory_teacher[j], dim=0).item()
            student_cos = F.cosine_similarity(student(teacher[i]), student(memory_teacher[j]), dim=0).item()
            expected += abs(teacher_cos - student_cos)
    assert 2 not in memory.keys[slots[0]].tolist()  # an item is never its own neighbour
    assert loss_sum.item() == pytest.approx(expected, rel=1e-5)
    assert loss_mean.item() == pytest.approx(expected / (4 * K), rel=1e-5)


def test_sxbm_with_a_short_queue_marks_missing_neighbors():
    memory = CrossBatchMemory(size=10, dim=3)
    empty_slots, _ = memory.neighbors(torch.randn(2, 3), torch.tensor([0, 1]), 5)
    assert empty_slots.shape == (2, 0)
    memory.enqueue(torch.randn(2, 3), torch.tensor([0, 1]))
    slots, valid = memory.neighbors(torch.randn(2, 3), torch.tensor([0, 7]), 5)
    assert slots.shape == (2, 2)
    assert valid.tolist() == [[True, False], [True, True]]  # row 0 may not match its own key 0
    assert memory.keys[slots[0, 0]].item() == 1


def test_smec_fit_composes_selections_into_k_distinct_indices():
    rng = np.random.default_rng(0)
    triplets = np.array([(q, q % 40, (q * 7 + 3) % 40) for q in range(16)] * 2)
    queries, docs = rng.normal(size=(16, 32)), rng.normal(size=(40, 32))
    train = TrainingData([f"q{i}" for i in range(16)], queries, [f"d{i}" for i in range(40)], docs, {}, triplets)
    smec = make_compressor(
        "smec", dim=6, epochs=2, batch_size=8, learning_rate=1e-3, memory_size=20, progress=False, device="cpu"
    ).fit(train)
    assert smec.stage_dims_ == (16, 8, 6)
    assert [len(scores) for scores in smec.stage_scores_] == [32, 16, 8]
    assert smec.selected_indices_.shape == (6,) and len(np.unique(smec.selected_indices_)) == 6
    # The scores moved, and the S-XBM term was active after the first batch.
    assert any(np.abs(scores).max() > 0 for scores in smec.stage_scores_)
    assert all(record["sxbm_low"] > 0 for record in smec.history_)
    X = train.doc_embeddings
    with torch.no_grad():
        adapted = smec.adapter_(F.normalize(torch.from_numpy(X), dim=-1)).numpy()
    expected = adapted[:, smec.selected_indices_]
    np.testing.assert_allclose(smec.transform(X), expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)


def test_forward_columns_matches_the_full_forward_in_value_and_gradient():
    from embedtune.compress.residual_mlp import ResidualMLP

    torch.manual_seed(0)
    mlp = ResidualMLP(12, 6)
    torch.nn.init.normal_(mlp.down.weight)  # leave the identity, so the residual matters
    x = torch.randn(5, 12)
    columns = torch.tensor([7, 1, 4])
    full = mlp(x)[:, columns]
    full.square().sum().backward()
    expected = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    part = mlp.forward_columns(x, columns)
    part.square().sum().backward()
    torch.testing.assert_close(part, full)
    for got, want in zip((p.grad for p in mlp.parameters()), expected):
        torch.testing.assert_close(got, want)
    assert mlp.down.weight.grad[[0, 2, 3, 5, 6, 8, 9, 10, 11]].abs().sum() == 0  # unread rows get no gradient
    torch.testing.assert_close(mlp.forward_columns(x, None), mlp(x))


def _naive_search(entries: dict[int, torch.Tensor], teacher: torch.Tensor, keys: torch.Tensor, k: int):
    """Top-k (key, cosine) lists by brute force over a {key: embedding} queue."""
    result = []
    for row, key in zip(teacher, keys.tolist()):
        scored = [(F.cosine_similarity(row, emb, dim=0).item(), other) for other, emb in entries.items() if other != key]
        result.append(sorted(scored, reverse=True)[:k])
    return result


@pytest.mark.parametrize("size", [6, 50])  # a full (wrapping) queue and a part-filled one
def test_search_matches_brute_force_over_the_live_entries(size):
    generator = torch.Generator().manual_seed(3)
    memory = CrossBatchMemory(size=size, dim=5)
    ring: list[int | None] = [None] * size  # reference ring buffer: slot -> key
    latest: dict[int, torch.Tensor] = {}
    pointer = 0
    for batch in range(6):
        keys = torch.randint(0, 12, (4,), generator=generator).unique()
        emb = torch.randn(len(keys), 5, generator=generator)
        memory.enqueue(emb, keys)
        for key, row in zip(keys.tolist(), emb):
            if key in ring:  # a re-enqueued key leaves its older slot empty
                ring[ring.index(key)] = None
            ring[pointer] = key  # and the write evicts whatever held the slot
            pointer = (pointer + 1) % size
            latest[key] = row
        live = {key: latest[key] for key in ring if key is not None}
        assert len(memory) == len(live) == int(memory.occupied.sum())
        assert sorted(memory.keys[memory.occupied].tolist()) == sorted(live)
        teacher = torch.randn(3, 5, generator=generator)
        query_keys = torch.tensor([keys[0].item(), 100, keys[-1].item()])
        found = memory.search(teacher, query_keys, 3)
        for row, expected in enumerate(_naive_search(live, teacher, query_keys, 3)):
            got_keys = memory.keys[found.slots[row][found.valid[row]]].tolist()
            assert got_keys == [key for _, key in expected]
            torch.testing.assert_close(found.cosines[row][found.valid[row]], torch.tensor([cos for cos, _ in expected]), atol=1e-6, rtol=0)


def test_enqueue_with_a_key_repeated_in_one_batch_keeps_only_the_last():
    memory = CrossBatchMemory(size=8, dim=2)
    memory.enqueue(torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]]), torch.tensor([5, 6, 5]))
    assert len(memory) == 2 and int(memory.occupied.sum()) == 2
    torch.testing.assert_close(memory.embeddings[memory.occupied & (memory.keys == 5)], torch.tensor([[3.0, 4.0]]))
    torch.testing.assert_close(memory.unit_embeddings[memory.occupied & (memory.keys == 5)], torch.tensor([[0.6, 0.8]]))


def test_stage_epochs_per_stage_or_split_as_one_budget():
    from embedtune.compress.smec import stage_epochs

    assert stage_epochs(50, 3) == (50, 50, 50)
    assert stage_epochs(50, 3, "total") == (17, 17, 16)
    assert stage_epochs(50, 2, "total") == (25, 25)
    assert sum(stage_epochs(7, 5, "total")) == 7
    with pytest.raises(ValueError, match="at least 3"):
        stage_epochs(2, 3, "total")
    with pytest.raises(ValueError, match="epoch_budget"):
        make_compressor("smec", dim=4, epoch_budget="half")


def test_smec_total_epoch_budget_trains_fewer_epochs_per_stage():
    rng = np.random.default_rng(1)
    triplets = np.array([(q, q % 20, (q * 3 + 1) % 20) for q in range(8)])
    train = TrainingData([f"q{i}" for i in range(8)], rng.normal(size=(8, 16)), [f"d{i}" for i in range(20)], rng.normal(size=(20, 16)), {}, triplets)
    per_stage = make_compressor("smec", dim=3, epochs=4, batch_size=4, progress=False).fit(train)
    total = make_compressor("smec", dim=3, epochs=4, batch_size=4, epoch_budget="total", progress=False).fit(train)
    assert per_stage.stage_dims_ == total.stage_dims_ == (8, 4, 3)

    def epochs_by_stage(model):
        counts: dict[str, int] = {}
        for record in model.history_:
            counts[record["stage"]] = counts.get(record["stage"], 0) + 1
        return list(counts.values())

    assert epochs_by_stage(per_stage) == [4, 4, 4]
    assert epochs_by_stage(total) == [2, 1, 1]
