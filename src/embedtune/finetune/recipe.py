"""The PACE recipe (§3.3, §3.4, §4.1, Appendix A) for every backbone: Stage I cosine+LoRA, then Stage II
dot+full from an intermediate Stage I checkpoint.

``train_pace(config)`` runs the whole recipe (or a baseline/ablation preset) on the backbone family
``config.backbone`` names and returns a :class:`PACEResult`; the final model is saved to
``<output_dir>/model`` (text: a plain s-t folder; vl: Hugging Face files + the s-t layout), next to
``pace_config.json`` and ``results.json`` (the training record in its ``details``; ``result.json``
in earlier releases). What differs by family is behind
:class:`embedtune.finetune.stages.Backbone` (:mod:`embedtune.finetune.backbones`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from embedtune.finetune.backbones import backbone_for
from embedtune.finetune.backbones.text import (  # noqa: F401 - public names of this module in earlier releases
    auto_temperature,
    build_loss,
    evaluate_model,
    is_main_process,
    latest_resumable_checkpoint,
    prepare_stage_two,
    run_stage,
)
from embedtune.finetune.config import PACEConfig
from embedtune.finetune.stages import StageResult, run_stages
from embedtune.result_files import mteb_metric_name, mteb_metrics, write_results

__all__ = [
    "PACEResult",
    "StageResult",
    "auto_temperature",
    "build_loss",
    "evaluate_model",
    "latest_resumable_checkpoint",
    "prepare_stage_two",
    "run_stage",
    "train_pace",
]


@dataclass
class PACEResult:
    """Outcome of :func:`train_pace`: the final model folder, per-stage results and timings.

    ``stage2_init_step``: the Stage I step Stage II started from (None without a Stage II).
    """

    model_dir: str
    similarity: str
    stages: list[StageResult]
    n_training_tuples: int
    seconds: dict[str, float]
    config: dict[str, Any]
    metrics: dict[str, Any] | None = None
    stage2_init_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


VLPACEResult = PACEResult  # deprecated name (the former vision-language result), for one release


def run_vl_pace(config: PACEConfig, evaluate_tasks: Sequence[str | Path] = (), device: str | None = None) -> PACEResult:
    """Deprecated: ``train_pace(config, evaluate_tasks=..., device=...)``."""
    return train_pace(config, evaluate_tasks=evaluate_tasks, device=device)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def train_pace(
    config: PACEConfig,
    tuples: Any = None,
    evaluate_split: str | None = None,
    stage_callbacks: Callable[[str, int, str], list] | None = None,
    *,
    evaluate_tasks: Sequence[str | Path] = (),
    device: str | None = None,
) -> PACEResult:
    """Run the recipe ``config`` describes and save the final model to ``<output_dir>/model``.

    Args:
        config: the recipe (see :func:`embedtune.finetune.preset_config`).
        tuples: training data the caller already has: :class:`embedtune.finetune.TrainingTuples` (text;
            default: mined from ``config.data``'s ``config.train_split`` qrels with the frozen model) or a
            list of :class:`embedtune.data.mmeb.MMEBTrainExample` (vl; default: read from ``config.data``).
        evaluate_split: text: evaluate the final model on this qrels split (e.g. ``"test"``) with its
            training similarity (main process only).
        stage_callbacks: text: ``(stage_name, update_offset, similarity) -> [TrainerCallback, ...]``, e.g. a
            :class:`embedtune.finetune.validation.ValidationCallback` per stage. ``update_offset`` is the
            number of optimizer updates on the final model's path before this stage.
        evaluate_tasks: vl: MMEB-eval-style files scored after training (Precision@1).
        device: vl: torch device (default: cuda when available).

    A killed text run resumes: each stage continues from its latest checkpoint in ``output_dir``.
    """
    backbone = backbone_for(config, device=device)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if is_main_process():
        config.save(output_dir)
    backbone.seed(config)

    start = time.perf_counter()
    data = backbone.load_training_data(config, output_dir, tuples)
    timings["data"] = time.perf_counter() - start
    start = time.perf_counter()
    handoff = [backbone.load_model(config)]  # run_stages holds the only reference (Stage II may replace the model)
    timings["model"] = time.perf_counter() - start

    outcome = run_stages(backbone, handoff.pop(), data, config, output_dir / "stage1", output_dir / "stage2", stage_callbacks, barrier=_barrier)
    timings.update(outcome.seconds)

    model_dir = output_dir / "model"
    model = backbone.finalize(outcome.model, outcome.similarity)
    backbone.save_model(model, config, model_dir, outcome.similarity)
    _barrier()
    result = PACEResult(
        model_dir=str(model_dir),
        similarity=outcome.similarity,
        stages=outcome.stages,
        n_training_tuples=len(data),
        seconds=timings,
        config=config.to_dict(),
        stage2_init_step=outcome.init_step if config.stage2 is not None else None,
    )
    target = evaluate_tasks or evaluate_split
    if target and is_main_process():
        start = time.perf_counter()
        result.metrics = backbone.evaluate(model, model_dir, config, outcome.similarity, target)
        timings["evaluate"] = time.perf_counter() - start
    timings["total"] = time.perf_counter() - started
    if is_main_process():
        _write_training_results(output_dir, config, result)
    return result


def _write_training_results(output_dir: Path, config: PACEConfig, result: PACEResult) -> Path:
    """``output_dir/results.json`` (``task: "finetune pace"`` or ``"finetune pace-vl"``) with the training
    record as ``details``; a text evaluation's metrics are its headline. ``embedtune finetune`` rewrites
    the file with its argv and printed table when it evaluated."""
    scored = dict(result.metrics or {}) if config.backbone == "text" else {}
    per_query = scored.pop("per_query", {})
    scored.pop("mteb", None)  # every MTEB metric: kept in details, the headline keeps the defaults
    metrics = mteb_metrics(scored) if scored else {}
    model = {"name": "finetuned", "path": result.model_dir, "similarity": result.similarity, "base": str(config.model)}
    data = {"train": str(config.data), "train_split": config.train_split}
    return write_results(output_dir, task="finetune pace" if config.backbone == "text" else "finetune pace-vl", command=None,
                         config=result.config, data=data, model=model, metrics=metrics,
                         per_query={qid: {mteb_metric_name(name): value for name, value in values.items()} for qid, values in per_query.items()},
                         details=_json_safe(result.to_dict()))


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
