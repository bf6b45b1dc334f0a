"""Vision-language backbones: Qwen-VL embedders trained by a plain single-process loop (paper §3.4, Appendix A).

Training data are MMEB-train-style rows (query, positive, hard negatives; text and/or images). Stage I
puts LoRA on the language model only; Stage II starts from Stage I's weights at the init step (kept in
memory; the adapter is also saved in PEFT format) with the adapter merged, and trains the whole language
model. The vision tower and projector stay frozen throughout. Each step embeds the batch's queries,
then its positives followed by every hard negative, and applies the Focal Embedding Loss with positives
at candidate rows ``0..batch-1``.

This loop is deliberately plain (no s-t Trainer, no GradCache, one process); it is what the tests,
``embedtune finetune pace-vl`` and ``benchmarks/gpu_smoke.sh`` run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedtune.data.mmeb import load_mmeb_eval, load_mmeb_train
from embedtune.evaluate.mmeb import evaluate_mmeb
from embedtune.finetune.stages import StageResult, run_stages
from embedtune.finetune.config import TINY_VL_MODELS, PACEConfig, StageConfig
from embedtune.finetune.losses import focal_embedding_loss
from embedtune.finetune.modeling import add_lora, has_lora, merge_lora, save_adapter
from embedtune.runtime import progress_bar

logger = logging.getLogger(__name__)

__all__ = ["VisionLanguageBackbone", "VLStepLog", "load_vl_backbone", "run_vl_stage", "train_vl_pace", "autocast_dtype"]


@dataclass
class VLStepLog:
    """One step of the VL loop (the entries of ``train_vl_pace(...)["logs"]``)."""

    stage: int
    step: int
    loss: float
    seconds: float
    mean_weight: float
    positive_accuracy: float
    learning_rate: float = 0.0


def _batches(examples: Sequence, batch_size: int, steps: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(len(examples), generator=generator).tolist()
        yield [examples[index] for index in order[:batch_size]]
        del order[:batch_size]


def _schedule(stage: StageConfig, steps: int) -> Callable[[int], float]:
    warmup = int(stage.warmup_ratio * steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if stage.scheduler == "constant":
            return 1.0
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return factor


def _candidates(batch: Sequence, n_negatives: int | None) -> list:
    """Positives first (row i is query i's), then every query's first ``n_negatives`` hard negatives."""
    negatives = [negative for example in batch for negative in example.negatives[:n_negatives]]
    return [example.positive for example in batch] + negatives


def run_vl_stage(embedder, examples: Sequence, stage: StageConfig, config: PACEConfig, stage_index: int,
                 autocast_dtype: torch.dtype | None = None, steps: int | None = None,
                 on_step: Callable[[int], bool] | None = None, temperature: float | None = None) -> list[VLStepLog]:
    """Train ``embedder`` in place for one stage; returns one log entry per step.

    ``temperature`` is the resolved ``τ`` (default: the stage's, which must then be a number).
    ``on_step(completed_steps)`` runs after each step; returning True stops the stage.
    """
    if len(examples) < 1:
        raise ValueError("the training set is empty.")
    trainable = [parameter for parameter in embedder.parameters() if parameter.requires_grad]
    if not trainable:
        raise ValueError("nothing to train: no parameter requires grad.")
    temperature = float(stage.temperature if temperature is None else temperature)
    steps = (stage.steps if stage.steps is not None else max(1, math.ceil(len(examples) / config.batch_size))) if steps is None else steps
    optimizer = torch.optim.AdamW(trainable, lr=stage.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(stage, steps))
    device_type = embedder.device.type
    logs = []
    embedder.train()
    bar = progress_bar(steps, f"PACE stage{stage_index}", unit="step")  # one bar per stage; per-step lines are DEBUG
    for step, batch in enumerate(_batches(examples, config.batch_size, steps, config.seed + stage_index)):
        start = time.perf_counter()
        queries = [example.query for example in batch]
        candidates = _candidates(batch, config.n_negatives)
        with torch.autocast(device_type=device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            query_embeddings = embedder.embed(queries)  # (batch, d)
            candidate_embeddings = embedder.embed(candidates)  # (batch + n_neg_total, d)
        output = focal_embedding_loss(
            query_embeddings.float(), candidate_embeddings.float(), similarity=stage.similarity, temperature=temperature,
            weight_temperature=config.weight_temperature, gamma=stage.gamma, weighting=stage.weighting,
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
        logger.debug("stage %d step %d/%d: loss=%.4f lr=%.3g (%.2fs)", stage_index, step + 1, steps, parts["loss"], learning_rate, logs[-1].seconds)
        bar.set_postfix(loss=f"{parts['loss']:.4f}", lr=f"{learning_rate:.2e}", refresh=False)
        bar.update(1)
        if on_step is not None and on_step(step + 1):
            break
    bar.close()
    return logs


def _snapshot(embedder) -> dict[str, torch.Tensor]:
    """CPU copies of the trainable parameters (the LoRA factors in a LoRA stage)."""
    return {name: parameter.detach().to("cpu", copy=True) for name, parameter in embedder.named_parameters() if parameter.requires_grad}


def _restore(embedder, snapshot: dict[str, torch.Tensor]) -> None:
    parameters = dict(embedder.named_parameters())
    with torch.no_grad():
        for name, value in snapshot.items():
            parameters[name].copy_(value.to(parameters[name].device))


def load_vl_backbone(config: PACEConfig, device: str | None = None):
    """The :class:`QwenVLEmbedder` named by ``config.model`` (a ``tiny-*`` name builds one offline)."""
    from embedtune.encoders.vision_language import QwenVLEmbedder, apply_max_image_pixels  # heavy optional dependency: the VL stack

    max_image_pixels = config.vl.max_image_pixels if config.vl is not None else None
    if config.model in TINY_VL_MODELS:
        from embedtune.encoders.tiny_vl import tiny_vl_embedder  # heavy optional dependency: the VL stack

        embedder = tiny_vl_embedder(TINY_VL_MODELS[config.model], seed=config.seed)
        embedder.max_seq_length = config.max_seq_length
        apply_max_image_pixels(embedder.processor, max_image_pixels)
    else:
        if not Path(config.model).exists() and "/" not in config.model:
            raise FileNotFoundError(f"model={config.model!r} is neither a folder nor a hub id; give a checkpoint folder "
                                    f"or one of {sorted(TINY_VL_MODELS)}.")
        embedder = QwenVLEmbedder.from_pretrained(config.model, max_seq_length=config.max_seq_length, max_image_pixels=max_image_pixels)
    return embedder.to(device) if device is not None else embedder


def autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    """bf16 autocast for ``precision="auto"|"bf16"`` on a GPU that supports it; None (fp32) otherwise."""
    supported = device == "cuda" and torch.cuda.is_bf16_supported()
    if precision == "bf16" and not supported:
        raise ValueError("precision='bf16' needs a GPU with bf16 support; use precision='auto' or 'fp32' on this machine.")
    return torch.bfloat16 if precision != "fp32" and supported else None


class VisionLanguageBackbone:
    """PACE on a Qwen-VL embedder: MMEB-train data, the plain loop, Stage I weights kept in memory.

    Args:
        device: torch device (default: cuda when available).
        autocast: the autocast dtype; default from ``config.precision`` and the device.
    """

    world_size = 1

    def __init__(self, device: str | None = None, autocast: torch.dtype | None | str = "from-config") -> None:
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.autocast = autocast
        self._snapshot: dict[str, torch.Tensor] | None = None

    def _autocast(self, config: PACEConfig) -> torch.dtype | None:
        return autocast_dtype(config.precision, self.device) if self.autocast == "from-config" else self.autocast

    def seed(self, config: PACEConfig) -> None:
        """Nothing global: the data order is seeded per stage, a tiny backbone by ``config.seed``."""

    def load_training_data(self, config: PACEConfig, output_dir: Path, prepared: Sequence | None = None) -> Sequence:
        if prepared is not None:
            return prepared
        if not config.data:
            raise ValueError("data is empty; give an MMEB-train-style .jsonl or .parquet file (--data FILE).")
        return load_mmeb_train(config.data, image_root=config.vl.image_root, instruction=config.vl.instruction, task=config.vl.task)

    def load_model(self, config: PACEConfig):
        embedder = load_vl_backbone(config, self.device)
        embedder.normalize = False  # the loss normalises for cosine itself; Stage II needs raw norms
        return embedder

    def prepare_stage_one(self, model, config: PACEConfig):
        model.normalize = False
        if config.stage1.parameters == "lora":
            add_lora(model, rank=config.lora_rank, alpha=config.resolved_lora_alpha, target_modules=model.family.lora_targets,
                     exclude_modules=None)
            model.check_lora_targets()
        else:
            model.unfreeze_language_model()
        model.freeze_vision()
        return model

    @torch.no_grad()
    def norm_product_median(self, model, data: Sequence, config: PACEConfig) -> float:
        """median(‖q‖·‖c‖) over ``config.auto_temperature_samples`` training rows and their candidates."""
        rows = np.sort(np.random.default_rng(config.seed).choice(len(data), size=min(config.auto_temperature_samples, len(data)),
                                                                 replace=False)).tolist()
        sample = [data[row] for row in rows]
        was_training = model.training
        model.eval()
        dtype = self._autocast(config)
        with torch.autocast(device_type=model.device.type, dtype=dtype, enabled=dtype is not None):
            queries = torch.cat([model.embed([example.query for example in sample[i:i + config.batch_size]]).float()
                                 for i in range(0, len(sample), config.batch_size)])
            candidates = _candidates(sample, config.n_negatives)
            candidates = torch.cat([model.embed(candidates[i:i + config.batch_size]).float() for i in range(0, len(candidates), config.batch_size)])
        model.train(was_training)
        return float(torch.outer(queries.norm(dim=1), candidates.norm(dim=1)).median())  # (n_q, n_c) -> median

    def run_stage(self, name, model, data, stage, config, output_dir, *, steps, temperature, save_at, stop_after, callbacks,
                  norm_product_median=None) -> StageResult:
        if callbacks:
            raise ValueError("stage_callbacks are transformers TrainerCallbacks of the text backbone; the VL loop takes none.")
        stage_index = 1 if name == "stage1" else 2
        checkpoints: list[str] = []

        def on_step(done: int) -> bool:
            if done in save_at and done < steps:
                self._snapshot = _snapshot(model)
                checkpoints.extend(self._save_adapter(model, output_dir, f"adapter-step-{done}"))
            return stop_after is not None and done >= stop_after

        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        start = time.perf_counter()
        logs = run_vl_stage(model, data, stage, config, stage_index, self._autocast(config), steps=steps, on_step=on_step, temperature=temperature)
        seconds = time.perf_counter() - start
        if steps in save_at:
            checkpoints.extend(self._save_adapter(model, output_dir, "adapter-final"))
        return StageResult(
            name=name, similarity=stage.similarity, parameters=stage.parameters, steps=steps, steps_run=len(logs),
            learning_rate=stage.learning_rate, temperature=float(temperature), weighting=stage.weighting, gamma=stage.gamma,
            trainable_parameters=trainable, total_parameters=total, seconds=seconds, norm_product_median=norm_product_median,
            checkpoints=checkpoints,
            log_history=[{"step": log.step + 1, "loss": log.loss, "learning_rate": log.learning_rate, "mean_weight": log.mean_weight,
                          "positive_accuracy": log.positive_accuracy, "seconds": log.seconds} for log in logs],
        )

    @staticmethod
    def _save_adapter(model, directory: Path | None, name: str) -> list[str]:
        if directory is None or not has_lora(model):
            return []
        return [str(save_adapter(model, Path(directory) / name))]

    def start_stage_two(self, model, config: PACEConfig, stage1: StageResult | None, stage1_dir: Path | None, init_step: int | None):
        init_checkpoint = None
        if stage1 is not None and self._snapshot is not None and stage1.steps_run > init_step:
            logger.info("Stage II starts from Stage I step %d of %d", init_step, stage1.steps)
            _restore(model, self._snapshot)
        if stage1 is not None and init_step is not None and init_step < stage1.steps and stage1_dir is not None and has_lora(model):
            init_checkpoint = str(Path(stage1_dir) / f"adapter-step-{init_step}")
        self._snapshot = None
        if has_lora(model):
            merge_lora(model)  # makes every parameter trainable: refreeze the vision side below
        model.freeze_vision()
        model.unfreeze_language_model()
        model.freeze_vision()
        return model, init_checkpoint

    def finalize(self, model, similarity: str):
        if has_lora(model):
            merge_lora(model)
        model.freeze_vision()
        return model

    def save_model(self, model, config: PACEConfig, model_dir: Path, similarity: str) -> None:
        model.save(model_dir, similarity=similarity)
        config.save(model_dir)

    def evaluate(self, model, model_dir: Path, config: PACEConfig, similarity: str, target: Any) -> dict[str, Any]:
        task = "auto" if config.vl.task == "auto" else None
        eval_sets = [load_mmeb_eval(path, image_root=config.vl.image_root, task=task) for path in target]
        return evaluate_mmeb(model, eval_sets, similarity)


def train_vl_pace(embedder, examples: Sequence, config: PACEConfig | None = None, autocast_dtype: torch.dtype | None = None,
                  checkpoint_dir: str | Path | None = None) -> dict[str, Any]:
    """Both stages on an embedder already in memory; trains ``embedder`` in place (what ``train_pace`` runs for VL).

    With ``checkpoint_dir``, the Stage I LoRA adapter is saved (PEFT format) at the init step and at the end.
    Returns ``{"logs": [VLStepLog], "similarity", "config", "stage1_steps", "stage2_init_step", "stage2_steps"}``.
    Afterwards the embedder has no adapter and ``normalize=False``; rank it by ``similarity``.
    """
    config = config or PACEConfig(backbone="vl")
    if config.backbone != "vl":
        raise ValueError(f"train_vl_pace needs a config with backbone='vl'; got {config.backbone!r}.")
    backbone = VisionLanguageBackbone(device=embedder.device.type, autocast=autocast_dtype)
    embedder.normalize = False
    outcome = run_stages(backbone, embedder, examples, config, Path(checkpoint_dir) if checkpoint_dir is not None else None, None)
    logs = [VLStepLog(index + 1, entry["step"] - 1, entry["loss"], entry["seconds"], entry["mean_weight"], entry["positive_accuracy"],
                      entry["learning_rate"])
            for stage in outcome.stages for index in [0 if stage.name == "stage1" else 1] for entry in stage.log_history]
    by_name = {stage.name: stage for stage in outcome.stages}
    return {"logs": logs, "similarity": outcome.similarity, "config": config.to_dict(),
            "stage1_steps": outcome.stage1_steps, "stage2_init_step": outcome.init_step,
            "stage2_steps": by_name["stage2"].steps if "stage2" in by_name else None}
