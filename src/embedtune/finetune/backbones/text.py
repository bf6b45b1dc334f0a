"""Text backbones: a sentence-transformers model trained with the s-t trainer (PACE §3.3, §4.1).

Training data are (query, positive, K hard negatives) tuples mined from BEIR qrels with the frozen
model; each stage is one ``SentenceTransformerTrainer`` run whose checkpoints keep the optimizer and
scheduler state, so a killed stage resumes from its latest checkpoint. Stage II starts from the Stage I
checkpoint on disk. The final model is a plain s-t folder.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedtune.data.beir import load_beir
from embedtune.encoders.dataset import embed_dataset
from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.evaluate.metrics import DEFAULT_METRICS, mteb_retrieval_metrics
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.finetune.stages import StageResult
from embedtune.finetune.config import PACEConfig, StageConfig, stage_steps
from embedtune.finetune.data import TrainingTuples, mine_training_tuples
from embedtune.finetune.losses import CachedFocalEmbeddingLoss, FocalEmbeddingLoss
from embedtune.finetune.modeling import (
    add_lora,
    enable_all_gradients,
    finalize_for_similarity,
    load_base_model,
    load_stage_checkpoint,
)

logger = logging.getLogger(__name__)

__all__ = [
    "TextBackbone",
    "auto_temperature",
    "build_loss",
    "memory_bounded_mini_batch",
    "activation_bytes_per_text",
    "evaluate_model",
    "is_main_process",
    "latest_resumable_checkpoint",
    "prepare_stage_two",
    "run_stage",
    "world_size",
]

# lr_scheduler_type of transformers' Trainer for each StageConfig.scheduler
_SCHEDULERS = {"linear": "linear", "constant": "constant_with_warmup"}


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _precision(config: PACEConfig) -> dict[str, bool]:
    if config.precision == "fp32":
        return {}
    supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if config.precision == "bf16" and not supported:
        raise ValueError("precision='bf16' needs a GPU with bf16 support; use 'auto' or 'fp32' on this machine.")
    return {"bf16": True} if supported else {}


def auto_temperature(model, train_dataset, base_temperature: float = 0.1, n_samples: int = 32, batch_size: int = 32, seed: int = 0) -> tuple[float, float]:
    """``τ = base_temperature × median(‖q‖·‖c‖)`` over a sample of training queries and candidates.

    The dot-product logit ``q·c/τ = cos(q, c) · ‖q‖‖c‖ / τ`` then starts at the scale of the
    cosine logit ``cos/τ_1`` for a typical pair. Every (query, candidate) pair of the sample counts.
    The rule is :meth:`StageConfig.resolve_temperature`'s, for a dot stage with ``temperature="auto"``.

    Returns:
        ``(τ, median)``.
    """
    stage = StageConfig(similarity="dot", temperature="auto", base_temperature=base_temperature)
    return stage.resolve_temperature(lambda: measure_norm_product_median(model, train_dataset, n_samples, batch_size, seed))


@torch.no_grad()
def measure_norm_product_median(model, train_dataset, n_samples: int = 32, batch_size: int = 32, seed: int = 0) -> float:
    """median(‖q‖·‖c‖) over ``n_samples`` training rows: every (query, candidate) pair of the sample counts."""
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
    return float(products.median())


# Activations a CPU training step may hold at once without a configured mini_batch_size (see memory_bounded_mini_batch).
CPU_ACTIVATION_BUDGET_BYTES = 1024**3


def activation_bytes_per_text(model) -> int:
    """Bytes of activations one text of ``model``'s max sequence length keeps for backward (an estimate).

    Per layer and token: three attention maps of ``heads × length`` floats (scores, probabilities,
    dropout), two feed-forward tensors of ``intermediate`` floats and about twelve of ``hidden``.
    MiniLM-L6 at 256 tokens: 104 MB by this estimate, 115 MB measured (benchmarks/RESULTS.md,
    "A newcomer's first hour").
    """
    try:
        config = model[0].auto_model.config
        length = int(model.max_seq_length or 512)
        layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
        hidden, intermediate = int(config.hidden_size), int(getattr(config, "intermediate_size", 4 * config.hidden_size))
    except (AttributeError, IndexError, KeyError, TypeError):
        return 0
    return 4 * layers * length * (3 * heads * length + 2 * intermediate + 12 * hidden)


def memory_bounded_mini_batch(model, config: PACEConfig, texts_per_example: int, on_gpu: bool | None = None) -> int | None:
    """The GradCache mini-batch a stage trains with: ``config.mini_batch_size``, else, on a CPU, one
    that keeps a step's activations under :data:`CPU_ACTIVATION_BUDGET_BYTES`.

    Without it a step holds every text of the batch (``batch_size × texts_per_example``: 32 × 7
    for PACE's 5 negatives) with its graph: 19.9 GB peak for MiniLM. GradCache embeds in
    mini-batches and gives the whole batch's gradients (up to rounding,
    tests/test_gradcache_focal.py; dropout masks are drawn per mini-batch, so a run is not
    bit-identical to one without it), for about one more forward pass per step. None: no GradCache (a GPU, or a batch that fits).
    """
    if config.mini_batch_size is not None or config.deepspeed:
        return config.mini_batch_size
    if on_gpu is None:
        on_gpu = torch.cuda.is_available()
    per_text = activation_bytes_per_text(model)
    if on_gpu or per_text <= 0 or config.batch_size * texts_per_example * per_text <= CPU_ACTIVATION_BUDGET_BYTES:
        return None
    return max(1, min(config.batch_size, CPU_ACTIVATION_BUDGET_BYTES // per_text))


def build_loss(model, stage: StageConfig, config: PACEConfig, temperature: float, mini_batch_size: int | None = None):
    """The stage's Focal Embedding Loss (GradCache version when ``mini_batch_size``, default
    ``config.mini_batch_size``, is set), or sentence-transformers' own MNRL with hardness weighting
    when ``stage.loss == "mnrl"`` (a baseline)."""
    mini_batch_size = config.mini_batch_size if mini_batch_size is None else mini_batch_size
    if stage.loss == "mnrl":
        from sentence_transformers.sentence_transformer.losses import (
            CachedMultipleNegativesRankingLoss,
            MultipleNegativesRankingLoss,
        )

        mnrl = dict(scale=1.0 / temperature, hardness_mode=stage.hardness_mode, hardness_strength=stage.hardness_strength,
                    gather_across_devices=True)
        if mini_batch_size is not None:
            return CachedMultipleNegativesRankingLoss(model, mini_batch_size=mini_batch_size, **mnrl)
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
    if mini_batch_size is not None:
        return CachedFocalEmbeddingLoss(model, mini_batch_size=mini_batch_size, **common)
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
    *,
    steps: int | None = None,
    temperature: float | None = None,
    norm_product_median: float | None = None,
) -> StageResult:
    """Train ``model`` in place for one stage with the s-t trainer.

    ``model`` must already be prepared (LoRA attached or all parameters trainable). ``steps`` and a
    resolved ``temperature`` default to the stage's (one epoch; 'auto' measured here). Checkpoints keep
    the optimizer and scheduler state, so a killed stage resumes from its latest checkpoint in
    ``output_dir`` (same data order, same schedule).
    """
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from transformers import TrainerState

    from embedtune.finetune.trainer import (  # heavy optional dependency: transformers' Trainer
        PACETrainer,
        StageCheckpointCallback,
        StepProgressCallback,
    )

    processes = world_size()
    steps = steps or stage_steps(stage, len(train_dataset), config.batch_size, processes)
    if temperature is None:
        temperature, measured = stage.resolve_temperature(
            lambda: measure_norm_product_median(model, train_dataset, config.auto_temperature_samples, config.batch_size, config.seed)
        )
        norm_product_median = measured if measured is not None else norm_product_median
    texts_per_example = len(getattr(train_dataset, "column_names", None) or []) or 2 + int(config.n_negatives or 0)
    mini_batch = memory_bounded_mini_batch(model, config, texts_per_example)
    if mini_batch is not None and config.mini_batch_size is None:
        per_text = activation_bytes_per_text(model)
        logger.info("%s: no GPU, so GradCache in mini-batches of %d texts bounds a step's activations to about %.1f GB "
                    "(the whole batch of %d texts would hold about %.1f GB); the gradients are the whole batch's. "
                    "--mini-batch-size sets it.",
                    name, mini_batch, mini_batch * per_text / 1e9, config.batch_size * texts_per_example,
                    config.batch_size * texts_per_example * per_text / 1e9)
    loss = build_loss(model, stage, config, float(temperature), mini_batch)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=stage.learning_rate,
        warmup_steps=stage.warmup_ratio,  # a float < 1 is a ratio in transformers >= 5
        lr_scheduler_type=_SCHEDULERS[stage.scheduler],
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=config.max_grad_norm if config.max_grad_norm is not None else 0.0,  # 0: no clipping
        seed=config.seed,
        data_seed=config.seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        dataloader_drop_last=processes > 1,  # the global gather needs equal per-process batches
        ddp_find_unused_parameters=processes > 1,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_only_model=False,  # optimizer + scheduler + RNG state, so a killed stage resumes exactly
        logging_steps=config.logging_steps,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        deepspeed=config.deepspeed,
        disable_tqdm=True,  # StepProgressCallback draws embedtune's bar (loss and lr in the postfix)
        **_precision(config),
    )
    callback = StageCheckpointCallback(save_at=save_at, stop_after=stop_after)
    progress = StepProgressCallback(f"PACE {name}")
    trainer = PACETrainer(model=model, args=args, train_dataset=train_dataset, loss=loss, callbacks=[callback, progress, *(callbacks or [])])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.debug("%s: %s + %s, %d steps, lr %.2g, τ %.4g, weighting %s (γ=%s); %d of %d parameters trainable",
                name, stage.similarity, stage.parameters, steps, stage.learning_rate, temperature, stage.weighting, stage.gamma, trainable, total)
    resume = latest_resumable_checkpoint(output_dir)
    end_step = min(steps, stop_after) if stop_after is not None else steps
    start = time.perf_counter()
    if resume is not None and int(resume.name.rsplit("-", 1)[1]) >= end_step:
        # A rerun of a finished stage: transformers would take one step past the checkpoint before it stops.
        logger.info("%s: already complete at %s", name, resume)
        trainer.load_checkpoint(str(resume))
        state = TrainerState.load_from_json(str(resume / "trainer_state.json"))
    else:
        if resume is not None:
            logger.info("%s: resuming from %s", name, resume)
        trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
        state = trainer.state
    seconds = time.perf_counter() - start
    checkpoints = sorted((str(p) for p in output_dir.glob("checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
    return StageResult(
        name=name,
        similarity=stage.similarity,
        parameters=stage.parameters,
        steps=steps,
        steps_run=int(state.global_step),
        learning_rate=stage.learning_rate,
        temperature=float(temperature),
        weighting=stage.weighting,
        gamma=stage.gamma,
        trainable_parameters=trainable,
        total_parameters=total,
        seconds=seconds,
        norm_product_median=norm_product_median,
        checkpoints=checkpoints,
        log_history=list(state.log_history),
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


def evaluate_model(
    model: str | Path,
    data: str | Path = "scifact",
    split: str = "test",
    similarity: str = "cosine",
    max_seq_length: int | None = None,
    batch_size: int = 64,
    cache: bool = True,
    top_k: int = 100,
    metrics: tuple[str, ...] = DEFAULT_METRICS,
):
    """Retrieval metrics of ``model`` on ``data``'s ``split`` qrels, ranking by ``similarity``.

    ``"dot"`` ranks by the unnormalised dot product (the PACE Stage II setting); ``"cosine"``
    L2-normalises first. This is what ``embedtune evaluate --similarity dot`` should call.
    ``metrics``: the names to compute (e.g. :func:`~embedtune.evaluate.metrics.mteb_retrieval_metrics`).
    Returns a :class:`embedtune.evaluate.RetrievalMetrics`.
    """
    if similarity not in ("cosine", "dot"):
        raise ValueError(f"similarity must be 'cosine' or 'dot'; got {similarity!r}.")
    dataset = load_beir(data, split)
    encoder = SentenceEncoder(str(model), max_seq_length=max_seq_length, batch_size=batch_size, normalize=similarity == "cosine")
    embeddings = embed_dataset(encoder, dataset, cache=cache)
    ids = dataset.judged_query_ids()
    return evaluate_embeddings(ids, embeddings.queries(ids), embeddings.doc_ids, embeddings.doc_embeddings, {q: dataset.qrels[q] for q in ids}, top_k,
                               metrics=metrics)


# Documents retrieved per query when a fine-tuned model is evaluated (as ``embedtune evaluate --top-k``'s default).
_EVALUATE_TOP_K = 100


class TextBackbone:
    """PACE on a sentence-transformers model: BEIR data, the s-t trainer, checkpoints on disk."""

    @property
    def world_size(self) -> int:
        return world_size()

    def seed(self, config: PACEConfig) -> None:
        torch.manual_seed(config.seed)

    def load_training_data(self, config: PACEConfig, output_dir: Path, prepared: TrainingTuples | None = None):
        dataset = load_beir(config.data, config.train_split)
        tuples = prepared
        if tuples is None:
            # The mining encode of the corpus can take minutes: embed_dataset draws one bar over it.
            encoder = SentenceEncoder(config.model, max_seq_length=config.max_seq_length, normalize=True, show_progress=is_main_process())
            tuples = mine_training_tuples(dataset, encoder, n_negatives=config.n_negatives, hard_pool=config.hard_pool, seed=config.seed)
        if is_main_process():
            tuples.save(output_dir / "train_tuples.json")
        return tuples.to_dataset(dataset)

    def load_model(self, config: PACEConfig):
        return load_base_model(config.model, max_seq_length=config.max_seq_length)

    def prepare_stage_one(self, model, config: PACEConfig):
        return _prepare_parameters(model, config.stage1, config)

    def norm_product_median(self, model, data, config: PACEConfig) -> float:
        return measure_norm_product_median(model, data, config.auto_temperature_samples, config.batch_size, config.seed)

    def run_stage(self, name, model, data, stage, config, output_dir, *, steps, temperature, save_at, stop_after, callbacks,
                  norm_product_median=None) -> StageResult:
        return run_stage(name, model, data, stage, config, output_dir, save_at=save_at, stop_after=stop_after, callbacks=callbacks,
                         steps=steps, temperature=temperature, norm_product_median=norm_product_median)

    def start_stage_two(self, model, config: PACEConfig, stage1: StageResult | None, stage1_dir: Path | None, init_step: int | None):
        checkpoint = Path(stage1_dir) / f"checkpoint-{init_step}"
        del model  # Stage II reloads Stage I's weights at init_step from disk
        return prepare_stage_two(config, checkpoint), str(checkpoint)

    def finalize(self, model, similarity: str):
        return finalize_for_similarity(model, similarity)

    def save_model(self, model, config: PACEConfig, model_dir: Path, similarity: str) -> None:
        if is_main_process():
            model.save(str(model_dir))

    def evaluate(self, model, model_dir: Path, config: PACEConfig, similarity: str, target: Any) -> dict[str, Any]:
        # One search, scored with every metric MTEB writes for a retrieval task (nDCG, MAP, recall, precision and
        # MRR at 1..100 of the top 100): the headline and per-query values keep the default metrics, "mteb" has them all
        # (for mteb/<Task>.json).
        scored = evaluate_model(model_dir, config.data, target, similarity=similarity, max_seq_length=config.max_seq_length,
                                top_k=_EVALUATE_TOP_K, metrics=mteb_retrieval_metrics(_EVALUATE_TOP_K))
        return {**{name: scored.aggregate[name] for name in DEFAULT_METRICS}, "n_queries": scored.n_queries,
                "per_query": {qid: {name: values[name] for name in DEFAULT_METRICS} for qid, values in scored.per_query.items()},
                "mteb": dict(scored.aggregate)}
