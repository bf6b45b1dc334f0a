"""Which Qwen vision-language families embedtune supports, and what is frozen or adapted in each.

PACE (Appendix A.1) freezes the vision encoder and the multimodal projector in both stages and puts
LoRA on the language model only. The families name their parts alike in transformers 5: the base
model (``Qwen2VLModel`` etc.) holds the vision tower as ``visual`` (its projector is
``visual.merger``; Qwen3-VL adds ``visual.deepstack_merger_list``) and the text decoder as
``language_model``. Leaf names do collide: Qwen2.5-VL's vision MLP is ``gate_proj/up_proj/down_proj``,
exactly like the language model's, so a leaf-name rule such as PEFT's ``["gate_proj", ...]`` would
silently adapt the vision tower. Every rule here is therefore anchored at the component
(``visual.`` or ``language_model.layers.N.``), never at a leaf name.

The resolution is by ``config.model_type``, so a checkpoint saved as ``...ForConditionalGeneration``
(the hub's usual form) loads as its base model: the LM head is not needed for last-token pooling.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "VLFamily",
    "FAMILIES",
    "LANGUAGE_MODEL_LORA_TARGETS",
    "family_for",
    "is_vision_parameter",
    "is_projector_parameter",
    "model_class_for",
    "load_vl_model",
    "lora_regex_matches",
]

# Full-match regex (peft ``target_modules`` as a string): the language model's linear layers only.
# Attention (q/k/v/o), the gated MLP, and Qwen3.5's Gated DeltaNet projections (``linear_attn``).
LANGUAGE_MODEL_LORA_TARGETS = (
    r"(.*\.)?language_model\.layers\.\d+\.("
    r"self_attn\.(q|k|v|o)_proj"
    r"|mlp\.(gate|up|down)_proj"
    r"|linear_attn\.(in_proj_qkv|in_proj_z|in_proj_b|in_proj_a|out_proj)"
    r")"
)


@dataclass(frozen=True)
class VLFamily:
    """One supported family.

    Attributes:
        model_type: ``config.model_type`` of the composite (vision + text) config.
        name: human-readable family name.
        model_class: the transformers base-model class (no LM head) that is trained and saved.
        vision_prefix: every parameter under it stays frozen (tower and projector).
        projector_prefixes: the projector part of the vision side (frozen too; listed so tests and
            logs can show it is covered).
        lora_targets: PEFT full-match regex of the language-model linear layers.
    """

    model_type: str
    name: str
    model_class: str
    vision_prefix: str = "visual."
    projector_prefixes: tuple[str, ...] = ("visual.merger.",)
    lora_targets: str = LANGUAGE_MODEL_LORA_TARGETS


FAMILIES: dict[str, VLFamily] = {
    family.model_type: family
    for family in (
        VLFamily("qwen2_vl", "Qwen2-VL", "Qwen2VLModel"),
        VLFamily("qwen2_5_vl", "Qwen2.5-VL", "Qwen2_5_VLModel"),
        VLFamily("qwen3_vl", "Qwen3-VL", "Qwen3VLModel", projector_prefixes=("visual.merger.", "visual.deepstack_merger_list.")),
        # The paper's own backbones (Qwen3.5-0.8B/2B-Base): hybrid Gated DeltaNet + attention decoder.
        VLFamily("qwen3_5", "Qwen3.5", "Qwen3_5Model"),
    )
}


def family_for(config_or_type: Any) -> VLFamily:
    """The :class:`VLFamily` of a config, a model, or a ``model_type`` string.

    Raises:
        ValueError: for any other model type, naming the supported ones.
    """
    model_type = config_or_type
    if not isinstance(model_type, str):
        config = getattr(config_or_type, "config", config_or_type)
        model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise ValueError(
            f"model_type {model_type!r} is not a supported vision-language family; use a checkpoint whose "
            f"config.json has model_type in {sorted(FAMILIES)} (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5)."
        )
    return family


def _under(name: str, prefix: str) -> bool:
    # Component match anywhere in the dotted path, so PEFT's ``base_model.model.`` and a
    # ForConditionalGeneration's ``model.`` wrapping do not matter; a leaf name never matches.
    return f".{prefix}" in f".{name}"


def is_vision_parameter(name: str, family: VLFamily) -> bool:
    """True for a vision-tower or projector parameter (matched by component, not by leaf name)."""
    return _under(name, family.vision_prefix)


def is_projector_parameter(name: str, family: VLFamily) -> bool:
    return any(_under(name, prefix) for prefix in family.projector_prefixes)


def model_class_for(config: Any) -> type:
    """The transformers base-model class for ``config`` (resolved by ``config.model_type``)."""
    import transformers

    family = family_for(config)
    model_class = getattr(transformers, family.model_class, None)
    if model_class is None:
        raise ValueError(
            f"transformers {transformers.__version__} has no {family.model_class} for {family.name}; "
            "upgrade transformers (pip install -U transformers)."
        )
    return model_class


def load_vl_model(name_or_path: str | os.PathLike, dtype: Any = None, attn_implementation: str | None = None,
                  local_files_only: bool | None = None):
    """Load the base model (vision tower + language model, no LM head) of a supported checkpoint.

    Args:
        name_or_path: local folder or hub id (offline unless ``HF_HUB_OFFLINE`` is unset).
        dtype: e.g. ``torch.bfloat16``; ``None`` keeps float32.
        attn_implementation: e.g. ``"sdpa"`` or ``"flash_attention_2"``.
        local_files_only: default: true when ``HF_HUB_OFFLINE=1``.
    """
    from transformers import AutoConfig

    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    config = AutoConfig.from_pretrained(str(name_or_path), local_files_only=local_files_only)
    model_class = model_class_for(config)
    kwargs: dict[str, Any] = {"local_files_only": local_files_only}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return model_class.from_pretrained(str(name_or_path), config=config, **kwargs)


def lora_regex_matches(name: str, family: VLFamily) -> bool:
    """Whether PEFT would adapt the module ``name`` under ``family.lora_targets``."""
    return re.fullmatch(family.lora_targets, name) is not None
