"""Qwen vision-language backbones as embedding models (PACE Appendix A.2).

Every query, positive and hard negative is rendered separately with the unified template::

    <|im_start|>system
    Represent the user's input.<|im_end|>
    <|im_start|>user
    {images}{instruction}{text}<|im_end|>
    <|im_start|>assistant
    <|endoftext|>

and the embedding is the last hidden state at the final ``<|endoftext|>`` token (last-token
pooling). Each image is written as Qwen's ``<|vision_start|><|image_pad|><|vision_end|>``; the
processor expands ``<|image_pad|>`` to the image's patch count. The paper prints the template
without line breaks; the breaks above are Qwen's chat-template convention.

The vision tower and its projector (``visual``, including ``visual.merger``) stay frozen in both
stages; LoRA targets only the language model's linear layers, selected by a regex anchored at
``language_model.layers`` because Qwen2.5-VL's vision MLP reuses ``gate_proj/up_proj/down_proj``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)

__all__ = [
    "SYSTEM_PROMPT",
    "TASK_INSTRUCTIONS",
    "LANGUAGE_MODEL_LORA_TARGETS",
    "VLInput",
    "render_prompt",
    "last_token_indices",
    "QwenVLEmbedder",
    "QwenVLInputProcessor",
    "load_processor",
]

SYSTEM_PROMPT = "Represent the user's input."

# PACE Table 5: task-level instructions written into the query's user content.
TASK_INSTRUCTIONS: dict[str, str] = {
    "vqa": "Represent the given image to answer the following question.",
    "classification": "Represent the given image to answer the following question.",
    "t2i": "Retrieve an image that best matches the following description.",
    "i2t": "Find the caption that best describes this image.",
    "composed": "Find an image matching the described changes.",
}

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"

# Full-match regex (peft): only the language model's attention and MLP projections. The vision
# tower lives under ``visual.`` and never matches, even where its MLP uses the same leaf names.
LANGUAGE_MODEL_LORA_TARGETS = r"(.*\.)?language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"

_FROZEN_PREFIXES = ("visual.",)


@dataclass
class VLInput:
    """One instance to embed: text, zero or more images, and an optional task instruction.

    Attributes:
        text: the text part (may be empty for an image-only instance).
        images: PIL images, or zero-argument callables returning one (lazy loading).
        instruction: written before the text in the user content (Table 5); empty for candidates.
    """

    text: str = ""
    images: list[Any] = field(default_factory=list)
    instruction: str = ""


def render_prompt(text: str = "", n_images: int = 0, instruction: str = "") -> str:
    """The A.2 template for one instance; images come first in the user content."""
    parts = [IMAGE_PLACEHOLDER * n_images]
    if instruction:
        parts.append(instruction + (" " if text else ""))
    parts.append(text)
    content = "".join(parts)
    return (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\n{content}<|im_end|>\n"
        "<|im_start|>assistant\n<|endoftext|>"
    )


def last_token_indices(attention_mask: Tensor) -> Tensor:
    """Position of each row's last attended token; correct under left and right padding.

    Args:
        attention_mask: (batch, seq_len) of 0/1.

    Returns:
        (batch,) long tensor.
    """
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.long() * (positions + 1)).argmax(dim=1)  # (batch,)


class QwenVLInputProcessor:
    """Tokenizer + Qwen2-VL image processor, without transformers' video processor (which needs torchvision).

    Does what ``Qwen2VLProcessor.__call__`` does for text and images: each ``<|image_pad|>`` becomes
    ``grid_t * grid_h * grid_w / merge_size**2`` copies, and ``mm_token_type_ids`` marks them (1) so
    that the model can compute multimodal RoPE positions.
    """

    image_token = "<|image_pad|>"

    def __init__(self, tokenizer: Any, image_processor: Any):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)

    def __call__(self, text: list[str], images: list[Any] | None = None, padding: bool = True, return_tensors: str = "pt") -> dict[str, Tensor]:
        features: dict[str, Tensor] = {}
        if images:
            image_features = self.image_processor(images=images, return_tensors="pt")
            features.update(pixel_values=image_features["pixel_values"], image_grid_thw=image_features["image_grid_thw"])
            merge = self.image_processor.merge_size ** 2
            counts = iter((image_features["image_grid_thw"].prod(dim=-1) // merge).tolist())
            expanded = []
            for prompt in text:
                pieces = prompt.split(self.image_token)
                expanded.append(pieces[0] + "".join(self.image_token * next(counts) + piece for piece in pieces[1:]))
            text = expanded
        tokens = self.tokenizer(text, padding=padding, return_tensors=return_tensors)
        features["input_ids"] = tokens["input_ids"]
        features["attention_mask"] = tokens["attention_mask"]
        features["mm_token_type_ids"] = (tokens["input_ids"] == self.image_token_id).int()
        return features

    def save_pretrained(self, directory: str) -> None:
        self.tokenizer.save_pretrained(directory)
        self.image_processor.save_pretrained(directory)


def load_processor(directory: str | os.PathLike) -> Any:
    """``AutoProcessor`` where it loads; otherwise :class:`QwenVLInputProcessor` from the same folder."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        processor = AutoProcessor.from_pretrained(str(directory), local_files_only=True)
        if hasattr(processor, "image_processor") and hasattr(processor, "tokenizer"):
            return processor
        logger.info("AutoProcessor returned %s without an image processor; using QwenVLInputProcessor", type(processor).__name__)
    except (ImportError, AttributeError, ValueError, OSError, TypeError) as error:
        logger.info("AutoProcessor unavailable (%s); using QwenVLInputProcessor", error)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    image_processor = AutoImageProcessor.from_pretrained(str(directory), local_files_only=True)
    return QwenVLInputProcessor(tokenizer, image_processor)


def _materialise(image: Any) -> Any:
    return image() if callable(image) else image


class QwenVLEmbedder(nn.Module):
    """A Qwen2-VL-family model and processor that turn :class:`VLInput` into embeddings.

    Args:
        model: the image-text base model (e.g. ``transformers.Qwen2VLModel``); a
            ``...ForConditionalGeneration`` is unwrapped to its ``.model``.
        processor: the matching ``AutoProcessor`` (tokenizer + image processor).
        normalize: L2-normalise embeddings (cosine models); Stage II models keep raw norms.

    The object iterates over itself and exposes ``auto_model``, so that
    :func:`embedtune.finetune.modeling.add_lora` and ``merge_lora`` work on it unchanged.
    """

    def __init__(self, model: nn.Module, processor: Any, normalize: bool = False):
        super().__init__()
        if hasattr(model, "model") and hasattr(model.model, "visual"):
            model = model.model
        if not hasattr(model, "visual"):
            raise ValueError("QwenVLEmbedder needs a Qwen-VL model with a `visual` tower.")
        self.model = model
        self.processor = processor
        self.normalize = normalize
        self.processor.tokenizer.padding_side = "left"
        self.freeze_vision()

    # --- the s-t-like surface used by embedtune.finetune.modeling -----------------------------
    @property
    def auto_model(self) -> nn.Module:
        # Read-only, like s-t 6's Transformer: set_hf_model then assigns ``.model`` (an nn.Module
        # attribute assignment would bypass a property setter).
        return self.model

    def __iter__(self) -> Iterator[nn.Module]:
        return iter([self])

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # --- parameters ---------------------------------------------------------------------------
    def vision_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Vision tower and projector (``visual.merger``) parameters, whatever the wrapping."""
        for name, parameter in self.model.named_parameters():
            if _is_vision(name):
                yield name, parameter

    def language_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        for name, parameter in self.model.named_parameters():
            if not _is_vision(name):
                yield name, parameter

    def freeze_vision(self) -> None:
        for _, parameter in self.vision_parameters():
            parameter.requires_grad_(False)

    def unfreeze_language_model(self) -> int:
        """Stage II: every language-model parameter trains; the vision side stays frozen."""
        count = 0
        for name, parameter in self.language_parameters():
            if "lora_" in name:
                continue
            parameter.requires_grad_(True)
            count += parameter.numel()
        self.freeze_vision()
        return count

    # --- encoding -----------------------------------------------------------------------------
    def tokenize(self, inputs: Sequence[VLInput]) -> dict[str, Tensor]:
        prompts = [render_prompt(item.text, len(item.images), item.instruction) for item in inputs]
        images = [_materialise(image) for item in inputs for image in item.images]
        kwargs: dict[str, Any] = {"text": prompts, "padding": True, "return_tensors": "pt"}
        if images:
            kwargs["images"] = images
        features = self.processor(**kwargs)
        return {key: value for key, value in features.items() if isinstance(value, Tensor)}

    def forward(self, features: dict[str, Tensor]) -> dict[str, Tensor]:
        """Adds ``token_embeddings`` (batch, seq, d) and ``sentence_embedding`` (batch, d)."""
        model_inputs = {key: value.to(self.device) for key, value in features.items() if key != "last_token_index"}
        output = self.model(**model_inputs, use_cache=False)
        hidden = output.last_hidden_state  # (batch, seq_len, d)
        index = last_token_indices(model_inputs["attention_mask"])
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), index]  # (batch, d)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return {**features, "token_embeddings": hidden, "last_token_index": index, "sentence_embedding": pooled}

    def embed(self, inputs: Sequence[VLInput]) -> Tensor:
        """Differentiable embeddings of a batch, shape (len(inputs), d)."""
        return self.forward(self.tokenize(inputs))["sentence_embedding"]

    @torch.no_grad()
    def encode(self, inputs: Sequence[VLInput], batch_size: int = 8) -> Tensor:
        """Embeddings without gradient, in float32 on CPU, shape (len(inputs), d)."""
        was_training = self.training
        self.eval()
        blocks = [self.embed(inputs[start:start + batch_size]).float().cpu() for start in range(0, len(inputs), batch_size)]
        self.train(was_training)
        return torch.cat(blocks) if blocks else torch.empty(0)

    # --- persistence --------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike, similarity: str = "cosine") -> Path:
        """Save model, processor and ``embedtune_vl.json`` (similarity, normalize)."""
        from embedtune import __version__

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(directory))
        self.processor.save_pretrained(str(directory))
        config = {"similarity": similarity, "normalize": self.normalize, "embedtune_version": __version__}
        (directory / "embedtune_vl.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike, device: str | None = None) -> tuple[QwenVLEmbedder, str]:
        """``(embedder, similarity)`` from a folder written by :meth:`save`."""
        from transformers import AutoModel

        directory = Path(directory)
        meta_path = directory / "embedtune_vl.json"
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        model = AutoModel.from_pretrained(str(directory), local_files_only=True)
        processor = load_processor(directory)
        embedder = cls(model, processor, normalize=bool(meta.get("normalize", False)))
        if device is not None:
            embedder.to(device)
        return embedder, str(meta.get("similarity", "cosine"))


def _is_vision(name: str) -> bool:
    # PEFT wraps the model as base_model.model.<name>; match the component, not a leaf name.
    stripped = name.removeprefix("base_model.model.")
    return stripped.startswith(_FROZEN_PREFIXES) or ".visual." in f".{stripped}"
