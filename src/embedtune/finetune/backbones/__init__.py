"""The family-specific half of PACE, one module per backbone family (see :class:`embedtune.finetune.stages.Backbone`).

* :mod:`.text`: sentence-transformers models, the s-t trainer, resumable checkpoints, multi-process.
* :mod:`.vl`: Qwen vision-language embedders, a plain single-process loop, frozen vision tower.

A new family is one module with a class that has the :class:`~embedtune.finetune.stages.Backbone`
methods, plus a name in ``embedtune.finetune.config.BACKBONES`` and a line in :func:`backbone_for`.
"""

from __future__ import annotations

from embedtune.finetune.backbones.text import TextBackbone
from embedtune.finetune.backbones.vl import VisionLanguageBackbone
from embedtune.finetune.config import PACEConfig
from embedtune.finetune.stages import Backbone

__all__ = ["TextBackbone", "VisionLanguageBackbone", "backbone_for"]


def backbone_for(config: PACEConfig, device: str | None = None) -> Backbone:
    """The backbone family ``config.backbone`` names (``device``: vl only; text lets the trainer choose)."""
    if config.backbone == "vl":
        return VisionLanguageBackbone(device=device)
    if device is not None:
        raise ValueError("device= is for backbone='vl'; the text backbone's trainer picks the device (use CUDA_VISIBLE_DEVICES).")
    return TextBackbone()
