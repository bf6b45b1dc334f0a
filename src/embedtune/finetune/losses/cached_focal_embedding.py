"""GradCache version of the Focal Embedding Loss: large batches in constant memory, exact gradients."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from sentence_transformers.base.losses.gradcache import CachedLossMixin
from torch import Tensor, nn

from embedtune.finetune.losses.focal_embedding import (
    PACE_CITATION,
    FocalEmbeddingLoss,
    Normalization,
    Similarity,
    Weighting,
    FocalLossOutput,
    _normalised_weights,
    focal_weights,
    per_query_contrastive_loss,
    scale_gradient,
)

__all__ = ["CachedFocalEmbeddingLoss", "DEEPSPEED_GRADCACHE_MESSAGE"]

DEEPSPEED_GRADCACHE_MESSAGE = (
    "GradCache (mini_batch_size) cannot run under DeepSpeed: the cached loss re-embeds every mini-batch "
    "inside a backward hook of the loss tensor, while DeepSpeed's engine owns backward() and its ZeRO "
    "gradient partitioning expects exactly one forward/backward per micro-batch (the anchor projects "
    "report the same failure). Either drop --mini-batch-size and shrink the batch, or drop --deepspeed "
    "and use plain data parallelism (accelerate/torchrun), which GradCache supports."
)


def _is_deepspeed_engine(model: Any) -> bool:
    return any(cls.__name__ == "DeepSpeedEngine" for cls in type(model).__mro__)


class CachedFocalEmbeddingLoss(CachedLossMixin, nn.Module):
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
        mini_batch_size: int = 32,
        mini_batch_num_tokens: int | None = None,
        show_progress_bar: bool = False,
    ) -> None:
        """:class:`FocalEmbeddingLoss` with GradCache, so the batch (and so the candidate set) can
        be far larger than what fits in memory at once.

        The three GradCache steps (s-t's ``CachedLossMixin``): (1) embed every mini-batch without
        a graph; (2) compute the loss on the detached embeddings and back-propagate it to them,
        caching ``∂L/∂e``; (3) re-embed each mini-batch with a graph (replaying dropout) and push the
        cached gradients through. Step (2) is exact for the focal loss because the weights
        ``a_i = stopgrad((1 - p_i)^γ)`` depend only on the detached embeddings: they are computed
        once for the whole batch, normalised over it, and then ``Σ a_i ℓ_i / Σ a_i`` is
        back-propagated in chunks of ``mini_batch_size`` queries. Gradients therefore equal those
        of :class:`FocalEmbeddingLoss` up to floating-point rounding.

        Args:
            model: the SentenceTransformer being trained.
            similarity, temperature, weight_temperature, gamma, weighting, normalize,
            gather_across_devices, seed: as in :class:`FocalEmbeddingLoss`.
            mini_batch_size: sequences per forward pass in steps (1) and (3), and queries per
                chunk of the loss in step (2).
            mini_batch_num_tokens: pack mini-batches by token count instead (see s-t).
            show_progress_bar: show mini-batch progress.

        References:
            - Li et al., "PACE: Progressive Angular-to-Norm Contrastive Embedding", arXiv:2609.15152,
              §3.3 and Appendix C.1 (GradCache).
            - Gao et al., "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup",
              RepL4NLP 2021 (GradCache).

        Requirements:
            1. (anchor, positive, negative_1, ..., negative_n) tuples, or pairs.
            2. Not under DeepSpeed (refused with an explanation); plain data parallelism works.

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
                from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments
                from embedtune.finetune.losses import CachedFocalEmbeddingLoss

                model = SentenceTransformer("path/to/model")
                train_dataset = Dataset.from_dict({
                    "anchor": ["what causes rain?", "who wrote hamlet?"],
                    "positive": ["Rain forms when vapour condenses.", "Hamlet is a play by Shakespeare."],
                    "negative_1": ["Snow is frozen water.", "Macbeth is a tragedy."],
                })
                loss = CachedFocalEmbeddingLoss(model, mini_batch_size=1)
                args = SentenceTransformerTrainingArguments(output_dir="out", per_device_train_batch_size=2)
                trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset, loss=loss)
                trainer.train()
        """
        super().__init__()
        from sentence_transformers.base.losses.gradcache import _validate_mini_batch_num_tokens, has_static_embedding_input

        if has_static_embedding_input(model):
            raise ValueError("CachedFocalEmbeddingLoss cannot split StaticEmbedding inputs into mini-batches; use FocalEmbeddingLoss.")
        if mini_batch_size < 1:
            raise ValueError(f"mini_batch_size must be >= 1; got {mini_batch_size}.")
        _validate_mini_batch_num_tokens(mini_batch_num_tokens)
        self.model = model
        # The wrapped loss owns and validates the hyperparameters and keeps the logged components.
        self.loss = FocalEmbeddingLoss(
            model,
            similarity=similarity,
            temperature=temperature,
            weight_temperature=weight_temperature,
            gamma=gamma,
            weighting=weighting,
            normalize=normalize,
            gather_across_devices=gather_across_devices,
            seed=seed,
        )
        self.mini_batch_size = int(mini_batch_size)
        self.mini_batch_num_tokens = mini_batch_num_tokens
        self.show_progress_bar = show_progress_bar

    # The hyperparameters live on the wrapped loss.
    similarity = property(lambda self: self.loss.similarity)
    temperature = property(lambda self: self.loss.temperature)
    weight_temperature = property(lambda self: self.loss.weight_temperature)
    gamma = property(lambda self: self.loss.gamma)
    weighting = property(lambda self: self.loss.weighting)
    normalize = property(lambda self: self.loss.normalize)
    gather_across_devices = property(lambda self: self.loss.gather_across_devices)

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        if _is_deepspeed_engine(self.model):
            raise RuntimeError(DEEPSPEED_GRADCACHE_MESSAGE)
        sentence_features = list(sentence_features)
        if len(sentence_features) < 2:
            raise ValueError(f"CachedFocalEmbeddingLoss needs (anchor, positive, ...) columns; got {len(sentence_features)}.")
        return self.forward_cached(sentence_features, labels)

    def calculate_loss(self, reps: list[list[Tensor]], labels: Tensor | None = None, *, with_backward: bool = False) -> Tensor:
        """Focal loss of the whole batch from mini-batch embeddings, back-propagated chunk by chunk."""
        loss = self.loss
        queries, candidates, world_size = loss.gather([torch.cat(column) for column in reps])
        n_queries = len(queries)
        positive_indices = torch.arange(n_queries, device=queries.device)
        # Weights of the whole (global) batch first: they are constants for every chunk below.
        weights, confidence = focal_weights(
            queries.detach(),
            candidates.detach(),
            positive_indices,
            loss.weighting,
            loss.gamma,
            loss.weight_temperature,
            loss.generator if loss.weighting == "random" else None,
        )
        if n_queries % world_size:
            raise ValueError(f"{n_queries} queries cannot be split into {world_size} equal blocks.")
        coefficients = _normalised_weights(weights.to(queries.dtype), world_size, loss.normalize)  # (n_queries,)
        total = torch.zeros((), device=queries.device)
        per_query_parts: list[Tensor] = []
        top1_parts: list[Tensor] = []
        for begin in range(0, n_queries, self.mini_batch_size):
            chunk = slice(begin, min(begin + self.mini_batch_size, n_queries))
            # (chunk, n_candidates); the cosine normalisation is recomputed per chunk so that each
            # chunk's backward owns its graph.
            per_query, logits = per_query_contrastive_loss(
                queries[chunk], candidates, positive_indices[chunk], loss.similarity, loss.temperature
            )
            part = scale_gradient((coefficients[chunk] * per_query).sum(), world_size)
            if with_backward:
                part.backward()
                part = part.detach()
            total = total + part
            per_query_parts.append(per_query.detach())
            top1_parts.append(logits.detach().argmax(dim=1) == positive_indices[chunk])
        loss.record(FocalLossOutput(total.detach(), torch.cat(per_query_parts), weights, confidence, torch.cat(top1_parts)))
        return total

    def pop_components(self) -> dict[str, float]:
        return self.loss.pop_components()

    def get_config_dict(self) -> dict[str, Any]:
        return {**self.loss.get_config_dict(), "mini_batch_size": self.mini_batch_size, "mini_batch_num_tokens": self.mini_batch_num_tokens}

    @property
    def citation(self) -> str:
        return PACE_CITATION
