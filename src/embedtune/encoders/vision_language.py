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

Supported families (resolved by ``config.model_type``, see :mod:`embedtune.encoders.vl_families`):
Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5. The vision tower and its projector (``visual``,
including ``visual.merger``) stay frozen in both stages; LoRA targets only the language model's
linear layers, selected by a regex anchored at ``language_model.layers`` because Qwen2.5-VL's vision
MLP reuses ``gate_proj/up_proj/down_proj``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# Re-exported: the input types and Table 5 instructions live in data/, below the encoders.
from embedtune import __version__
from embedtune.data.vl_inputs import TASK_FORMATS, TASK_INSTRUCTIONS, VLInput, task_instruction
from embedtune.encoders.vl_families import (
    LANGUAGE_MODEL_LORA_TARGETS,
    VLFamily,
    family_for,
    is_projector_parameter,
    is_vision_parameter,
    load_vl_model,
)

logger = logging.getLogger(__name__)

__all__ = [
    "SYSTEM_PROMPT",
    "TASK_INSTRUCTIONS",
    "TASK_FORMATS",
    "task_instruction",
    "apply_max_image_pixels",
    "LANGUAGE_MODEL_LORA_TARGETS",
    "VLInput",
    "render_prompt",
    "last_token_indices",
    "QwenVLEmbedder",
    "QwenVLInputProcessor",
    "load_processor",
]

SYSTEM_PROMPT = "Represent the user's input."

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


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


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def load_processor(directory: str | os.PathLike, local_files_only: bool | None = None) -> Any:
    """``AutoProcessor`` where it loads; otherwise :class:`QwenVLInputProcessor` from the same folder.

    In transformers 5 every Qwen-VL ``AutoProcessor`` needs a video processor, which needs
    torchvision; without it the tokenizer and image processor are loaded on their own.
    """
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    local = _offline() if local_files_only is None else local_files_only
    try:
        processor = AutoProcessor.from_pretrained(str(directory), local_files_only=local)
        if hasattr(processor, "image_processor") and hasattr(processor, "tokenizer"):
            return processor
        logger.debug("AutoProcessor returned %s without an image processor; using QwenVLInputProcessor", type(processor).__name__)
    except (ImportError, AttributeError, ValueError, OSError, TypeError) as error:
        logger.debug("AutoProcessor unavailable (%s); using QwenVLInputProcessor", error)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=local)
    image_processor = AutoImageProcessor.from_pretrained(str(directory), local_files_only=local)
    return QwenVLInputProcessor(tokenizer, image_processor)


def apply_max_image_pixels(processor: Any, max_pixels: int | None) -> None:
    """Cap the pixels per image (paper: 1,605,632), which bounds the visual tokens per image.

    Qwen image processors resize each image to at most ``size["longest_edge"]`` pixels (area).
    """
    if max_pixels is None:
        return
    if max_pixels < 1:
        raise ValueError(f"max_image_pixels must be >= 1; got {max_pixels}.")
    image_processor = getattr(processor, "image_processor", None)
    size = getattr(image_processor, "size", None)
    longest = size.get("longest_edge") if size is not None and hasattr(size, "get") else None
    if longest is None:
        raise ValueError(f"{type(image_processor).__name__} has no size['longest_edge'] to cap; leave max_image_pixels unset.")
    shortest = min(int(size.get("shortest_edge") or 0), int(max_pixels))
    if isinstance(size, dict):
        image_processor.size = {**size, "longest_edge": int(max_pixels), "shortest_edge": shortest}
    else:  # transformers' frozen SizeDict
        import dataclasses

        image_processor.size = dataclasses.replace(size, longest_edge=int(max_pixels), shortest_edge=shortest)
    if getattr(image_processor, "max_pixels", None) is not None:
        image_processor.max_pixels = int(max_pixels)


def _materialise(image: Any) -> Any:
    return image() if callable(image) else image


class QwenVLEmbedder(nn.Module):
    """A Qwen-VL-family model and processor that turn :class:`VLInput` into embeddings.

    Args:
        model: the image-text base model (e.g. ``transformers.Qwen2VLModel``); a
            ``...ForConditionalGeneration`` is unwrapped to its ``.model``. Its
            ``config.model_type`` must be a supported family (:data:`~embedtune.encoders.vl_families.FAMILIES`).
        processor: the matching ``AutoProcessor`` (tokenizer + image processor).
        normalize: L2-normalise embeddings (cosine models); Stage II models keep raw norms.
        max_seq_length: refuse longer inputs (after image-token expansion) instead of truncating,
            because truncation would cut the final ``<|endoftext|>`` that pooling reads, or an image's tokens.

    The object iterates over itself and exposes ``auto_model``, so that
    :func:`embedtune.finetune.modeling.add_lora` and ``merge_lora`` work on it unchanged.
    """

    def __init__(self, model: nn.Module, processor: Any, normalize: bool = False, max_seq_length: int | None = None):
        super().__init__()
        if hasattr(model, "model") and hasattr(model.model, "visual"):
            model = model.model
        if not hasattr(model, "visual"):
            raise ValueError("QwenVLEmbedder needs a Qwen-VL model with a `visual` tower.")
        self.family: VLFamily = family_for(model.config)
        self.model = model
        self.processor = processor
        self.normalize = normalize
        self.max_seq_length = max_seq_length
        self.processor.tokenizer.padding_side = "left"
        self.freeze_vision()

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, normalize: bool = False, max_seq_length: int | None = None,
                        max_image_pixels: int | None = None, dtype: Any = None, attn_implementation: str | None = None,
                        device: str | None = None) -> QwenVLEmbedder:
        """A base checkpoint (local folder or hub id) of a supported family, with its processor."""
        model = load_vl_model(name_or_path, dtype=dtype, attn_implementation=attn_implementation)
        processor = load_processor(name_or_path)
        apply_max_image_pixels(processor, max_image_pixels)
        embedder = cls(model, processor, normalize=normalize, max_seq_length=max_seq_length)
        return embedder.to(device) if device is not None else embedder

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

    @property
    def hidden_size(self) -> int:
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(text_config.hidden_size)

    # --- parameters ---------------------------------------------------------------------------
    def vision_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Vision tower and projector (``visual.merger``, ...) parameters, whatever the wrapping."""
        for name, parameter in self.model.named_parameters():
            if is_vision_parameter(name, self.family):
                yield name, parameter

    def projector_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """The multimodal projector alone (a subset of :meth:`vision_parameters`)."""
        for name, parameter in self.model.named_parameters():
            if is_projector_parameter(name, self.family):
                yield name, parameter

    def language_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        for name, parameter in self.model.named_parameters():
            if not is_vision_parameter(name, self.family):
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

    def lora_modules(self) -> list[str]:
        """Names of the modules that carry a LoRA adapter (empty without one)."""
        return sorted({name.rsplit(".lora_A", 1)[0] for name, _ in self.model.named_parameters() if ".lora_A." in name})

    def check_lora_targets(self) -> list[str]:
        """The adapted modules, after checking that none is on the vision side.

        Raises:
            RuntimeError: if a vision or projector module carries LoRA (a target rule matched a leaf
                name shared with the vision MLP); use ``family.lora_targets``.
        """
        adapted = self.lora_modules()
        vision = [name for name in adapted if is_vision_parameter(name, self.family)]
        if vision:
            raise RuntimeError(f"LoRA was attached to the vision side ({vision[:3]}...); target the language model only "
                               f"with target_modules={self.family.lora_targets!r}.")
        return adapted

    # --- encoding -----------------------------------------------------------------------------
    def tokenize(self, inputs: Sequence[VLInput]) -> dict[str, Tensor]:
        prompts = [render_prompt(item.text, len(item.images), item.instruction) for item in inputs]
        images = [_materialise(image) for item in inputs for image in item.images]
        kwargs: dict[str, Any] = {"text": prompts, "padding": True, "return_tensors": "pt"}
        if images:
            kwargs["images"] = images
        features = self.processor(**kwargs)
        features = {key: value for key, value in features.items() if isinstance(value, Tensor)}
        if self.max_seq_length is not None:
            lengths = features["attention_mask"].sum(dim=1)
            if int(lengths.max()) > self.max_seq_length:
                row = int(lengths.argmax())
                raise ValueError(
                    f"input {row} of the batch has {int(lengths[row])} tokens (images expanded), more than "
                    f"max_seq_length={self.max_seq_length}; shorten its text, lower max_image_pixels, or raise max_seq_length."
                )
        return features

    def forward(self, features: dict[str, Tensor]) -> dict[str, Tensor]:
        """Adds ``token_embeddings`` (batch, seq, d) and ``sentence_embedding`` (batch, d)."""
        model_inputs = {key: value.to(self.device) for key, value in features.items() if key in _MODEL_INPUTS}
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
    def save(self, directory: str | os.PathLike, similarity: str = "cosine", sentence_transformers: bool = True) -> Path:
        """Save model, processor and ``embedtune_vl.json`` (similarity, normalize, family).

        With ``sentence_transformers=True`` (default) the folder is also a sentence-transformers
        model (``modules.json``: this module, last-token ``Pooling``, ``Normalize`` for cosine),
        loadable with ``SentenceTransformer(directory, trust_remote_code=True)``; see
        :mod:`embedtune.encoders.st_vl`.
        """
        if sentence_transformers:
            # st_vl subclasses this module's embedder for sentence-transformers, so it can only load after it.
            from embedtune.encoders.st_vl import save_sentence_transformer

            return save_sentence_transformer(self, directory, similarity=similarity)
        return self.save_pretrained(directory, similarity=similarity)

    def save_pretrained(self, directory: str | os.PathLike, similarity: str = "cosine") -> Path:
        """Hugging Face files (``config.json``, weights, processor) plus ``embedtune_vl.json``."""
        if similarity not in ("cosine", "dot"):
            raise ValueError(f"similarity must be 'cosine' or 'dot'; got {similarity!r}.")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(directory))
        self.processor.save_pretrained(str(directory))
        config = {"similarity": similarity, "normalize": self.normalize, "max_seq_length": self.max_seq_length,
                  "family": self.family.model_type, "embedtune_version": __version__}
        (directory / VL_CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike, device: str | None = None, dtype: Any = None) -> tuple[QwenVLEmbedder, str]:
        """``(embedder, similarity)`` from a folder written by :meth:`save`."""
        directory = Path(directory)
        meta_path = directory / VL_CONFIG_FILE
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        model = load_vl_model(directory, dtype=dtype, local_files_only=True)
        processor = load_processor(directory, local_files_only=True)
        embedder = cls(model, processor, normalize=bool(meta.get("normalize", False)), max_seq_length=meta.get("max_seq_length"))
        if device is not None:
            embedder.to(device)
        return embedder, str(meta.get("similarity", "cosine"))


VL_CONFIG_FILE = "embedtune_vl.json"

# What the Qwen-VL base models take; other feature keys (s-t bookkeeping, pooled outputs) are dropped.
_MODEL_INPUTS = frozenset({"input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids",
                           "pixel_values_videos", "video_grid_thw", "position_ids"})
