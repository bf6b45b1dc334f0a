"""Deprecated names of the former vision-language config module (``finetune/vl_config.py``).

Kept for one release so that code written against it keeps running with the same numbers: they build
a PACEConfig(backbone="vl") with that module's defaults and field names. Import them from
:mod:`embedtune.finetune.config` or :mod:`embedtune.finetune`, as before.
"""

from __future__ import annotations

import warnings
from typing import Any

from embedtune.finetune.presets import PRESETS, preset_config
from embedtune.finetune.schema import PACEConfig, StageConfig

__all__ = ["VLPACEConfig", "VLStageConfig", "VL_PRESETS", "vl_preset_config"]

VL_PRESETS = {name: PRESETS[name] for name in ("pace", "vlm2vec", "no-focal", "stage1-only")}

_VL_STAGE_DEFAULTS = dict(steps=10, learning_rate=1e-4, similarity="cosine", temperature=0.02, warmup_ratio=0.0)


def VLStageConfig(*, lora: bool = True, **values: Any) -> StageConfig:  # noqa: N802 - the former class name
    """Deprecated: ``StageConfig`` with the former VL defaults (10 steps, lr 1e-4, τ 0.02, no warmup) and ``lora=``."""
    warnings.warn("VLStageConfig is deprecated; use StageConfig(parameters='lora'|'full', ...).", DeprecationWarning, stacklevel=2)
    return StageConfig(**{**_VL_STAGE_DEFAULTS, "parameters": "lora" if lora else "full", **values})


def VLPACEConfig(**values: Any) -> PACEConfig:  # noqa: N802 - the former class name
    """Deprecated: ``PACEConfig(backbone="vl", ...)`` with the former VL defaults and field names
    (``train_data``, ``image_root``, ``task``, ``instruction``, ``max_image_pixels``, one ``gamma``)."""
    warnings.warn("VLPACEConfig is deprecated; use PACEConfig(backbone='vl', ...).", DeprecationWarning, stacklevel=2)
    defaults: dict[str, Any] = dict(
        stage1=StageConfig(**{**_VL_STAGE_DEFAULTS, "parameters": "lora"}),
        stage2=StageConfig(**{**_VL_STAGE_DEFAULTS, "similarity": "dot", "parameters": "full", "learning_rate": 1e-5}),
        batch_size=4, lora_rank=8, seed=0, model="tiny-qwen2-vl", output_dir="runs/pace-vl", stage2_init="final",
        n_negatives=None, preset="custom",
    )
    gamma = values.pop("gamma", None)
    values = PACEConfig.migrate({**values, "max_image_pixels": values.get("max_image_pixels")})
    config = PACEConfig(**{**defaults, **values})
    for stage in (config.stage1, config.stage2):
        if stage is not None and gamma is not None:
            stage.gamma = gamma
            stage.__post_init__()
    return config


def vl_preset_config(name: str = "pace", **values: Any) -> PACEConfig:
    """Deprecated: ``preset_config(name, backbone="vl", ...)``."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is unknown; choose one of {sorted(VL_PRESETS)}.")
    return preset_config(name, backbone="vl", **values)
