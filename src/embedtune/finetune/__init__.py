"""PACE: progressive fine-tuning of the embedding model (cosine+LoRA, then dot+full) with the Focal Embedding Loss.

One config (:class:`PACEConfig`), one recipe (:func:`train_pace`) for text and vision-language
backbones; ``config.backbone`` picks the family (:mod:`embedtune.finetune.backbones`).

Quick start::

    from embedtune.finetune import preset_config, train_pace

    config = preset_config("pace", stage1_steps=400, stage2_steps=300, output_dir="runs/pace", max_seq_length=128)
    result = train_pace(config, evaluate_split="test")
    print(result.model_dir, result.metrics)

    vl = preset_config("pace", backbone="vl", model="Qwen/Qwen2-VL-2B-Instruct", data="mmeb_train.jsonl",
                       output_dir="runs/pace-vl")
    train_pace(vl, evaluate_tasks=["OK-VQA.jsonl"])

Names are imported lazily, so ``import embedtune.finetune.losses.focal_embedding`` needs only torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PRESETS": "embedtune.finetune.config",
    "PACEConfig": "embedtune.finetune.config",
    "StageConfig": "embedtune.finetune.config",
    "VLOptions": "embedtune.finetune.config",
    "preset_config": "embedtune.finetune.config",
    "TrainingTuples": "embedtune.finetune.data",
    "mine_training_tuples": "embedtune.finetune.data",
    "CachedFocalEmbeddingLoss": "embedtune.finetune.losses",
    "FocalEmbeddingLoss": "embedtune.finetune.losses",
    "focal_embedding_loss": "embedtune.finetune.losses",
    "add_lora": "embedtune.finetune.modeling",
    "load_base_model": "embedtune.finetune.modeling",
    "load_stage_checkpoint": "embedtune.finetune.modeling",
    "merge_lora": "embedtune.finetune.modeling",
    "PACEResult": "embedtune.finetune.recipe",
    "evaluate_model": "embedtune.finetune.recipe",
    "train_pace": "embedtune.finetune.recipe",
    "Backbone": "embedtune.finetune.stages",
    "StageResult": "embedtune.finetune.stages",
    "run_stages": "embedtune.finetune.stages",
    "TextBackbone": "embedtune.finetune.backbones",
    "VisionLanguageBackbone": "embedtune.finetune.backbones",
    "backbone_for": "embedtune.finetune.backbones",
    "auto_temperature": "embedtune.finetune.backbones.text",
    "prepare_stage_two": "embedtune.finetune.backbones.text",
    "run_stage": "embedtune.finetune.backbones.text",
    "latest_resumable_checkpoint": "embedtune.finetune.backbones.text",
    "train_vl_pace": "embedtune.finetune.backbones.vl",
    # Deprecated names of the former vision-language stack (finetune/vl_config.py, vl_recipe.py), for one release.
    "VLPACEConfig": "embedtune.finetune.config",
    "VLStageConfig": "embedtune.finetune.config",
    "vl_preset_config": "embedtune.finetune.config",
    "VLPACEResult": "embedtune.finetune.recipe",
    "run_vl_pace": "embedtune.finetune.recipe",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'embedtune.finetune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
