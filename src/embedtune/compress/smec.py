"""SMEC (Zhang et al., EMNLP 2025): sequential Matryoshka compression with learned dimension selection.

The learned map is ``g = ResidualMLP`` (DIVE's adapter shape, identity at initialisation)
followed by a stack of dimension selections; the compressed embedding of ``x`` is
``g(x)[idx] / ‖g(x)[idx]‖₂`` with ``idx`` the composition of the selections (``k`` indices into
``d``, a subset, not a prefix). Its three parts:

(a) Sequential Matryoshka representation learning (SMRL). Compression runs in halving stages
    ``d → d/2 → … → k``; the last stage lands exactly on ``k`` (``d=4096, k=128``:
    4096→2048→1024→512→256→128; ``d=48, k=20``: 48→24→20). A stage from ``D`` to ``D'``
    trains ``L(x_D) + L(x_{D'})``, where ``x_D`` is the stage's input (``g(x)`` under the frozen
    selections of the earlier stages) and ``x_{D'}`` its selected subset.
(b) Adaptive dimension selection (ADS). Each stage learns one importance score per current
    dimension and keeps ``D'`` of them. Training samples a Gumbel top-``D'`` mask with a
    straight-through estimator: the forward pass multiplies ``x_D`` by the hard ``D'``-hot mask
    of ``top_{D'}(s + G)``, the backward pass uses the soft scores ``D'·softmax((s + G)/τ)``.
    ``τ`` is annealed linearly from 5 to 1 over each stage's steps. Inference keeps the hard
    top-``D'`` of the learned scores (no noise).
(c) Selectable cross-batch memory (S-XBM). A FIFO queue holds the frozen (teacher) embeddings
    of the last 5000 items seen in training. For each item ``x_i`` of a batch, its top-10 queue
    neighbours ``m_j`` by teacher cosine give
    ``L_u = Σ_i Σ_j |cos(x_i, m_j) − cos(g(x_i), g(m_j))|`` (student at the current level).

The supervised loss is the rank loss of :mod:`embedtune.compress.rank_loss`; each level's loss is
``L = L_rank + α L_u``.

Choices the paper leaves open, and ours:

- What a stage trains: ``g`` is trained in every stage together with the stage's scores;
  the earlier stages' selections are frozen (their hard indices are fixed). Keeping
  ``L(x_D)`` in the objective stops training for the new level from undoing the previous one.
- Epochs: by default each stage runs ``epochs`` epochs over the triplets (the DIVE paper's
  "50 training epochs" read per stage, as for Matryoshka-Adaptor's two stages).
  ``epoch_budget="total"`` reads them as one budget split over the stages instead (50 over
  three stages: 17, 17, 16), which costs about a third as much; see :func:`stage_epochs`.
- Scores start at zero, so the Gumbel noise alone decides the first masks; at inference ties
  are broken towards lower indices, so a selection that learned nothing is the prefix
  (plain truncation). The scores have no weight decay; their learning rate is
  ``selection_learning_rate`` (default: the model's).
- The soft relaxation is ``D'·softmax`` (its mass equals the hard mask's); the Gumbel noise is
  one draw per step for the whole batch (a selection is global, not per item).
- S-XBM: items are the batch's distinct queries and documents; an item is never its own
  neighbour, and re-enqueuing an item replaces its older queue entry. The student
  embeddings of the neighbours are recomputed with the current ``g`` (gradients flow through
  both sides) instead of being stored stale. The queue persists across stages (teacher
  embeddings do not change). A batch finds no neighbours until something has been enqueued.
- Reduction: means (over ranked pairs for ``L_rank``, over (item, neighbour) pairs for
  ``L_u``). ``α = 1``.
- Inputs are L2-normalised first (see :mod:`embedtune.compress.training`).

How a step is computed: the same losses, arranged for speed. The queue keeps unit-normalised
copies and is searched over its occupied slots only; the teacher cosines ``cos(x_i, m_j)`` are
the search's own scores; ``g`` runs once over the batch items and their distinct neighbours;
from stage 2 on only the surviving output columns of ``g`` are computed
(:meth:`ResidualMLP.forward_columns`). All 72 runs of the MiniLM main grid, SMEC's 12 among
them, kept exactly the same nDCG@10 and Recall@10 after this change.

References:
    - B. Zhang, L. Chen, T. Liu, B. Zheng. "SMEC: Rethinking Matryoshka Representation
      Learning for Retrieval Embedding Compression". EMNLP 2025, pp. 26209–26222.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embedtune.constraints import Constraint, Interval, Options
from embedtune.compress.base import Compressor, TrainingData
from embedtune.compress.rank_loss import REDUCTIONS, group_triplets, triplet_rank_loss
from embedtune.compress.presets import presets_from_config, with_safety_net
from embedtune.compress.registry import register
from embedtune.compress.residual_mlp import ResidualMLP
from embedtune.compress.rotated_adapter import RotatedAdapterMixin, selected_epoch_from_state, selected_epoch_state
from embedtune.compress.selection import EpochControl, InputRotation, SelectableTrainingConfig, fit_with_selection, resolved_pca_start
from embedtune.compress.training import (
    check_output_dim,
    load_module_state,
    module_state,
    resolve_device,
    run_epochs,
    seeded,
    unit_rows,
)

__all__ = [
    "SMECConfig",
    "SMECCompressor",
    "AdaptiveDimensionSelection",
    "CrossBatchMemory",
    "Neighbors",
    "cosine_gap_loss",
    "gumbel_topk_mask",
    "smrl_schedule",
    "stage_epochs",
    "sxbm_loss",
]


def smrl_schedule(d: int, k: int) -> tuple[int, ...]:
    """Output widths of the halving stages from ``d`` down to exactly ``k`` (``k < d``)."""
    if not 1 <= k < d:
        raise ValueError(f"smec: dim={k} must be between 1 and the input dimension {d} (exclusive).")
    widths = []
    current = d
    while current // 2 > k:
        current //= 2
        widths.append(current)
    widths.append(k)
    return tuple(widths)


EPOCH_BUDGETS = ("per_stage", "total")


def stage_epochs(epochs: int, n_stages: int, budget: str = "per_stage") -> tuple[int, ...]:
    """Epochs of each SMRL stage: ``epochs`` each (``"per_stage"``), or ``epochs`` split as evenly
    as possible with the remainder going to the earlier stages (``"total"``)."""
    if budget not in EPOCH_BUDGETS:
        raise ValueError(f"epoch_budget must be one of {EPOCH_BUDGETS}; got {budget!r}.")
    if budget == "per_stage":
        return (epochs,) * n_stages
    if epochs < n_stages:
        raise ValueError(
            f"smec: epoch_budget='total' splits epochs={epochs} over {n_stages} stages, so every stage would not get one; "
            f"raise epochs to at least {n_stages} or use epoch_budget='per_stage'."
        )
    base, extra = divmod(epochs, n_stages)
    return tuple(base + (stage < extra) for stage in range(n_stages))


def gumbel_topk_mask(
    scores: Tensor, k: int, temperature: float, noise: Tensor | None = None, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Straight-through Gumbel top-``k`` mask over the entries of ``scores``.

    Args:
        scores: (D,) importance scores ``s``.
        k: number of entries to keep.
        temperature: ``τ`` of the soft relaxation.
        noise: (D,) Gumbel noise ``G``; drawn from ``generator`` when None.
        generator: CPU generator for the noise.

    Returns:
        ``(mask, soft)``: ``mask`` equals the hard ``k``-hot indicator of ``top_k(s + G)`` in the
        forward pass and has the gradient of ``soft = k·softmax((s + G)/τ)``.
    """
    if not 1 <= k <= scores.shape[-1]:
        raise ValueError(f"k must be in [1, {scores.shape[-1]}]; got {k}.")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive; got {temperature}.")
    if noise is None:
        uniform = torch.rand(scores.shape, generator=generator).clamp_(1e-10, 1 - 1e-10)
        noise = -torch.log(-torch.log(uniform))
    perturbed = scores + noise.to(scores.device, scores.dtype)
    soft = k * torch.softmax(perturbed / temperature, dim=-1)
    hard = torch.zeros_like(scores)
    hard[torch.topk(perturbed.detach(), k).indices] = 1.0
    # hard + (soft − soft.detach()) is exactly `hard` in value, and `soft` in gradient.
    return hard + (soft - soft.detach()), soft


class AdaptiveDimensionSelection(nn.Module):
    """ADS: learnable importance scores that keep ``out_dim`` of ``in_dim`` dimensions.

    Attributes:
        scores: Parameter of shape (in_dim,), initialised to zero.
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        if not 1 <= out_dim <= in_dim:
            raise ValueError(f"out_dim must be in [1, in_dim={in_dim}]; got {out_dim}.")
        self.in_dim, self.out_dim = in_dim, out_dim
        self.scores = nn.Parameter(torch.zeros(in_dim))

    def selected_indices(self) -> Tensor:
        """The inference selection: indices of the ``out_dim`` highest scores, ascending (ties → lower index)."""
        order = torch.sort(self.scores.detach().cpu(), descending=True, stable=True).indices
        return torch.sort(order[: self.out_dim]).values

    def sample_mask(self, temperature: float, generator: torch.Generator | None = None) -> Tensor:
        """A training mask (in_dim,): hard ``out_dim``-hot forward, soft-score gradient backward."""
        mask, _ = gumbel_topk_mask(self.scores, self.out_dim, temperature, generator=generator)
        return mask

    def forward(self, x: Tensor) -> Tensor:
        """Inference: ``x[..., selected]`` of width ``out_dim``."""
        return x[..., self.selected_indices().to(x.device)]


class Neighbors(NamedTuple):
    """The S-XBM neighbours of a batch (see :meth:`CrossBatchMemory.search`).

    Attributes:
        slots: (n, K) queue slots, best first.
        valid: (n, K) bool, False where fewer than ``K`` eligible entries exist.
        cosines: (n, K) teacher cosines of each row to its neighbours (0 where not valid).
    """

    slots: Tensor
    valid: Tensor
    cosines: Tensor


class CrossBatchMemory:
    """FIFO queue of frozen teacher embeddings with item keys (S-XBM).

    Args:
        size: capacity (5000 in SMEC).
        dim: embedding width.
        device: where the queue lives.
    """

    def __init__(self, size: int, dim: int, device: torch.device | str = "cpu") -> None:
        if size < 1:
            raise ValueError(f"memory size must be positive; got {size}.")
        self.size = size
        self.embeddings = torch.zeros(size, dim, device=device)
        # Unit-normalised copies, so a search is one matmul instead of renormalising the queue each step.
        self.unit_embeddings = torch.zeros(size, dim, device=device)
        self.keys = torch.zeros(size, dtype=torch.long, device=device)
        self.occupied = torch.zeros(size, dtype=torch.bool, device=device)
        # Host-side mirrors of `keys`/`occupied`: per-item bookkeeping without a tensor op per item.
        self._slot_of_key: dict[int, int] = {}
        self._key_at_slot: list[int | None] = [None] * size
        self._next = 0

    def __len__(self) -> int:
        return len(self._slot_of_key)

    @torch.no_grad()
    def enqueue(self, embeddings: Tensor, keys: Tensor) -> None:
        """Append rows, overwriting the oldest; an older entry with a re-enqueued key is dropped."""
        embeddings, keys = embeddings.detach()[-self.size :], keys.to(self.keys.device)[-self.size :]
        slots = (self._next + torch.arange(len(keys), device=self.keys.device)) % self.size
        written = slots.tolist()
        freed: list[int] = []
        for key, slot in zip(keys.tolist(), written):
            older = self._slot_of_key.pop(key, None)
            if older is not None:
                self._key_at_slot[older] = None
                freed.append(older)
            evicted = self._key_at_slot[slot]
            if evicted is not None:
                del self._slot_of_key[evicted]
            self._key_at_slot[slot] = key
            self._slot_of_key[key] = slot
        touched = written + freed
        self.occupied[touched] = torch.tensor([self._key_at_slot[slot] is not None for slot in touched], device=self.occupied.device)
        embeddings = embeddings.to(self.embeddings)
        self.embeddings[slots] = embeddings
        self.unit_embeddings[slots] = F.normalize(embeddings, dim=-1)
        self.keys[slots] = keys
        self._next = int((self._next + len(keys)) % self.size)

    @torch.no_grad()
    def search(self, teacher: Tensor, keys: Tensor, k: int) -> Neighbors:
        """Top-``k`` queue slots by cosine to each row of ``teacher``, excluding the row's own key.

        Returns:
            :class:`Neighbors` with ``K = min(k, len(self))`` columns.
        """
        k = min(k, len(self))
        n = teacher.shape[0]
        if k == 0:
            empty = torch.zeros(n, 0, dtype=torch.long, device=teacher.device)
            return Neighbors(empty, empty.bool(), empty.float())
        full = len(self) == self.size
        # Search only the occupied slots: a small training set never fills the queue.
        candidates = None if full else self.occupied.nonzero().squeeze(1)
        queue = self.unit_embeddings if candidates is None else self.unit_embeddings[candidates]
        similarity = F.normalize(teacher, dim=-1) @ queue.T  # (n, occupied)
        own_rows, own_slots = [], []
        for row, key in enumerate(keys.tolist()):
            slot = self._slot_of_key.get(key)
            if slot is not None:
                own_rows.append(row)
                own_slots.append(slot)
        if own_rows:
            own = torch.tensor(own_slots, device=similarity.device)
            columns = own if candidates is None else torch.searchsorted(candidates, own)
            similarity[torch.tensor(own_rows, device=similarity.device), columns] = float("-inf")
        values, positions = torch.topk(similarity, k, dim=1)
        slots = positions if candidates is None else candidates[positions]
        valid = torch.isfinite(values)
        return Neighbors(slots, valid, values.masked_fill(~valid, 0.0))

    def neighbors(self, teacher: Tensor, keys: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """``(slots, valid)`` of :meth:`search`."""
        found = self.search(teacher, keys, k)
        return found.slots, found.valid


def cosine_gap_loss(
    teacher_cos: Tensor, student_cos: Tensor, valid: Tensor | None = None, reduction: Literal["mean", "sum"] = "mean"
) -> Tensor:
    """``Σ |teacher_cos − student_cos|`` over the valid (item, neighbour) pairs, or its mean."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}.")
    gap = (teacher_cos - student_cos).abs()
    if valid is not None:
        gap = gap * valid.to(gap.dtype)
        count = valid.sum()
    else:
        count = torch.tensor(gap.numel())
    total = gap.sum()
    if reduction == "sum":
        return total
    return total / count.clamp(min=1).to(total.dtype)


def sxbm_loss(
    teacher: Tensor,
    student: Tensor,
    neighbor_teacher: Tensor,
    neighbor_student: Tensor,
    valid: Tensor | None = None,
    reduction: Literal["mean", "sum"] = "mean",
) -> Tensor:
    """``L_u = Σ_i Σ_{j∈N(i)} |cos(x_i, m_j) − cos(g(x_i), g(m_j))|``.

    Args:
        teacher: (n, d) frozen ``x_i``; student: (n, D) ``g(x_i)``.
        neighbor_teacher: (n, K, d) ``m_j``; neighbor_student: (n, K, D) ``g(m_j)``.
        valid: (n, K) bool; False pairs are left out. None keeps all.
        reduction: ``"sum"`` or ``"mean"`` over the valid pairs.
    """
    teacher_cos = (F.normalize(teacher, dim=-1).unsqueeze(1) * F.normalize(neighbor_teacher, dim=-1)).sum(-1)  # (n, K)
    student_cos = (F.normalize(student, dim=-1).unsqueeze(1) * F.normalize(neighbor_student, dim=-1)).sum(-1)  # (n, K)
    return cosine_gap_loss(teacher_cos, student_cos, valid, reduction)


@dataclass
class SMECConfig(SelectableTrainingConfig):
    """SMEC settings. Defaults are the DIVE paper's matched settings (lr 5e-6)."""

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        # DIVE paper §4.1 and §4.3: AdamW, batch 128, 50 epochs, lr 5e-6 (its validation-only
        # stability selection; the §4.3 audit selects the same value).
        "dive-paper": {"epochs": 50, "batch_size": 128, "learning_rate": 5e-6},
        # Zhang et al. 2025: S-XBM queue of 5000 with top-10 neighbours, Gumbel τ annealed 5 → 1.
        # The optimiser settings are not stated in the text available to us; the DIVE paper's
        # are kept.
        "own-paper": {
            "epochs": 50, "batch_size": 128, "learning_rate": 5e-6, "memory_size": 5000, "memory_top_k": 10,
            "initial_temperature": 5.0, "final_temperature": 1.0, "alpha": 1.0,
        },
    }

    learning_rate: float = field(default=5e-6, metadata={"help": "AdamW learning rate of g (and of the scores unless set)."})
    selection_learning_rate: float | None = field(
        default=None, metadata={"help": "AdamW learning rate of the ADS scores; None means learning_rate."}
    )
    alpha: float = field(default=1.0, metadata={"help": "Weight α of the S-XBM loss L_u."})
    memory_size: int = field(default=5000, metadata={"help": "S-XBM FIFO queue capacity."})
    memory_top_k: int = field(default=10, metadata={"help": "S-XBM neighbours per item."})
    initial_temperature: float = field(default=5.0, metadata={"help": "Gumbel temperature at the start of each stage."})
    final_temperature: float = field(default=1.0, metadata={"help": "Gumbel temperature at the end of each stage."})
    epoch_budget: str = field(
        default="per_stage",
        metadata={"help": "'per_stage': every SMRL stage runs `epochs` epochs; 'total': `epochs` is split over the stages."},
    )

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "selection_learning_rate": [Interval(float, 0, None, "neither"), None], "alpha": [Interval(float, 0, None)],
        "epoch_budget": [Options(EPOCH_BUDGETS)], "memory_size": [Interval(int, 1, None)], "memory_top_k": [Interval(int, 1, None)],
        "initial_temperature": [Interval(float, 0, None, "neither")], "final_temperature": [Interval(float, 0, None, "neither")],
    }


@register
class SMECCompressor(RotatedAdapterMixin, Compressor):
    """SMEC: ``g = ResidualMLP`` then the composed ADS selections.

    Attributes:
        adapter_ : :class:`ResidualMLP`, the learned map ``g``.
        selected_indices_ : ndarray of shape (k,), int64. The composed selection into ``g(x)``.
        stage_dims_ : tuple of int, output width of each SMRL stage (the last is ``k``).
        stage_scores_ : list of ndarray, the learned importance scores of each stage.
        history_ : list of dict, per-epoch mean loss terms of every stage.
    """

    method = "smec"
    non_finite_input_reaches_output = True
    config_class = SMECConfig
    supervised = True
    help = "SMEC (Zhang et al. 2025): sequential Matryoshka with adaptive dimension selection"
    # The DIVE paper's §4.3 learning-rate audit (validation queries only).
    lr_candidates = (5e-6, 5e-5, 5e-4)
    # The papers' recipes, plus "robust" (the safety net), the default of compress fit/train. Its
    # candidate epochs are 0 (the first k coordinates) and those of the last SMRL stage, the only
    # points where the map is k-d.
    presets = with_safety_net(presets_from_config(SMECConfig))
    default_preset = "robust"

    def __init__(self, config: SMECConfig | None = None) -> None:
        super().__init__(config)
        self.adapter_: ResidualMLP | None = None
        self.rotation_ = InputRotation()
        self.selected_epoch_: int | None = None
        self.selected_indices_: np.ndarray | None = None
        self.stage_dims_: tuple[int, ...] = ()
        self.stage_scores_: list[np.ndarray] = []
        self.history_: list[dict[str, Any]] = []

    def _build(self, input_dim: int) -> ResidualMLP:
        config: SMECConfig = self.config  # type: ignore[assignment]
        with seeded(config.seed):
            return ResidualMLP(input_dim, config.hidden_width(input_dim), config.activation)  # type: ignore[arg-type]

    def _fit(self, train: TrainingData, val: TrainingData | None) -> None:
        config: SMECConfig = self.config  # type: ignore[assignment]
        check_output_dim(self.method, config.dim, train.dim, strict=True)
        train.require_triplets(self.method)
        self.rotation_ = InputRotation.fit(config.init, train.doc_embeddings, resolved_pca_start(self))
        self.history_ = []
        self.selected_epoch_ = fit_with_selection(self, train, val, self._train_once)

    def _train_once(self, train: TrainingData, control: EpochControl) -> None:
        """A fresh ``g`` through every SMRL stage on ``train``, under ``control``.

        Candidates for selection: epoch 0 (``g`` the identity, the first k coordinates) and each
        epoch of the last stage, where the composed selection is k-d.
        """
        config: SMECConfig = self.config  # type: ignore[assignment]
        triplets = torch.from_numpy(train.require_triplets(self.method))
        stage_dims = smrl_schedule(train.dim, config.dim)
        epochs_of_stage = stage_epochs(config.epochs, len(stage_dims), config.epoch_budget)
        device = resolve_device(config.device)
        adapter = self._build(train.dim).to(device).train()
        corpus = self.rotation_(unit_rows(train.doc_embeddings))
        queries = self.rotation_(unit_rows(train.query_embeddings))
        memory = CrossBatchMemory(config.memory_size, train.dim, device)
        noise_generator = torch.Generator().manual_seed(config.seed + 7919)

        # Epoch 0: g is the identity and the map reads the first k coordinates.
        self.adapter_, self.selected_indices_ = adapter, np.arange(config.dim, dtype=np.int64)

        def set_indices(indices: np.ndarray | None) -> None:
            if indices is not None:
                self.selected_indices_ = indices

        control.begin({"adapter": adapter}, (lambda: self.selected_indices_, set_indices))
        current_index = torch.arange(train.dim)  # columns of g(x) that form the stage input x_D
        history: list[dict[str, Any]] = []
        stage_scores: list[np.ndarray] = []
        in_dim = train.dim
        for stage, out_dim in enumerate(stage_dims):
            selector = AdaptiveDimensionSelection(in_dim, out_dim).to(device)
            last = stage == len(stage_dims) - 1
            if last:
                stage_input = current_index
                control.prepare = lambda: set_indices(stage_input[selector.selected_indices()].numpy().astype(np.int64))
            history += self._train_stage(
                stage, epochs_of_stage[stage], adapter, selector, current_index.to(device), memory, triplets, queries, corpus,
                noise_generator, device, control, last,
            )
            stage_scores.append(selector.scores.detach().cpu().numpy().copy())
            # Freeze this stage: its hard selection composes onto the earlier ones.
            current_index = current_index[selector.selected_indices()]
            in_dim = out_dim
        control.prepare = None

        self.adapter_ = adapter.eval()
        self.selected_indices_ = current_index.numpy().astype(np.int64)
        self.stage_dims_ = stage_dims
        self.stage_scores_ = stage_scores
        self.history_ += history

    def _train_stage(
        self,
        stage: int,
        epochs: int,
        adapter: ResidualMLP,
        selector: AdaptiveDimensionSelection,
        stage_index: Tensor,
        memory: CrossBatchMemory,
        triplets: Tensor,
        queries: Tensor,
        corpus: Tensor,
        noise_generator: torch.Generator,
        device: torch.device,
        control: EpochControl | None = None,
        candidate: bool = True,
    ) -> list[dict[str, Any]]:
        """One SMRL stage ``D → D'``: train ``g`` and this stage's scores on ``L(x_D) + L(x_{D'})``."""
        config: SMECConfig = self.config  # type: ignore[assignment]
        total_steps = epochs * math.ceil(len(triplets) / config.batch_size)
        steps_done = [0]

        def temperature() -> float:
            # Linear anneal from initial_temperature to final_temperature over the stage's steps.
            progress = min(steps_done[0] / max(total_steps - 1, 1), 1.0)
            return config.initial_temperature + (config.final_temperature - config.initial_temperature) * progress

        def advance() -> None:
            steps_done[0] += 1

        # Stage 1 reads every output column of g; later stages only the surviving ones.
        columns = None if len(stage_index) == adapter.up.in_features else stage_index

        def step(batch: Tensor, epoch: int) -> dict[str, Tensor]:
            groups = group_triplets(triplets[batch])
            n_items, n_queries = len(groups.query_rows) + len(groups.doc_rows), len(groups.query_rows)
            teacher = torch.cat([queries[groups.query_rows], corpus[groups.doc_rows]]).to(device)  # (n, d)
            keys = torch.cat([-(groups.query_rows + 1), groups.doc_rows]).to(device)  # queries get negative keys
            mask = selector.sample_mask(temperature(), noise_generator)  # (D,), hard D'-hot forward
            found = memory.search(teacher, keys, config.memory_top_k)  # (n, K); cosines are cos(x_i, m_j)
            has_neighbors = found.slots.numel() > 0
            inputs = teacher
            if has_neighbors:
                unique_slots, inverse = torch.unique(found.slots, return_inverse=True)
                inputs = torch.cat([teacher, memory.embeddings[unique_slots]])
            # One pass of g over the batch items and their distinct neighbours.
            outputs = adapter.forward_columns(inputs, columns)
            student_high, neighbor_high = outputs[:n_items], outputs[n_items:]  # x_D of items; of distinct neighbours
            terms: dict[str, Tensor] = {}
            for level, level_mask in (("high", None), ("low", mask)):
                # Masking zeroes the unselected coordinates, so cosines equal those of the selected subset.
                student = student_high if level_mask is None else student_high * level_mask
                terms[f"rank_{level}"] = triplet_rank_loss(student[:n_queries], student[n_queries:], groups)
                if has_neighbors:
                    neighbor_student = neighbor_high if level_mask is None else neighbor_high * level_mask
                    # Normalise each distinct neighbour once, then pair it with every item that selected it.
                    neighbor_unit = F.normalize(neighbor_student, dim=-1)[inverse]  # (n, K, D)
                    student_cos = (F.normalize(student, dim=-1).unsqueeze(1) * neighbor_unit).sum(-1)  # (n, K)
                    terms[f"sxbm_{level}"] = cosine_gap_loss(found.cosines, student_cos, found.valid)
                else:
                    terms[f"sxbm_{level}"] = student.new_zeros(())
            memory.enqueue(teacher, keys)
            terms["loss"] = sum(
                (terms[f"rank_{level}"] + config.alpha * terms[f"sxbm_{level}"] for level in ("high", "low")),
                start=student_high.new_zeros(()),
            )
            return terms

        parameter_groups = [
            {"params": list(adapter.parameters())},
            {"params": [selector.scores], "lr": config.selection_learning_rate or config.learning_rate, "weight_decay": 0.0},
        ]
        return run_epochs(
            parameter_groups,
            step,
            len(triplets),
            config,
            stage=f"smec/stage{stage + 1}:{selector.in_dim}->{selector.out_dim}",
            epochs=epochs,
            seed_offset=stage,
            on_step=advance,
            control=control,
            candidate=candidate,
        )

    def _kept_columns(self) -> np.ndarray:
        assert self.selected_indices_ is not None
        return self.selected_indices_

    def _state_dict(self) -> dict[str, np.ndarray]:
        assert self.adapter_ is not None and self.selected_indices_ is not None
        state = {**module_state("adapter", self.adapter_), **self.rotation_.state()}
        state["selected_indices"] = self.selected_indices_
        state.update(selected_epoch_state(self.selected_epoch_))
        for stage, scores in enumerate(self.stage_scores_):
            state[f"stage_scores.{stage}"] = scores
        return state

    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        assert self.input_dim_ is not None
        adapter = self._build(self.input_dim_)
        load_module_state("adapter", adapter, state)
        selected = np.asarray(state["selected_indices"], dtype=np.int64)
        in_range = selected.shape == (self.config.dim,) and selected.min() >= 0 and selected.max() < self.input_dim_
        if not in_range or len(np.unique(selected)) != len(selected):
            raise ValueError(f"selected_indices must be {self.config.dim} distinct indices below {self.input_dim_}; got {selected.shape}.")
        self.rotation_ = InputRotation.from_state(state, self.config.init, self.input_dim_)  # type: ignore[attr-defined]
        self.selected_epoch_ = selected_epoch_from_state(state)
        self.stage_dims_ = smrl_schedule(self.input_dim_, self.config.dim)
        self.stage_scores_ = [np.asarray(state[f"stage_scores.{stage}"], dtype=np.float32) for stage in range(len(self.stage_dims_))]
        self.adapter_ = adapter.to(resolve_device(self.config.device)).eval()  # type: ignore[attr-defined]
        self.selected_indices_ = selected
