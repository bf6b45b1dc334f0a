"""One typed config for PACE on every backbone, saved next to the trained model (PEFT-config style).

A :class:`PACEConfig` holds the shared settings (model, data, batch, LoRA, precision) and one
:class:`StageConfig` per stage. ``backbone`` names the family: ``"text"`` (a sentence-transformers
model trained with its trainer) or ``"vl"`` (a Qwen vision-language embedder, paper §3.4, trained by a
plain single-process loop). The few settings only a vision-language backbone has live in
:class:`VLOptions` (``config.vl``); fields marked "text only" are ignored by, or refused for, ``"vl"``.

``temperature`` means one thing everywhere: the ``τ`` of the logits ``s / τ``. ``"auto"`` (dot stages)
resolves at the start of the stage to ``base_temperature × median(‖q‖·‖c‖)`` on a sample of training
pairs, for every backbone, by one rule (:meth:`StageConfig.resolve_temperature`).

:func:`preset_config` builds the paper's recipe, its baselines and every ablation of Table 2 and
Figures 5-6 for either backbone; the saved JSON (``pace_config.json``) records exactly what was run
and :meth:`PACEConfig.load` reads it back, including the files of earlier releases
(``vl_pace_config.json`` and its field names).

This module is the public face of three: the schema (:mod:`embedtune.finetune.schema`), the presets as
a table of data (:mod:`embedtune.finetune.presets`) and the deprecated names of the former
vision-language config (:mod:`embedtune.finetune.deprecated`). Import from here, as before.

Paper settings (Appendix A, Table 3) and how they map here:

=====================  ======================  ==========================================
Setting                Paper                   Field
=====================  ======================  ==========================================
Stage I                cosine, LoRA r=32,      ``stage1`` (similarity, parameters,
                       lr 2e-5, τ 0.1          learning_rate, temperature), ``lora_rank``
Stage II               dot, full LM, lr 2e-6,  ``stage2`` (τ: "auto" for text backbones;
                       τ 100                   the literal 100 in the VL presets)
Stage II init          Stage I step 2,000      ``stage2_init`` = 0.25 (2,000 / 7,847 steps)
Epochs / warmup        1 per stage / 0.05      ``steps=None`` (``epochs``, 1), ``warmup_ratio``
Batch / negatives      32 / 5                  ``batch_size``, ``n_negatives``
Loss                   focal, γ 2, global      ``weighting``, ``gamma``, ``normalize``
Max seq / image px     8,192 / 1,605,632       ``max_seq_length``, ``vl.max_image_pixels``
Precision              bf16                    ``precision`` ("auto": bf16 on a GPU)
Frozen (VL)            vision encoder,         always (not configurable)
                       projector
=====================  ======================  ==========================================
"""

from __future__ import annotations

from embedtune.finetune.deprecated import VL_PRESETS, VLPACEConfig, VLStageConfig, vl_preset_config
from embedtune.finetune.presets import (
    BACKBONE_PRESET_VALUES,
    ONE_STAGE_DEFAULT_EPOCHS,
    ONE_STAGE_PRESETS,
    PRESET_TABLE,
    PRESETS,
    Preset,
    preset_config,
)
from embedtune.finetune.schema import (
    BACKBONES,
    CONFIG_FILE,
    HARDNESS_MODES,
    LEGACY_VL_CONFIG_FILE,
    LOSSES,
    PAPER_MAX_IMAGE_PIXELS,
    PAPER_MAX_SEQ_LENGTH,
    PARAMETER_MODES,
    PRECISIONS,
    SCHEDULERS,
    TINY_VL_MODELS,
    PACEConfig,
    StageConfig,
    VLOptions,
    parse_stage2_init,
    resolve_stage2_init_step,
    stage_steps,
    steps_per_epoch,
)

__all__ = [
    "BACKBONES",
    "BACKBONE_PRESET_VALUES",
    "CONFIG_FILE",
    "DEFAULT_PRESETS",
    "HARDNESS_MODES",
    "LEGACY_VL_CONFIG_FILE",
    "LOSSES",
    "ONE_STAGE_DEFAULT_EPOCHS",
    "ONE_STAGE_PRESETS",
    "PAPER_MAX_IMAGE_PIXELS",
    "PAPER_MAX_SEQ_LENGTH",
    "PARAMETER_MODES",
    "PRECISIONS",
    "PRESETS",
    "PRESET_TABLE",
    "SCHEDULERS",
    "TINY_VL_MODELS",
    "PACEConfig",
    "Preset",
    "StageConfig",
    "VLOptions",
    "parse_stage2_init",
    "preset_config",
    "resolve_stage2_init_step",
    "stage_steps",
    "steps_per_epoch",
    # deprecated aliases of the former vision-language config module
    "VLPACEConfig",
    "VLStageConfig",
    "VL_PRESETS",
    "vl_preset_config",
]

# The preset `finetune pace` and `pipeline` run when none is named. Text: no-dot (PACE's two stages,
# cosine in both). The earlier default, direct-dot-full, was chosen on validation queries that share
# most of their positives with the training queries, which rewards learning where the popular
# documents lie: its whole SciFact gain is on test queries whose positives were training positives
# (seen +0.095 over frozen; unseen −0.011, p 0.59; ArguAna zero-shot −0.198; benchmarks/RESULTS.md,
# "Seen and unseen"). The study kept no per-query validation, so no positive-disjoint validation can
# re-decide among its runs; the stated rule for that case is to keep the backbone's own
# ranking rule (cosine), which the dot switch changes, and the paper's two-stage recipe otherwise.
# Vision-language: the paper's recipe, which no study here has measured against its alternatives.
DEFAULT_PRESETS: dict[str, str] = {"text": "no-dot", "vl": "pace"}
