"""A trained Qwen-VL embedder as a sentence-transformers model (save, load, ``encode``).

Why not s-t's own ``Transformer``: sentence-transformers 6.2 does have the machinery for chat-template
VLMs (``Transformer`` with the ``"message"`` modality, which calls ``processor.apply_chat_template``,
followed by ``Pooling(pooling_mode="lasttoken")``, which handles left padding). Three things keep
embedtune from building on it:

1. ``Transformer.__init__`` always calls ``AutoProcessor.from_pretrained`` and cannot be handed a
   processor. In transformers 5.x every Qwen-VL processor (``Qwen2VLProcessor``,
   ``Qwen2_5_VLProcessor``, ``Qwen3VLProcessor``, which Qwen3.5 also uses) requires a video processor, and those
   require torchvision; without torchvision (e.g. a CPU-only torch) loading fails with
   ``ImportError: Qwen2VLVideoProcessor requires the Torchvision library``, so the model cannot be
   loaded at all. :func:`embedtune.encoders.vision_language.load_processor` falls back to the
   tokenizer + image processor instead.
2. s-t's ``prompt`` becomes an extra *system* message (``InputFormatter.prepend_prompt_to_messages``),
   whereas PACE (Appendix A.2) keeps the fixed system prompt and writes the task instruction into the
   *user* content; per-row instructions (mixed tasks in one batch) have no s-t equivalent.
3. The A.2 suffix (``<|im_start|>assistant\\n<|endoftext|>``) is not what Qwen's chat template
   emits; it would need a custom template shipped with every model.

So the input module here, :class:`QwenVLModule`, wraps :class:`QwenVLEmbedder` (the same template,
processor and weights used in training), and the rest of the pipeline is stock s-t:
``Pooling(pooling_mode="lasttoken")`` and, for cosine models, ``Normalize``. Folder layout::

    config.json, model.safetensors, tokenizer*, preprocessor_config.json   # Hugging Face files (root)
    embedtune_vl.json                                                     # similarity, normalize, family
    modules.json, config_sentence_transformers.json (similarity_fn_name, Table 5 prompts)
    1_Pooling/config.json                                                  # lasttoken
    2_Normalize/                                                           # cosine models only

Load with ``SentenceTransformer(path, trust_remote_code=True)`` (s-t >= 6 imports a module class
outside its own namespace only then; embedtune must be installed) or :func:`load_sentence_transformer`.
Inputs: ``str`` (text), a PIL image, ``{"text": ..., "image": img_or_list, "instruction": ...}``, or
:class:`~embedtune.encoders.vision_language.VLInput`. ``prompt=`` / ``prompt_name=`` (``"vqa"``,
``"t2i"``, ... from Table 5) sets the instruction of inputs that carry none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from sentence_transformers.base.modules.input_module import InputModule

from embedtune.data.mmeb import LazyImage
from embedtune.encoders.vision_language import _MODEL_INPUTS, TASK_INSTRUCTIONS, QwenVLEmbedder, VLInput

__all__ = ["QwenVLModule", "as_vl_input", "to_sentence_transformer", "save_sentence_transformer", "load_sentence_transformer"]


def as_vl_input(item: Any, prompt: str | None = None) -> VLInput:
    """One s-t style input as a :class:`VLInput`; ``prompt`` fills an empty instruction."""
    if isinstance(item, VLInput):
        vl_input = item
    elif isinstance(item, str):
        vl_input = VLInput(text=item)
    elif isinstance(item, dict):
        unknown = set(item) - {"text", "image", "images", "instruction"}
        if unknown:
            raise ValueError(f"input dict has unknown keys {sorted(unknown)}; use 'text', 'image' (one or a list) and 'instruction'.")
        images = item.get("image", item.get("images", []))
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        vl_input = VLInput(text=str(item.get("text") or ""), images=[_open(image) for image in images if image is not None],
                           instruction=str(item.get("instruction") or ""))
    elif hasattr(item, "convert") and hasattr(item, "size"):  # a PIL image
        vl_input = VLInput(images=[item])
    else:
        raise TypeError(f"cannot embed a {type(item).__name__}; pass a str, a PIL image, a dict with 'text'/'image', or a VLInput.")
    if prompt and not vl_input.instruction:
        vl_input = VLInput(text=vl_input.text, images=list(vl_input.images), instruction=prompt)
    return vl_input


def _open(image: Any) -> Any:
    if isinstance(image, (str, os.PathLike)):
        return LazyImage(Path(image))
    return image


class QwenVLModule(InputModule):
    """The s-t input module: A.2 template in, token embeddings out (pooling is s-t's ``lasttoken``).

    Args:
        embedder: the trained embedder (its ``normalize`` is not applied here; a ``Normalize``
            module does that in cosine models).
        similarity: recorded in ``embedtune_vl.json`` so that ``evaluate-mmeb`` ranks the same way.
    """

    config_keys: list[str] = []
    save_in_root: bool = True

    def __init__(self, embedder: QwenVLEmbedder, similarity: str = "cosine") -> None:
        super().__init__()
        self.embedder = embedder
        self.similarity = similarity

    @property
    def modalities(self) -> list[Any]:
        # s-t labels a batch that mixes text, image and text+image inputs "message"; listing it lets
        # such batches through. Chat-message inputs themselves are rejected by :func:`as_vl_input`.
        return ["text", "image", ("image", "text"), "message"]

    @property
    def tokenizer(self) -> Any:
        return self.embedder.processor.tokenizer

    @property
    def processor(self) -> Any:
        return self.embedder.processor

    @property
    def auto_model(self) -> torch.nn.Module:
        return self.embedder.model

    @property
    def max_seq_length(self) -> int | None:
        return self.embedder.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int | None) -> None:
        self.embedder.max_seq_length = value

    def preprocess(self, inputs: Sequence[Any], prompt: str | None = None, **kwargs: Any) -> dict[str, Any]:
        return self.embedder.tokenize([as_vl_input(item, prompt) for item in inputs])

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        model_inputs = {key: value for key, value in features.items() if key in _MODEL_INPUTS}
        output = self.embedder.model(**model_inputs, use_cache=False)
        features["token_embeddings"] = output.last_hidden_state  # (batch, seq_len, d)
        return features

    def get_embedding_dimension(self) -> int:
        return self.embedder.hidden_size

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.embedder.save_pretrained(output_path, similarity=self.similarity)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None, cache_folder: str | None = None,
             revision: str | None = None, local_files_only: bool = False, **kwargs: Any) -> QwenVLModule:
        path = cls.load_dir_path(model_name_or_path, subfolder=subfolder, token=token, cache_folder=cache_folder,
                                 revision=revision, local_files_only=local_files_only)
        embedder, similarity = QwenVLEmbedder.load(path)
        return cls(embedder, similarity=similarity)


def to_sentence_transformer(embedder: QwenVLEmbedder, similarity: str = "cosine", device: str | None = None):
    """``SentenceTransformer([QwenVLModule, Pooling(lasttoken), Normalize?])`` sharing ``embedder``'s weights.

    ``similarity="dot"`` (Stage II) keeps raw norms and sets ``similarity_fn_name="dot"``; cosine
    adds ``Normalize``. Table 5 instructions are the model's named prompts.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling

    if similarity not in ("cosine", "dot"):
        raise ValueError(f"similarity must be 'cosine' or 'dot'; got {similarity!r}.")
    modules: list[torch.nn.Module] = [QwenVLModule(embedder, similarity), Pooling(embedder.hidden_size, pooling_mode="lasttoken")]
    if similarity == "cosine":
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, prompts=dict(TASK_INSTRUCTIONS), device=device or str(embedder.device))
    model.similarity_fn_name = "dot" if similarity == "dot" else "cosine"
    return model


def save_sentence_transformer(embedder: QwenVLEmbedder, directory: str | os.PathLike, similarity: str = "cosine") -> Path:
    """Write ``directory`` as an s-t model folder that is also a :meth:`QwenVLEmbedder.load` folder."""
    directory = Path(directory)
    to_sentence_transformer(embedder, similarity).save(str(directory), create_model_card=False)
    return directory


def load_sentence_transformer(directory: str | os.PathLike, device: str | None = None):
    """Load a folder written by :func:`save_sentence_transformer` as a ``SentenceTransformer``."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(directory), device=device, trust_remote_code=True, local_files_only=True)
