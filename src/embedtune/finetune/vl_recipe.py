"""PACE for Qwen vision-language embedders: a small two-stage training loop (paper §3.4, Appendix A).

Stage I: cosine similarity, LoRA on the language model only. Stage II: the adapter is merged, the
whole language model trains, similarity is the dot product. The Focal Embedding Loss
(:func:`embedtune.finetune.losses.focal_embedding_loss`) is the objective in both stages. The vision
tower and projector stay frozen throughout.

This loop is deliberately plain (no s-t Trainer, no GradCache, one process); it is what the tests
and ``benchmarks/gpu_smoke.sh`` run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from embedtune.finetune.losses import focal_embedding_loss
from embedtune.finetune.modeling import add_lora, has_lora, merge_lora

__all__ = ["VLStageConfig", "VLPACEConfig", "VLStepLog", "run_vl_stage", "train_vl_pace"]

logger = logging.getLogger(__name__)


@dataclass
class VLStageConfig:
    """One stage of the VL recipe."""

    steps: int = field(default=10, metadata={"help": "optimiser steps"})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate"})
    similarity: Literal["cosine", "dot"] = field(default="cosine", metadata={"help": "training similarity s_t"})
    temperature: float = field(default=0.02, metadata={"help": "τ_t of the contrastive logits"})
    lora: bool = field(default=True, metadata={"help": "LoRA on the language model (Stage I) or full LM training (Stage II)"})

    def __post_init__(self) -> None:
        if self.similarity not in ("cosine", "dot"):
            raise ValueError(f"similarity must be one of ['cosine', 'dot']; got {self.similarity!r}.")
        if self.steps < 0 or self.temperature <= 0 or self.learning_rate <= 0:
            raise ValueError("steps must be >= 0, temperature and learning_rate > 0.")


@dataclass
class VLPACEConfig:
    """Both stages plus the shared loss and batching settings."""

    stage1: VLStageConfig = field(default_factory=lambda: VLStageConfig(similarity="cosine", lora=True), metadata={"help": "Stage I"})
    stage2: VLStageConfig = field(default_factory=lambda: VLStageConfig(similarity="dot", lora=False, learning_rate=1e-5), metadata={"help": "Stage II"})
    batch_size: int = field(default=4, metadata={"help": "queries per step (in-batch negatives)"})
    gamma: float = field(default=2.0, metadata={"help": "focal γ"})
    weight_temperature: float = field(default=0.1, metadata={"help": "τ_w of the cosine confidence p_i"})
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank"})
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA alpha; default 2 * rank"})
    seed: int = field(default=0, metadata={"help": "data-order seed"})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VLStepLog:
    stage: int
    step: int
    loss: float
    seconds: float
    mean_weight: float
    positive_accuracy: float


def _batches(examples: Sequence, batch_size: int, steps: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(len(examples), generator=generator).tolist()
        yield [examples[index] for index in order[:batch_size]]
        del order[:batch_size]


def run_vl_stage(embedder, examples: Sequence, stage: VLStageConfig, config: VLPACEConfig, stage_index: int,
                 autocast_dtype: torch.dtype | None = None) -> list[VLStepLog]:
    """Train ``embedder`` in place for ``stage.steps`` steps; returns one log entry per step.

    Each step embeds the batch's queries, then its positives followed by every hard negative, and
    applies the Focal Embedding Loss with positives at candidate rows ``0..batch-1``.
    """
    if len(examples) < 1:
        raise ValueError("the training set is empty.")
    trainable = [parameter for parameter in embedder.parameters() if parameter.requires_grad]
    if not trainable:
        raise ValueError("nothing to train: no parameter requires grad.")
    optimizer = torch.optim.AdamW(trainable, lr=stage.learning_rate)
    device_type = embedder.device.type
    logs = []
    embedder.train()
    for step, batch in enumerate(_batches(examples, config.batch_size, stage.steps, config.seed + stage_index)):
        start = time.perf_counter()
        queries = [example.query for example in batch]
        candidates = [example.positive for example in batch] + [negative for example in batch for negative in example.negatives]
        with torch.autocast(device_type=device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            query_embeddings = embedder.embed(queries)  # (batch, d)
            candidate_embeddings = embedder.embed(candidates)  # (batch * (1 + n_neg), d)
        output = focal_embedding_loss(
            query_embeddings.float(), candidate_embeddings.float(), similarity=stage.similarity, temperature=stage.temperature,
            weight_temperature=config.weight_temperature, gamma=config.gamma,
        )
        optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        optimizer.step()
        if device_type == "cuda":
            torch.cuda.synchronize()
        parts = output.components()
        logs.append(VLStepLog(stage_index, step, parts["loss"], time.perf_counter() - start, parts["mean_weight"], parts["positive_accuracy"]))
        logger.info("stage %d step %d: loss=%.4f (%.2fs)", stage_index, step, parts["loss"], logs[-1].seconds)
    return logs


def train_vl_pace(embedder, examples: Sequence, config: VLPACEConfig | None = None,
                  autocast_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Stage I (cosine, LoRA on the LM) then Stage II (merged, dot, full LM); trains ``embedder`` in place.

    Returns ``{"logs": [...], "similarity": "dot", "config": {...}}``. Afterwards the embedder has no
    adapter, ``normalize=False`` and should be ranked by dot product.
    """
    from embedtune.encoders.vision_language import LANGUAGE_MODEL_LORA_TARGETS

    config = config or VLPACEConfig()
    logs: list[VLStepLog] = []
    embedder.normalize = False  # the loss normalises for cosine itself; Stage II needs raw norms
    if config.stage1.steps:
        if config.stage1.lora:
            add_lora(embedder, rank=config.lora_rank, alpha=config.lora_alpha, target_modules=LANGUAGE_MODEL_LORA_TARGETS, exclude_modules=None)
        else:
            embedder.unfreeze_language_model()
        embedder.freeze_vision()
        logs += run_vl_stage(embedder, examples, config.stage1, config, 1, autocast_dtype)
    if has_lora(embedder):
        merge_lora(embedder)  # makes every parameter trainable: refreeze the vision side below
    if config.stage2.lora:
        raise ValueError("Stage II trains the full language model (PACE); set stage2.lora=False.")
    embedder.unfreeze_language_model()
    embedder.freeze_vision()
    logs += run_vl_stage(embedder, examples, config.stage2, config, 2, autocast_dtype)
    return {"logs": logs, "similarity": config.stage2.similarity, "config": config.to_dict()}
