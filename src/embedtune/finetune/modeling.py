"""Load the base model for dot-product training, add LoRA, merge it, and reload stage checkpoints.

LoRA goes on the s-t ``Transformer`` module's ``auto_model`` as a :class:`peft.PeftModel`, which s-t
trains and saves like any model. (s-t's ``model.add_adapter`` delegates to transformers' PEFT
integration; transformers 5.x requires peft >= 0.22 for it, so wrapping with
:func:`peft.get_peft_model` is the path that works with every peft this project allows.)
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embedtune.encoders.bundled import resolve_model_path

logger = logging.getLogger(__name__)

__all__ = [
    "load_base_model",
    "transformer_module",
    "add_lora",
    "merge_lora",
    "has_lora",
    "enable_all_gradients",
    "save_adapter",
    "load_stage_checkpoint",
    "load_adapter_weights",
    "finalize_for_similarity",
]


def load_base_model(model: str | os.PathLike, max_seq_length: int | None = None, device: str | None = None):
    """A SentenceTransformer without its ``Normalize`` module(s), so that dot products see norms.

    Args:
        model: alias (``minilm``, ``mpnet``) or a local s-t folder.
        max_seq_length: cap on tokens per text.
        device: torch device; default lets s-t choose.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = resolve_model_path(str(model))
    loaded = SentenceTransformer(str(path), device=device, local_files_only=True)
    modules = [module for module in loaded if not isinstance(module, Normalize)]
    if len(modules) != len(loaded):
        logger.debug("removed %d Normalize module(s) from the loaded copy of %s (the files are unchanged) so that training can use embedding norms", len(loaded) - len(modules), path)
        loaded = SentenceTransformer(modules=modules, device=str(loaded.device))
    if max_seq_length is not None:
        loaded.max_seq_length = max_seq_length
    return loaded


def transformer_module(model) -> nn.Module:
    """The s-t module holding the Hugging Face model (``auto_model``)."""
    for module in model:
        if hasattr(module, "auto_model"):
            return module
    raise ValueError("PACE needs a sentence-transformers model with a Transformer module (an `auto_model`).")


def hf_model(transformer: nn.Module) -> nn.Module:
    """The Hugging Face model inside an s-t Transformer module."""
    return transformer.auto_model


def set_hf_model(transformer: nn.Module, value: nn.Module) -> None:
    """Replace the Hugging Face model inside an s-t Transformer module.

    In s-t 6, ``auto_model`` is a read-only property over ``model``; assigning to it would register
    a second, unused submodule instead of replacing the one that runs.
    """
    attribute = getattr(type(transformer), "auto_model", None)
    if isinstance(attribute, property) and attribute.fset is None:
        transformer.model = value
    else:
        transformer.auto_model = value
    if hf_model(transformer) is not value:
        raise RuntimeError("could not replace the transformer's model; this sentence-transformers version is not supported.")


def has_lora(model) -> bool:
    from peft import PeftModel

    return isinstance(hf_model(transformer_module(model)), PeftModel)


def add_lora(
    model,
    rank: int = 32,
    alpha: float | None = None,
    dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
    exclude_modules: str | list[str] | None = r".*pooler.*",
):
    """Freeze the model and attach a fresh LoRA adapter (``ΔW = BA``, rank ``rank``) to its linear layers.

    Returns the same model object (its transformer's ``auto_model`` becomes a ``PeftModel``).
    """
    from peft import LoraConfig, get_peft_model

    if has_lora(model):
        raise ValueError("the model already carries a LoRA adapter; merge it first (merge_lora).")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        lora_dropout=dropout,
        target_modules=target_modules,
        exclude_modules=exclude_modules,
        bias="none",
    )
    transformer = transformer_module(model)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    set_hf_model(transformer, get_peft_model(hf_model(transformer), config))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.debug("LoRA r=%d on %s: %d trainable of %d parameters (%.2f%%)", rank, target_modules, trainable, total, 100 * trainable / max(total, 1))
    return model


def enable_all_gradients(model) -> int:
    """Make every parameter trainable; returns how many parameters there are."""
    count = 0
    for parameter in model.parameters():
        parameter.requires_grad_(True)
        count += parameter.numel()
    return count


def merge_lora(model):
    """Fold the LoRA update into the base weights with ``merge_and_unload`` and train every parameter.

    The merged Hugging Face model is ``merge_and_unload()``'s return value; it replaces the
    ``PeftModel`` in the transformer module. Returns the same s-t model object.
    """
    transformer = transformer_module(model)
    if not has_lora(model):
        raise ValueError("the model carries no LoRA adapter to merge.")
    merged = hf_model(transformer).merge_and_unload()
    set_hf_model(transformer, merged)
    enable_all_gradients(model)
    return model


def save_adapter(model, directory: str | os.PathLike) -> Path:
    """Save the LoRA adapter alone (PEFT format: adapter_config.json + adapter_model.safetensors)."""
    directory = Path(directory)
    hf_model(transformer_module(model)).save_pretrained(str(directory))
    return directory


def load_stage_checkpoint(checkpoint: str | os.PathLike, base_model: str, max_seq_length: int | None = None, device: str | None = None):
    """The model saved in a stage checkpoint, merged and fully trainable.

    s-t saves a LoRA-trained model as an s-t folder whose transformer part is a PEFT adapter
    (``adapter_config.json`` + ``adapter_model.safetensors``): the base model is loaded, the adapter
    attached with ``PeftModel.from_pretrained`` and merged with ``merge_and_unload``. A
    full-parameter checkpoint is a plain s-t model folder and is loaded as is.
    """
    checkpoint = Path(checkpoint)
    adapter = checkpoint / _transformer_subdir(checkpoint)
    if (adapter / "adapter_config.json").is_file():
        from peft import PeftModel

        model = load_base_model(base_model, max_seq_length=max_seq_length, device=device)
        transformer = transformer_module(model)
        set_hf_model(transformer, PeftModel.from_pretrained(hf_model(transformer), str(adapter)))
        logger.debug("loaded LoRA adapter from %s", adapter)
        return merge_lora(model)
    if (checkpoint / "modules.json").is_file():
        model = load_base_model(str(checkpoint), max_seq_length=max_seq_length, device=device)
        enable_all_gradients(model)
        return model
    raise FileNotFoundError(f"{checkpoint}: neither a LoRA checkpoint (adapter_config.json) nor an s-t model folder.")


def load_adapter_weights(model, checkpoint: str | os.PathLike) -> None:
    """Load the LoRA weights of a stage checkpoint into ``model``, which carries the same adapter (resuming).

    s-t's trainer would reload the checkpoint as a fresh model whose adapter is not wrapped in a
    ``PeftModel`` and copy its state dict over, which fails on the ``base_model.model.`` key prefix.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    checkpoint = Path(checkpoint)
    weights = checkpoint / _transformer_subdir(checkpoint) / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: no LoRA adapter weights in this checkpoint.")
    outcome = set_peft_model_state_dict(hf_model(transformer_module(model)), load_file(str(weights)))
    if outcome.unexpected_keys:
        raise ValueError(f"{weights}: adapter weights {outcome.unexpected_keys[:3]}... do not fit this model's LoRA adapter.")


def _transformer_subdir(checkpoint: Path) -> str:
    """Folder of the Transformer module inside an s-t model folder (``""`` for the usual layout)."""
    modules = checkpoint / "modules.json"
    if modules.is_file():
        for entry in json.loads(modules.read_text(encoding="utf-8")):
            if entry.get("type", "").endswith("Transformer"):
                return entry.get("path", "")
    return ""


def finalize_for_similarity(model, similarity: str):
    """Prepare a trained model for saving as a plain s-t folder ranked with ``similarity``.

    Merges any LoRA adapter. A cosine model gets its ``Normalize`` module back; a dot-product
    model keeps raw norms and records ``similarity_fn_name="dot"``.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    if has_lora(model):
        merge_lora(model)
    if similarity == "cosine" and not any(isinstance(module, Normalize) for module in model):
        model = SentenceTransformer(modules=[*model, Normalize()], device=str(model.device))
    model.similarity_fn_name = "cosine" if similarity == "cosine" else "dot"
    return model


def parameter_fingerprint(model) -> dict[str, Any]:
    """Cheap summary of the weights (count, sum, sum of squares) used to tell checkpoints apart."""
    count, total, total_sq = 0, 0, 0
    with torch.no_grad():
        for parameter in model.parameters():  # one float64 copy at a time: a VL model's would not fit twice
            value = parameter.detach().double()
            count, total, total_sq = count + value.numel(), total + value.sum(), total_sq + (value * value).sum()
    return {"parameters": int(count), "sum": float(total), "sum_sq": float(total_sq)}
