"""PACE: progressive fine-tuning of the embedding model (cosine+LoRA, then dot+full) with the Focal Embedding Loss.

Quick start::

    from embedtune.finetune import preset_config, train_pace

    config = preset_config("pace", stage1_steps=400, stage2_steps=300, output_dir="runs/pace", max_seq_length=128)
    result = train_pace(config, evaluate_split="test")
    print(result.model_dir, result.metrics)
"""

from embedtune.finetune.config import PRESETS, PACEConfig, StageConfig, preset_config
from embedtune.finetune.data import TrainingTuples, mine_training_tuples
from embedtune.finetune.losses import CachedFocalEmbeddingLoss, FocalEmbeddingLoss, focal_embedding_loss
from embedtune.finetune.modeling import add_lora, load_base_model, load_stage_checkpoint, merge_lora
from embedtune.finetune.recipe import PACEResult, StageResult, auto_temperature, evaluate_model, prepare_stage_two, run_stage, train_pace

__all__ = [
    "PRESETS",
    "CachedFocalEmbeddingLoss",
    "FocalEmbeddingLoss",
    "PACEConfig",
    "PACEResult",
    "StageConfig",
    "StageResult",
    "TrainingTuples",
    "add_lora",
    "auto_temperature",
    "evaluate_model",
    "focal_embedding_loss",
    "load_base_model",
    "load_stage_checkpoint",
    "merge_lora",
    "mine_training_tuples",
    "preset_config",
    "prepare_stage_two",
    "run_stage",
    "train_pace",
]
