"""Focal Embedding Loss (PACE §3.3, Eq. 3-7): confidence-weighted InfoNCE over in-batch and hard negatives."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embedtune.finetune.loss_choices import NORMALIZATIONS, SIMILARITIES, WEIGHTINGS, Normalization, Similarity, Weighting

logger = logging.getLogger(__name__)

__all__ = [
    "FocalEmbeddingLoss",
    "FocalLossOutput",
    "focal_embedding_loss",
    "focal_weights",
    "gather_keep_local",
    "per_query_contrastive_loss",
    "similarity_matrix",
    "PACE_CITATION",
    "SIMILARITIES",
    "WEIGHTINGS",
    "NORMALIZATIONS",
    "Similarity",
    "Weighting",
    "Normalization",
]


PACE_CITATION = """
@misc{li2026pace,
    title={PACE: Progressive Angular-to-Norm Contrastive Embedding},
    author={Yanping Li and Wei Zhou and Yawen Liu and Yibo Wang and Ke Zhu and Guangda Huzhang and Qing-Guo Chen and Zhao Xu and Jun Zhang and Wei Wei},
    year={2026},
    eprint={2609.15152},
    archivePrefix={arXiv},
    primaryClass={cs.CL},
    url={https://arxiv.org/abs/2609.15152},
}
"""


def _check_choice(name: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {list(options)}; got {value!r}.")


def similarity_matrix(queries: Tensor, candidates: Tensor, similarity: Similarity) -> Tensor:
    """``s(q_i, c_j)`` for every pair: cosine (Eq. 1) or the unnormalised dot product (Eq. 2).

    Args:
        queries: tensor of shape (n_queries, d).
        candidates: tensor of shape (n_candidates, d).

    Returns:
        Tensor of shape (n_queries, n_candidates).
    """
    if similarity == "cosine":
        return F.normalize(queries, dim=-1) @ F.normalize(candidates, dim=-1).T
    if similarity == "dot":
        return queries @ candidates.T
    raise ValueError(f"similarity must be one of {list(SIMILARITIES)}; got {similarity!r}.")


def per_query_contrastive_loss(
    queries: Tensor,
    candidates: Tensor,
    positive_indices: Tensor,
    similarity: Similarity = "cosine",
    temperature: float = 0.1,
) -> tuple[Tensor, Tensor]:
    """``ℓ_i = -log π_i`` with ``π_i = softmax_c(s(q_i, c) / τ)[c_i^+]`` (Eq. 3), one value per query.

    Returns:
        ``(ℓ, logits)``: ℓ of shape (n_queries,), logits of shape (n_queries, n_candidates).
    """
    logits = similarity_matrix(queries, candidates, similarity) / temperature  # (n_queries, n_candidates)
    rows = torch.arange(len(queries), device=queries.device)
    return torch.logsumexp(logits, dim=1) - logits[rows, positive_indices], logits


@torch.no_grad()
def focal_weights(
    queries: Tensor,
    candidates: Tensor,
    positive_indices: Tensor,
    weighting: Weighting = "focal",
    gamma: float = 2.0,
    weight_temperature: float = 0.1,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Detached per-query coefficients ``a_i`` and the focal confidence ``p_i``.

    ``p_i = softmax_c(cos(q_i, c) / τ_w)[c_i^+]`` (Eq. 4) is computed from cosine logits in every
    stage, so growing embedding norms in Stage II cannot inflate it. The coefficient is

    - ``"focal"``: ``a_i = (1 - p_i)^γ`` (Eq. 5);
    - ``"qp"``: query–positive weighting (Figure 6b), ``a_i = ((1 - cos(q_i, c_i^+)) / 2)^γ``;
    - ``"qn"``: hardest-negative weighting (Figure 6b), ``a_i = ((1 + max_{c ≠ c_i^+} cos(q_i, c)) / 2)^γ``;
    - ``"random"``: ``a_i ~ U(0, 1)`` i.i.d. (the "arbitrary rescaling" control of Figure 6b);
    - ``"none"``: ``a_i = 1`` (plain InfoNCE).

    The QP/QN maps put the cosine on ``[0, 1]`` and reuse the focal form, so they differ from the
    focal weight only in their difficulty signal.

    Returns:
        ``(a, p)``, both of shape (n_queries,), without gradient.
    """
    _check_choice("weighting", weighting, WEIGHTINGS)
    # At least fp32, so bf16 training does not quantise the confidence.
    dtype = torch.promote_types(queries.dtype, torch.float32)
    cosine = similarity_matrix(queries.to(dtype), candidates.to(dtype), "cosine")  # (n_queries, n_candidates)
    rows = torch.arange(len(queries), device=queries.device)
    confidence = torch.softmax(cosine / weight_temperature, dim=1)[rows, positive_indices]
    if weighting == "focal":
        weights = (1.0 - confidence).clamp_min(0.0) ** gamma
    elif weighting == "qp":
        weights = ((1.0 - cosine[rows, positive_indices]) / 2.0).clamp(0.0, 1.0) ** gamma
    elif weighting == "qn":
        negatives = cosine.clone()
        negatives[rows, positive_indices] = float("-inf")
        weights = ((1.0 + negatives.max(dim=1).values) / 2.0).clamp(0.0, 1.0) ** gamma
    elif weighting == "random":
        weights = torch.rand(len(queries), generator=generator).to(device=queries.device, dtype=dtype)
    else:
        weights = torch.ones(len(queries), device=queries.device, dtype=dtype)
    return weights.detach(), confidence.detach()


@dataclass
class FocalLossOutput:
    """What one evaluation of the Focal Embedding Loss produced.

    Attributes:
        loss: scalar ``Σ a_i ℓ_i / Σ a_i`` (Eq. 7), differentiable.
        per_query_loss: ``ℓ_i``, shape (n_queries,), differentiable.
        weights: detached ``a_i``, shape (n_queries,).
        confidence: detached ``p_i``, shape (n_queries,).
        positive_top1: detached bool, shape (n_queries,): the positive has the highest training logit.
    """

    loss: Tensor
    per_query_loss: Tensor
    weights: Tensor
    confidence: Tensor
    positive_top1: Tensor

    def components(self) -> dict[str, float]:
        """The logged scalars: loss, mean weight, mean p_i and the positive-rank (top-1) accuracy."""
        return {
            "loss": float(self.loss.detach()),
            "mean_weight": float(self.weights.mean()),
            "mean_confidence": float(self.confidence.mean()),
            "positive_accuracy": float(self.positive_top1.float().mean()),
        }


def _normalised_weights(weights: Tensor, groups: int, normalize: Normalization) -> Tensor:
    """``a_i / Σ a`` over the whole batch (``global``), or within each of ``groups`` equal blocks
    (``local``: one block per process) divided by the number of blocks, so both sum to 1."""
    _check_choice("normalize", normalize, NORMALIZATIONS)
    if normalize == "global" or groups == 1:
        return weights / weights.sum().clamp_min(torch.finfo(weights.dtype).tiny)
    blocks = weights.reshape(groups, -1)
    return (blocks / blocks.sum(dim=1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny) / groups).reshape(-1)


def focal_embedding_loss(
    queries: Tensor,
    candidates: Tensor,
    positive_indices: Tensor | None = None,
    similarity: Similarity = "cosine",
    temperature: float = 0.1,
    weight_temperature: float = 0.1,
    gamma: float = 2.0,
    weighting: Weighting = "focal",
    normalize: Normalization = "global",
    groups: int = 1,
    generator: torch.Generator | None = None,
) -> FocalLossOutput:
    """The Focal Embedding Loss of a batch, as plain tensor maths (no model, no processes).

    Args:
        queries: tensor of shape (n_queries, d).
        candidates: tensor of shape (n_candidates, d): every positive and hard negative of the batch.
        positive_indices: the row of each query's positive in ``candidates``; default ``arange(n_queries)``
            (positives first, in query order).
        similarity, temperature: the training similarity ``s_t`` and ``τ_t`` (logits are ``s / τ``).
        weight_temperature: ``τ_w`` of the cosine confidence ``p_i``.
        gamma: ``γ``.
        weighting: see :func:`focal_weights`.
        normalize: ``"global"``: ``Σ a_i ℓ_i / Σ a_i`` over all queries; ``"local"``: the same within
            each of ``groups`` equal consecutive blocks of queries, averaged over blocks.
        groups: number of blocks for ``normalize="local"`` (the number of processes).
        generator: random source of ``weighting="random"``.
    """
    if positive_indices is None:
        positive_indices = torch.arange(len(queries), device=queries.device)
    per_query, logits = per_query_contrastive_loss(queries, candidates, positive_indices, similarity, temperature)
    weights, confidence = focal_weights(queries, candidates, positive_indices, weighting, gamma, weight_temperature, generator)
    weights = weights.to(per_query.dtype)
    if len(queries) % groups:
        raise ValueError(f"{len(queries)} queries cannot be split into {groups} equal blocks.")
    loss = (_normalised_weights(weights, groups, normalize) * per_query).sum()
    positive_top1 = logits.detach().argmax(dim=1) == positive_indices
    return FocalLossOutput(loss, per_query, weights, confidence, positive_top1)


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def gather_keep_local(tensor: Tensor) -> Tensor:
    """Concatenate ``tensor`` from every process along dim 0; only this process's part keeps its graph.

    Every process then holds the whole global batch and computes the whole global loss, whose
    gradient with respect to its own (local) embeddings is exact; data-parallel averaging of the
    parameter gradients then needs the loss gradient scaled by the world size (see
    :class:`FocalEmbeddingLoss`). This is the gather of VLM2Vec's distributed contrastive loss.
    Returns ``tensor`` unchanged outside ``torch.distributed``.
    """
    world_size, rank = _world()
    if world_size == 1:
        return tensor
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(parts, tensor.detach().contiguous())
    parts[rank] = tensor
    return torch.cat(parts, dim=0)


def scale_gradient(loss: Tensor, factor: float) -> Tensor:
    """Same value as ``loss``, gradient multiplied by ``factor``."""
    if factor == 1:
        return loss
    return loss * factor - loss.detach() * (factor - 1)


class FocalEmbeddingLoss(nn.Module):
    def __init__(
        self,
        model: nn.Module,
        similarity: Similarity = "cosine",
        temperature: float = 0.1,
        weight_temperature: float = 0.1,
        gamma: float = 2.0,
        weighting: Weighting = "focal",
        normalize: Normalization = "global",
        gather_across_devices: bool = True,
        seed: int = 0,
    ) -> None:
        """Focal Embedding Loss: InfoNCE over in-batch positives and hard negatives, reweighted per
        query by how unsure the model still is about that query's positive.

        For query ``q_i`` and the candidate set ``C`` (every positive and hard negative of the global
        batch), with ``s`` the cosine (Stage I) or the dot product (Stage II)::

            π_i = exp(s(q_i, c_i^+)/τ) / Σ_{c∈C} exp(s(q_i, c)/τ),      ℓ_i = -log π_i        (Eq. 3)
            p_i = exp(cos(q_i, c_i^+)/τ_w) / Σ_{c∈C} exp(cos(q_i, c)/τ_w)                     (Eq. 4)
            a_i = stopgrad((1 - p_i)^γ)                                                        (Eq. 5)
            L   = Σ_i a_i ℓ_i / Σ_i a_i                                                        (Eq. 6-7)

        The weights have unit mean over the global batch (``normalize="global"``, the paper's
        setting), so the loss keeps the scale of InfoNCE; confident queries contribute less and
        ambiguous ones more. ``p_i`` always uses cosine logits, so embedding norms learnt in
        Stage II do not make queries look easy. With ``weighting="none"`` (or ``gamma=0``) this is
        exactly InfoNCE with hard negatives (``MultipleNegativesRankingLoss`` with
        ``scale = 1/τ``).

        Temperature convention: the logits are ``s / τ``. Stage I uses ``τ = 0.1`` (paper). For
        the dot product ``τ`` only makes sense relative to the embedding norms: the paper's
        Stage II value 100 belongs to a Qwen backbone's norms. :func:`embedtune.finetune.auto_temperature`
        picks ``τ_2 = τ_1 × median(‖q‖·‖c‖)`` at the stage boundary, so that the first Stage II
        logits have the scale of Stage I's.

        With several processes, every process gathers the queries and candidates of all
        processes (its own part keeps its graph), evaluates the loss of the whole global batch and
        scales its gradient by the world size, so that data-parallel gradient averaging yields
        exactly the gradient of the single-process loss on the global batch.

        Args:
            model: the SentenceTransformer being trained.
            similarity: ``"cosine"`` (Stage I) or ``"dot"`` (Stage II) training similarity.
            temperature: ``τ_t`` of the training logits.
            weight_temperature: ``τ_w`` of the confidence ``p_i`` (the paper does not state it; the
                default equals Stage I's ``τ``, so that in Stage I ``p_i = π_i``).
            gamma: focusing parameter ``γ`` (paper: 2; Table 7 sweeps 0.5, 2, 4).
            weighting: ``"focal"`` (the loss), or the Figure 6b controls ``"random"``, ``"qp"``
                (query–positive cosine), ``"qn"`` (hardest-negative cosine), or ``"none"`` (InfoNCE).
            normalize: ``"global"`` (unit-mean weights over the global batch) or ``"local"`` (per process).
            gather_across_devices: gather candidates from every process (a no-op in one process).
            seed: seed of the random weights (``weighting="random"``), equal on every process.

        References:
            - Li et al., "PACE: Progressive Angular-to-Norm Contrastive Embedding",
              arXiv:2609.15152, §3.3 (Eq. 3-7), §4.1 and Appendix A.
            - Lin et al., "Focal Loss for Dense Object Detection", ICCV 2017.

        Requirements:
            1. (anchor, positive, negative_1, ..., negative_n) tuples; (anchor, positive) pairs also work.
            2. Equal per-process batch sizes when training with several processes (drop the last batch).

        Inputs:
            +-------------------------------------------------+--------+
            | Inputs                                          | Labels |
            +=================================================+========+
            | (anchor, positive) pairs                        | none   |
            +-------------------------------------------------+--------+
            | (anchor, positive, negative_1, ..., negative_n) | none   |
            +-------------------------------------------------+--------+

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
                from embedtune.finetune.losses import FocalEmbeddingLoss

                model = SentenceTransformer("path/to/model")
                train_dataset = Dataset.from_dict({
                    "anchor": ["what causes rain?", "who wrote hamlet?"],
                    "positive": ["Rain forms when vapour condenses.", "Hamlet is a play by Shakespeare."],
                    "negative_1": ["Snow is frozen water.", "Macbeth is a tragedy."],
                })
                loss = FocalEmbeddingLoss(model, similarity="cosine", temperature=0.1, gamma=2.0)
                trainer = SentenceTransformerTrainer(model=model, train_dataset=train_dataset, loss=loss)
                trainer.train()
        """
        super().__init__()
        _check_choice("similarity", similarity, SIMILARITIES)
        _check_choice("weighting", weighting, WEIGHTINGS)
        _check_choice("normalize", normalize, NORMALIZATIONS)
        if not temperature > 0 or not weight_temperature > 0:
            raise ValueError(f"temperature and weight_temperature must be > 0; got {temperature} and {weight_temperature}.")
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0; got {gamma}.")
        if weighting in ("none", "random") and gamma != 2.0:
            logger.warning("gamma=%s is ignored with weighting=%r.", gamma, weighting)
        if weighting == "focal" and gamma == 0:
            logger.warning("gamma=0 makes every focal weight 1: the loss is plain InfoNCE.")
        self.model = model
        self.similarity = similarity
        self.temperature = float(temperature)
        self.weight_temperature = float(weight_temperature)
        self.gamma = float(gamma)
        self.weighting = weighting
        self.normalize = normalize
        self.gather_across_devices = gather_across_devices
        self.seed = int(seed)
        self._generator: torch.Generator | None = None
        self._component_sums: dict[str, float] = {}
        self._component_steps = 0
        self.last_output: FocalLossOutput | None = None

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        from sentence_transformers.base.losses.merged_forward import embed_columns

        embeddings = embed_columns(self.model, sentence_features)
        return self.compute_loss_from_embeddings(embeddings, labels)

    @property
    def generator(self) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed)
        return self._generator

    def gather(self, embeddings: list[Tensor]) -> tuple[Tensor, Tensor, int]:
        """Global queries (n, d) and candidates (n * (1 + n_neg), d), and the world size."""
        if len(embeddings) < 2:
            raise ValueError(f"FocalEmbeddingLoss needs (anchor, positive, ...) columns; got {len(embeddings)} column(s).")
        world_size = _world()[0] if self.gather_across_devices else 1
        columns = [gather_keep_local(column) for column in embeddings] if world_size > 1 else list(embeddings)
        # Candidate rows: all positives (global query order), then negative_1 of every query, ...
        return columns[0], torch.cat(columns[1:], dim=0), world_size

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        queries, candidates, world_size = self.gather(embeddings)
        output = focal_embedding_loss(
            queries,
            candidates,
            similarity=self.similarity,
            temperature=self.temperature,
            weight_temperature=self.weight_temperature,
            gamma=self.gamma,
            weighting=self.weighting,
            normalize=self.normalize,
            groups=world_size,
            generator=self.generator if self.weighting == "random" else None,
        )
        self.record(output)
        # Every process computed the whole global loss; DDP averages gradients over processes.
        return scale_gradient(output.loss, world_size)

    def record(self, output: FocalLossOutput) -> None:
        """Keep the components of a training step for :meth:`pop_components` (the trainer logs them)."""
        self.last_output = output
        if not torch.is_grad_enabled():
            return
        for key, value in output.components().items():
            self._component_sums[key] = self._component_sums.get(key, 0.0) + value
        self._component_steps += 1

    def pop_components(self) -> dict[str, float]:
        """Mean of each component since the last call, then reset."""
        if not self._component_steps:
            return {}
        means = {key: value / self._component_steps for key, value in self._component_sums.items()}
        self._component_sums, self._component_steps = {}, 0
        return means

    def get_config_dict(self) -> dict[str, Any]:
        return {
            "similarity": self.similarity,
            "temperature": self.temperature,
            "weight_temperature": self.weight_temperature,
            "gamma": self.gamma,
            "weighting": self.weighting,
            "normalize": self.normalize,
            "gather_across_devices": self.gather_across_devices,
            "seed": self.seed,
        }

    @property
    def citation(self) -> str:
        return PACE_CITATION
