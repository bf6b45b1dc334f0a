"""PACE for Qwen vision-language embedders: a small two-stage training loop (paper §3.4, Appendix A).

Stage I: cosine similarity, LoRA on the language model only. Stage II starts from a Stage I step
(paper: step 2,000 of 7,847), with the adapter merged; the whole language model trains, similarity is
the dot product. The Focal Embedding Loss (:func:`embedtune.finetune.losses.focal_embedding_loss`) is
the objective in both stages. The vision tower and projector stay frozen throughout.

This loop is deliberately plain (no s-t Trainer, no GradCache, one process); it is what the tests,
``embedtune finetune pace-vl`` and ``benchmarks/gpu_smoke.sh`` run. :func:`run_vl_pace` is the
config-driven entry point (data, model, checkpoints, saved model and config).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from embedtune.data.mmeb import load_mmeb_eval, load_mmeb_train
from embedtune.evaluate.mmeb import evaluate_mmeb
from embedtune.finetune.losses import focal_embedding_loss
from embedtune.finetune.modeling import add_lora, has_lora, merge_lora, save_adapter
from embedtune.finetune.vl_config import TINY_MODELS, VLPACEConfig, VLStageConfig
from embedtune.io import atomic_write_json

__all__ = ["VLStageConfig", "VLPACEConfig", "VLStepLog", "VLPACEResult", "run_vl_stage", "train_vl_pace", "run_vl_pace",
           "load_vl_backbone", "stage_steps"]

logger = logging.getLogger(__name__)


@dataclass
class VLStepLog:
    stage: int
    step: int
    loss: float
    seconds: float
    mean_weight: float
    positive_accuracy: float
    learning_rate: float = 0.0


@dataclass
class VLPACEResult:
    """What :func:`run_vl_pace` did: the model folder, how to rank with it, per-step logs and timings."""

    model_dir: str
    similarity: str
    stage1_steps: int
    stage2_init_step: int | None
    stage2_steps: int | None
    n_examples: int
    seconds: dict[str, float]
    logs: list[dict[str, Any]]
    config: dict[str, Any]
    metrics: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stage_steps(stage: VLStageConfig, n_examples: int, batch_size: int) -> int:
    """The stage's schedule length: ``stage.steps``, or one epoch when it is None."""
    return stage.steps if stage.steps is not None else max(1, math.ceil(n_examples / batch_size))


def _batches(examples: Sequence, batch_size: int, steps: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(len(examples), generator=generator).tolist()
        yield [examples[index] for index in order[:batch_size]]
        del order[:batch_size]


def _schedule(stage: VLStageConfig, steps: int) -> Callable[[int], float]:
    warmup = int(stage.warmup_ratio * steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if stage.scheduler == "constant":
            return 1.0
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return factor


def run_vl_stage(embedder, examples: Sequence, stage: VLStageConfig, config: VLPACEConfig, stage_index: int,
                 autocast_dtype: torch.dtype | None = None, steps: int | None = None,
                 on_step: Callable[[int], bool] | None = None) -> list[VLStepLog]:
    """Train ``embedder`` in place for one stage; returns one log entry per step.

    Each step embeds the batch's queries, then its positives followed by every hard negative (at most
    ``config.n_negatives`` per query), and applies the Focal Embedding Loss with positives at candidate
    rows ``0..batch-1``. ``on_step(completed_steps)`` runs after each step; returning True stops the stage.
    """
    if len(examples) < 1:
        raise ValueError("the training set is empty.")
    trainable = [parameter for parameter in embedder.parameters() if parameter.requires_grad]
    if not trainable:
        raise ValueError("nothing to train: no parameter requires grad.")
    steps = stage_steps(stage, len(examples), config.batch_size) if steps is None else steps
    optimizer = torch.optim.AdamW(trainable, lr=stage.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(stage, steps))
    device_type = embedder.device.type
    logs = []
    embedder.train()
    for step, batch in enumerate(_batches(examples, config.batch_size, steps, config.seed + stage_index)):
        start = time.perf_counter()
        queries = [example.query for example in batch]
        negatives = [negative for example in batch for negative in example.negatives[:config.n_negatives]]
        candidates = [example.positive for example in batch] + negatives
        with torch.autocast(device_type=device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            query_embeddings = embedder.embed(queries)  # (batch, d)
            candidate_embeddings = embedder.embed(candidates)  # (batch + n_neg_total, d)
        output = focal_embedding_loss(
            query_embeddings.float(), candidate_embeddings.float(), similarity=stage.similarity, temperature=stage.temperature,
            weight_temperature=config.weight_temperature, gamma=config.gamma, weighting=stage.weighting,
        )
        optimizer.zero_grad(set_to_none=True)
        output.loss.backward()
        if config.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
        learning_rate = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        if device_type == "cuda":
            torch.cuda.synchronize()
        parts = output.components()
        logs.append(VLStepLog(stage_index, step, parts["loss"], time.perf_counter() - start, parts["mean_weight"],
                              parts["positive_accuracy"], learning_rate))
        logger.info("stage %d step %d/%d: loss=%.4f lr=%.3g (%.2fs)", stage_index, step + 1, steps, parts["loss"], learning_rate, logs[-1].seconds)
        if on_step is not None and on_step(step + 1):
            break
    return logs


def _snapshot(embedder) -> dict[str, torch.Tensor]:
    """CPU copies of the trainable parameters (the LoRA factors in a LoRA stage)."""
    return {name: parameter.detach().to("cpu", copy=True) for name, parameter in embedder.named_parameters() if parameter.requires_grad}


def _restore(embedder, snapshot: dict[str, torch.Tensor]) -> None:
    parameters = dict(embedder.named_parameters())
    with torch.no_grad():
        for name, value in snapshot.items():
            parameters[name].copy_(value.to(parameters[name].device))


def train_vl_pace(embedder, examples: Sequence, config: VLPACEConfig | None = None, autocast_dtype: torch.dtype | None = None,
                  checkpoint_dir: str | Path | None = None) -> dict[str, Any]:
    """Stage I (cosine, LoRA on the LM) then Stage II (merged, dot, full LM); trains ``embedder`` in place.

    Stage II starts from Stage I's weights at ``config.stage2_init_step(...)``: those are kept in memory
    (the LoRA factors; every LM weight for a full Stage I) and restored after Stage I, before merging.
    With ``checkpoint_dir``, the Stage I LoRA adapter is saved (PEFT format) at that step and at the end.

    Returns ``{"logs", "similarity", "config", "stage1_steps", "stage2_init_step", "stage2_steps"}``.
    Afterwards the embedder has no adapter and ``normalize=False``; rank it by ``similarity``.
    """
    config = config or VLPACEConfig()
    logs: list[VLStepLog] = []
    embedder.normalize = False  # the loss normalises for cosine itself; Stage II needs raw norms
    stage1_steps = stage_steps(config.stage1, len(examples), config.batch_size)
    init_step = config.stage2_init_step(stage1_steps) if config.stage2 is not None and config.stage1.steps != 0 else None
    snapshot: dict[str, torch.Tensor] | None = None
    if config.stage1.steps != 0:
        if config.stage1.lora:
            add_lora(embedder, rank=config.lora_rank, alpha=config.resolved_lora_alpha, target_modules=embedder.family.lora_targets,
                     exclude_modules=None)
            embedder.check_lora_targets()
        else:
            embedder.unfreeze_language_model()
        embedder.freeze_vision()

        def on_step(done: int) -> bool:
            nonlocal snapshot
            if init_step is not None and done == init_step < stage1_steps:
                snapshot = _snapshot(embedder)
                _save_adapter(embedder, checkpoint_dir, f"adapter-step-{done}")
                return config.stop_stage1_at_init
            return False

        logs += run_vl_stage(embedder, examples, config.stage1, config, 1, autocast_dtype, steps=stage1_steps, on_step=on_step)
        _save_adapter(embedder, checkpoint_dir, "adapter-final")
        if snapshot is not None and logs[-1].step + 1 > init_step:
            logger.info("Stage II starts from Stage I step %d of %d", init_step, stage1_steps)
            _restore(embedder, snapshot)
    if has_lora(embedder):
        merge_lora(embedder)  # makes every parameter trainable: refreeze the vision side below
    embedder.freeze_vision()
    similarity = config.stage1.similarity
    stage2_steps = None
    if config.stage2 is not None:
        embedder.unfreeze_language_model()
        embedder.freeze_vision()
        stage2_steps = stage_steps(config.stage2, len(examples), config.batch_size)
        logs += run_vl_stage(embedder, examples, config.stage2, config, 2, autocast_dtype, steps=stage2_steps)
        similarity = config.stage2.similarity
    return {"logs": logs, "similarity": similarity, "config": config.to_dict(), "stage1_steps": stage1_steps,
            "stage2_init_step": init_step, "stage2_steps": stage2_steps}


def _save_adapter(embedder, checkpoint_dir: str | Path | None, name: str) -> None:
    if checkpoint_dir is not None and has_lora(embedder):
        save_adapter(embedder, Path(checkpoint_dir) / name)


def load_vl_backbone(config: VLPACEConfig, device: str | None = None):
    """The :class:`QwenVLEmbedder` named by ``config.model`` (a ``tiny-*`` name builds one offline)."""
    from embedtune.encoders.vision_language import QwenVLEmbedder, apply_max_image_pixels  # heavy optional dependency: the VL stack

    if config.model in TINY_MODELS:
        from embedtune.encoders.tiny_vl import tiny_vl_embedder  # heavy optional dependency: the VL stack

        embedder = tiny_vl_embedder(TINY_MODELS[config.model], seed=config.seed)
        embedder.max_seq_length = config.max_seq_length
        apply_max_image_pixels(embedder.processor, config.max_image_pixels)
    else:
        if not Path(config.model).exists() and "/" not in config.model:
            raise FileNotFoundError(f"model={config.model!r} is neither a folder nor a hub id; give a checkpoint folder "
                                    f"or one of {sorted(TINY_MODELS)}.")
        embedder = QwenVLEmbedder.from_pretrained(config.model, max_seq_length=config.max_seq_length,
                                                  max_image_pixels=config.max_image_pixels)
    return embedder.to(device) if device is not None else embedder


def _autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    supported = device == "cuda" and torch.cuda.is_bf16_supported()
    if precision == "bf16" and not supported:
        raise ValueError("precision='bf16' needs a GPU with bf16 support; use precision='auto' or 'fp32' on this machine.")
    return torch.bfloat16 if precision != "fp32" and supported else None


def run_vl_pace(config: VLPACEConfig, evaluate_tasks: Sequence[str | Path] = (), device: str | None = None) -> VLPACEResult:
    """Train the recipe ``config`` describes and save the model to ``<output_dir>/model``.

    Writes ``<output_dir>/vl_pace_config.json``, Stage I adapters under ``<output_dir>/stage1/``,
    the final model (Hugging Face files + sentence-transformers layout + ``vl_pace_config.json``) and
    ``result.json``. ``evaluate_tasks``: MMEB-eval-style files scored after training (Precision@1).
    """
    if not config.train_data:
        raise ValueError("train_data is empty; give an MMEB-train-style .jsonl or .parquet file (--train FILE).")
    timings: dict[str, float] = {}
    started = time.perf_counter()
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config.save(output_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")

    start = time.perf_counter()
    examples = load_mmeb_train(config.train_data, image_root=config.image_root, instruction=config.instruction, task=config.task)
    embedder = load_vl_backbone(config, device)
    timings["load"] = time.perf_counter() - start

    start = time.perf_counter()
    outcome = train_vl_pace(embedder, examples, config, _autocast_dtype(config.precision, device), checkpoint_dir=output_dir / "stage1")
    timings["train"] = time.perf_counter() - start

    model_dir = output_dir / "model"
    embedder.save(model_dir, similarity=outcome["similarity"])
    config.save(model_dir)
    metrics = None
    if evaluate_tasks:
        start = time.perf_counter()
        eval_sets = [load_mmeb_eval(path, image_root=config.image_root, task="auto" if config.task == "auto" else None) for path in evaluate_tasks]
        metrics = evaluate_mmeb(embedder, eval_sets, outcome["similarity"])
        timings["evaluate"] = time.perf_counter() - start
    timings["total"] = time.perf_counter() - started
    result = VLPACEResult(
        model_dir=str(model_dir), similarity=outcome["similarity"], stage1_steps=outcome["stage1_steps"],
        stage2_init_step=outcome["stage2_init_step"], stage2_steps=outcome["stage2_steps"], n_examples=len(examples),
        seconds=timings, logs=[asdict(log) for log in outcome["logs"]], config=config.to_dict(), metrics=metrics,
    )
    atomic_write_json(output_dir / "result.json", result.to_dict())
    return result
