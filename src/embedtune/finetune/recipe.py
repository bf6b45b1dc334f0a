"""The PACE recipe (§3.3, §4.1, Appendix A): Stage I cosine+LoRA, then Stage II dot+full from an
intermediate Stage I checkpoint, on sentence-transformers' trainer.

``train_pace(config)`` runs the whole recipe (or a baseline/ablation preset) and returns a
:class:`PACEResult`; the final model is a plain s-t folder at ``<output_dir>/model``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from embedtune.data.beir import load_beir
from embedtune.encoders.dataset import embed_dataset
from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.finetune.config import PACEConfig, StageConfig, steps_per_epoch
from embedtune.finetune.data import TrainingTuples, mine_training_tuples
from embedtune.finetune.losses import CachedFocalEmbeddingLoss, FocalEmbeddingLoss
from embedtune.finetune.modeling import (
    add_lora,
    enable_all_gradients,
    finalize_for_similarity,
    load_base_model,
    load_stage_checkpoint,
    parameter_fingerprint,
)
from embedtune.io import atomic_write_json

logger = logging.getLogger(__name__)

__all__ = [
    "PACEResult",
    "StageResult",
    "auto_temperature",
    "build_loss",
    "evaluate_model",
    "prepare_stage_two",
    "run_stage",
    "train_pace",
]


@dataclass
class StageResult:
    """What one stage did.

    Attributes:
        name: ``stage1`` or ``stage2``.
        steps: optimizer steps of the schedule; ``steps_run``: steps actually taken.
        temperature: the resolved ``τ``; ``norm_product_median``: the measured median(‖q‖·‖c‖) when 'auto'.
        init_checkpoint: the checkpoint the stage started from (Stage II).
        seconds: wall-clock training time of the stage (trainer only).
        log_history: the trainer's logs (loss and its components per logging step).
        checkpoints: checkpoint folders written.
    """

    name: str
    similarity: str
    parameters: str
    steps: int
    steps_run: int
    learning_rate: float
    temperature: float
    weighting: str
    gamma: float
    trainable_parameters: int
    total_parameters: int
    seconds: float
    norm_product_median: float | None = None
    init_checkpoint: str | None = None
    init_fingerprint: dict[str, Any] | None = None
    checkpoints: list[str] = field(default_factory=list)
    log_history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class PACEResult:
    """Outcome of :func:`train_pace`: the final model folder, per-stage results and timings."""

    model_dir: str
    similarity: str
    stages: list[StageResult]
    n_training_tuples: int
    seconds: dict[str, float]
    config: dict[str, Any]
    metrics: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _precision(config: PACEConfig) -> dict[str, bool]:
    if config.precision == "fp32":
        return {}
    supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if config.precision == "bf16" and not supported:
        raise ValueError("precision='bf16' needs a GPU with bf16 support; use 'auto' or 'fp32' on this machine.")
    return {"bf16": True} if supported else {}


@torch.no_grad()
def auto_temperature(model, train_dataset, base_temperature: float = 0.1, n_samples: int = 32, batch_size: int = 32, seed: int = 0) -> tuple[float, float]:
    """``τ = base_temperature × median(‖q‖·‖c‖)`` over a sample of training queries and candidates.

    The dot-product logit ``q·c/τ = cos(q, c) · ‖q‖‖c‖ / τ`` then starts at the scale of the
    cosine logit ``cos/τ_1`` for a typical pair. Every (query, candidate) pair of the sample counts.

    Returns:
        ``(τ, median)``.
    """
    n_rows = len(train_dataset)
    rows = np.sort(np.random.default_rng(seed).choice(n_rows, size=min(n_samples, n_rows), replace=False)).tolist()
    sample = train_dataset.select(rows)
    candidate_columns = [name for name in sample.column_names if name != "anchor"]
    was_training = model.training
    model.eval()
    queries = model.encode(list(sample["anchor"]), batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=False, show_progress_bar=False)
    candidates = model.encode(
        [text for name in candidate_columns for text in sample[name]],
        batch_size=batch_size,
        convert_to_tensor=True,
        normalize_embeddings=False,
        show_progress_bar=False,
    )
    model.train(was_training)
    products = torch.outer(queries.float().norm(dim=1), candidates.float().norm(dim=1))  # (n_q, n_c)
    median = float(products.median())
    return base_temperature * median, median


def build_loss(model, stage: StageConfig, config: PACEConfig, temperature: float):
    """The stage's Focal Embedding Loss (GradCache version when ``config.mini_batch_size`` is set), or
    sentence-transformers' own MNRL with hardness weighting when ``stage.loss == "mnrl"`` (a baseline)."""
    if stage.loss == "mnrl":
        from sentence_transformers.sentence_transformer.losses import (
            CachedMultipleNegativesRankingLoss,
            MultipleNegativesRankingLoss,
        )

        mnrl = dict(scale=1.0 / temperature, hardness_mode=stage.hardness_mode, hardness_strength=stage.hardness_strength,
                    gather_across_devices=True)
        if config.mini_batch_size is not None:
            return CachedMultipleNegativesRankingLoss(model, mini_batch_size=config.mini_batch_size, **mnrl)
        return MultipleNegativesRankingLoss(model, **mnrl)
    common = dict(
        similarity=stage.similarity,
        temperature=temperature,
        weight_temperature=config.weight_temperature,
        gamma=stage.gamma,
        weighting=stage.weighting,
        normalize=config.normalize,
        gather_across_devices=True,
        seed=config.seed,
    )
    if config.mini_batch_size is not None:
        return CachedFocalEmbeddingLoss(model, mini_batch_size=config.mini_batch_size, **common)
    return FocalEmbeddingLoss(model, **common)


def run_stage(
    name: str,
    model,
    train_dataset,
    stage: StageConfig,
    config: PACEConfig,
    output_dir: Path,
    save_at: set[int] | None = None,
    stop_after: int | None = None,
    callbacks: list | None = None,
) -> StageResult:
    """Train ``model`` in place for one stage with the s-t trainer.

    ``model`` must already be prepared (LoRA attached or all parameters trainable). Checkpoints keep
    the optimizer and scheduler state, so a killed stage resumes from its latest checkpoint in
    ``output_dir`` (same data order, same schedule).
    """
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers

    from embedtune.finetune.trainer import PACETrainer, StageCheckpointCallback  # heavy optional dependency: transformers' Trainer

    world_size = _world_size()
    steps = stage.steps or steps_per_epoch(len(train_dataset), config.batch_size, world_size)
    norm_median = None
    temperature = stage.temperature
    if temperature == "auto":
        temperature, norm_median = auto_temperature(
            model, train_dataset, stage.base_temperature, config.auto_temperature_samples, config.batch_size, config.seed
        )
        logger.info("%s: temperature auto = %.4g × median(‖q‖·‖c‖) %.4g = %.4g", name, stage.base_temperature, norm_median, temperature)
    loss = build_loss(model, stage, config, float(temperature))
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=stage.learning_rate,
        warmup_steps=stage.warmup_ratio,  # a float < 1 is a ratio in transformers >= 5
        lr_scheduler_type="linear",
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=config.seed,
        data_seed=config.seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        dataloader_drop_last=world_size > 1,  # the global gather needs equal per-process batches
        ddp_find_unused_parameters=world_size > 1,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_only_model=False,  # optimizer + scheduler + RNG state, so a killed stage resumes exactly
        logging_steps=config.logging_steps,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        deepspeed=config.deepspeed,
        disable_tqdm=True,
        **_precision(config),
    )
    callback = StageCheckpointCallback(save_at=save_at, stop_after=stop_after)
    trainer = PACETrainer(model=model, args=args, train_dataset=train_dataset, loss=loss, callbacks=[callback, *(callbacks or [])])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info("%s: %s + %s, %d steps, lr %.2g, τ %.4g, weighting %s (γ=%s); %d of %d parameters trainable",
                name, stage.similarity, stage.parameters, steps, stage.learning_rate, temperature, stage.weighting, stage.gamma, trainable, total)
    resume = latest_resumable_checkpoint(output_dir)
    if resume is not None:
        logger.info("%s: resuming from %s", name, resume)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    seconds = time.perf_counter() - start
    checkpoints = sorted((str(p) for p in output_dir.glob("checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
    return StageResult(
        name=name,
        similarity=stage.similarity,
        parameters=stage.parameters,
        steps=steps,
        steps_run=int(trainer.state.global_step),
        learning_rate=stage.learning_rate,
        temperature=float(temperature),
        weighting=stage.weighting,
        gamma=stage.gamma,
        trainable_parameters=trainable,
        total_parameters=total,
        seconds=seconds,
        norm_product_median=norm_median,
        checkpoints=checkpoints,
        log_history=list(trainer.state.log_history),
    )


def latest_resumable_checkpoint(output_dir: Path) -> Path | None:
    """The highest-step ``checkpoint-N`` in ``output_dir`` that holds a complete trainer state."""
    candidates = []
    for path in Path(output_dir).glob("checkpoint-*"):
        suffix = path.name.rsplit("-", 1)[1]
        if suffix.isdigit() and (path / "trainer_state.json").is_file() and (path / "optimizer.pt").is_file():
            candidates.append((int(suffix), path))
    return max(candidates)[1] if candidates else None


def _prepare_parameters(model, stage: StageConfig, config: PACEConfig):
    if stage.parameters == "lora":
        return add_lora(
            model,
            rank=config.lora_rank,
            alpha=config.resolved_lora_alpha,
            dropout=config.lora_dropout,
            target_modules=config.lora_target_modules,
            exclude_modules=config.lora_exclude_modules,
        )
    enable_all_gradients(model)
    return model


def prepare_stage_two(config: PACEConfig, checkpoint: str | Path):
    """Stage II's starting model: the Stage I checkpoint, LoRA merged (``merge_and_unload``), then
    every parameter trainable (``full``) or a fresh LoRA adapter (``lora``: the S2-LoRA ablation)."""
    if config.stage2 is None:
        raise ValueError("this config has no Stage II.")
    model = load_stage_checkpoint(checkpoint, config.model, max_seq_length=config.max_seq_length)
    return _prepare_parameters(model, config.stage2, config)


def train_pace(
    config: PACEConfig,
    tuples: TrainingTuples | None = None,
    evaluate_split: str | None = None,
    stage_callbacks: Callable[[str, int, str], list] | None = None,
) -> PACEResult:
    """Run the recipe ``config`` describes and save the final model to ``<output_dir>/model``.

    Args:
        config: the recipe (see :func:`embedtune.finetune.preset_config`).
        tuples: training tuples; default mines them from ``config.data``'s ``config.train_split`` qrels
            with the frozen ``config.model``.
        evaluate_split: if given (e.g. ``"test"``), evaluate the final model on that qrels split with
            its training similarity (main process only).
        stage_callbacks: ``(stage_name, update_offset, similarity) -> [TrainerCallback, ...]``, e.g. a
            :class:`embedtune.finetune.validation.ValidationCallback` per stage. ``update_offset`` is the
            number of optimizer updates on the final model's path before this stage.

    A killed run resumes: each stage continues from its latest checkpoint in ``output_dir``.
    """
    timings: dict[str, float] = {}
    started = time.perf_counter()
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if _is_main_process():
        config.save(output_dir)
    torch.manual_seed(config.seed)

    start = time.perf_counter()
    dataset = load_beir(config.data, config.train_split)
    if tuples is None:
        encoder = SentenceEncoder(config.model, max_seq_length=config.max_seq_length, normalize=True, show_progress=False)
        tuples = mine_training_tuples(dataset, encoder, n_negatives=config.n_negatives, hard_pool=config.hard_pool, seed=config.seed)
    if _is_main_process():
        tuples.save(output_dir / "train_tuples.json")
    train_dataset = tuples.to_dataset(dataset)
    timings["data"] = time.perf_counter() - start

    stage1_steps = config.stage1.steps or steps_per_epoch(len(train_dataset), config.batch_size, _world_size())
    init_step = config.stage2_init_step(stage1_steps) if config.stage2 is not None else None
    model = load_base_model(config.model, max_seq_length=config.max_seq_length)
    model = _prepare_parameters(model, config.stage1, config)
    stage1 = run_stage(
        "stage1",
        model,
        train_dataset,
        config.stage1,
        config,
        output_dir / "stage1",
        save_at={init_step, stage1_steps} if init_step else {stage1_steps},
        stop_after=init_step if config.stop_stage1_at_init else None,
        callbacks=stage_callbacks("stage1", 0, config.stage1.similarity) if stage_callbacks else None,
    )
    timings["stage1"] = stage1.seconds
    stages = [stage1]
    final_similarity = config.stage1.similarity

    if config.stage2 is not None:
        _barrier()  # rank 0 wrote the checkpoint
        checkpoint = output_dir / "stage1" / f"checkpoint-{init_step}"
        del model
        start = time.perf_counter()
        model = prepare_stage_two(config, checkpoint)
        timings["stage2_prepare"] = time.perf_counter() - start
        fingerprint = parameter_fingerprint(model)
        stage2 = run_stage("stage2", model, train_dataset, config.stage2, config, output_dir / "stage2", save_at=set(),
                           callbacks=stage_callbacks("stage2", init_step, config.stage2.similarity) if stage_callbacks else None)
        stage2.init_checkpoint = str(checkpoint)
        stage2.init_fingerprint = fingerprint
        timings["stage2"] = stage2.seconds
        stages.append(stage2)
        final_similarity = config.stage2.similarity

    model_dir = output_dir / "model"
    model = finalize_for_similarity(model, final_similarity)
    if _is_main_process():
        model.save(str(model_dir))
    _barrier()
    result = PACEResult(
        model_dir=str(model_dir),
        similarity=final_similarity,
        stages=stages,
        n_training_tuples=len(tuples),
        seconds=timings,
        config=config.to_dict(),
    )
    if evaluate_split and _is_main_process():
        start = time.perf_counter()
        metrics = evaluate_model(model_dir, config.data, evaluate_split, similarity=final_similarity, max_seq_length=config.max_seq_length)
        result.metrics = metrics.to_dict()
        timings["evaluate"] = time.perf_counter() - start
    timings["total"] = time.perf_counter() - started
    if _is_main_process():
        atomic_write_json(output_dir / "result.json", _json_safe(result.to_dict()))
    return result


def evaluate_model(
    model: str | Path,
    data: str | Path = "scifact",
    split: str = "test",
    similarity: str = "cosine",
    max_seq_length: int | None = None,
    batch_size: int = 64,
    cache: bool = True,
    top_k: int = 100,
):
    """Retrieval metrics of ``model`` on ``data``'s ``split`` qrels, ranking by ``similarity``.

    ``"dot"`` ranks by the unnormalised dot product (the PACE Stage II setting); ``"cosine"``
    L2-normalises first. This is what ``embedtune evaluate --similarity dot`` should call.
    Returns a :class:`embedtune.evaluate.RetrievalMetrics`.
    """
    if similarity not in ("cosine", "dot"):
        raise ValueError(f"similarity must be 'cosine' or 'dot'; got {similarity!r}.")
    dataset = load_beir(data, split)
    encoder = SentenceEncoder(str(model), max_seq_length=max_seq_length, batch_size=batch_size, normalize=similarity == "cosine", show_progress=False)
    embeddings = embed_dataset(encoder, dataset, cache=cache)
    ids = dataset.judged_query_ids()
    return evaluate_embeddings(ids, embeddings.queries(ids), embeddings.doc_ids, embeddings.doc_embeddings, {q: dataset.qrels[q] for q in ids}, top_k)


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return json.loads(json.dumps(value, default=str))
