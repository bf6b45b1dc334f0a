"""PACE: progressive fine-tuning of the embedding model (cosine+LoRA, then dot+full) with the Focal Embedding Loss.

Quick start::

    from embedtune.finetune import preset_config, train_pace

    config = preset_config("pace", stage1_steps=400, stage2_steps=300, output_dir="runs/pace", max_seq_length=128)
    result = train_pace(config, evaluate_split="test")
    print(result.model_dir, result.metrics)

Names are imported lazily, so ``import embedtune.finetune.losses.focal_embedding`` needs only torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PRESETS": "embedtune.finetune.config",
    "PACEConfig": "embedtune.finetune.config",
    "StageConfig": "embedtune.finetune.config",
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
    "StageResult": "embedtune.finetune.recipe",
    "auto_temperature": "embedtune.finetune.recipe",
    "evaluate_model": "embedtune.finetune.recipe",
    "prepare_stage_two": "embedtune.finetune.recipe",
    "run_stage": "embedtune.finetune.recipe",
    "train_pace": "embedtune.finetune.recipe",
    "VLPACEConfig": "embedtune.finetune.vl_config",
    "VLStageConfig": "embedtune.finetune.vl_config",
    "vl_preset_config": "embedtune.finetune.vl_config",
    "VLPACEResult": "embedtune.finetune.vl_recipe",
    "run_vl_pace": "embedtune.finetune.vl_recipe",
    "train_vl_pace": "embedtune.finetune.vl_recipe",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'embedtune.finetune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
