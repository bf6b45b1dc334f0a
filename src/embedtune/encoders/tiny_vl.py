"""Tiny, randomly initialised Qwen-VL embedders built offline (tests and the GPU smoke benchmark).

Nothing is downloaded: the tokenizer is a word-level ``tokenizers`` model with Qwen's special
tokens, the image processor uses 56-pixel images (a 4x4 patch grid, 4 tokens after the 2x2 merge).

Every supported family builds tiny from its transformers config classes: Qwen2-VL, Qwen2.5-VL
(vision MLP named ``gate_proj/up_proj/down_proj`` like the LM's: the case the LoRA rule must get
right), Qwen3-VL (with a deepstack merger) and Qwen3.5 (one Gated DeltaNet and one attention layer;
on CPU transformers uses its reference kernels). All share the 14-pixel patch of the tiny image
processor; the real Qwen3-VL / Qwen3.5 checkpoints use 16-pixel patches with their own processor.
"""

from __future__ import annotations

import torch

from embedtune.encoders.vision_language import QwenVLEmbedder, QwenVLInputProcessor
from embedtune.encoders.vl_families import model_class_for

__all__ = ["QWEN_SPECIAL_TOKENS", "TINY_FAMILIES", "tiny_vl_embedder", "tiny_qwen2_vl_embedder", "tiny_processor", "synthetic_image"]

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

_WORDS = (
    "system user assistant Represent Retrieve Find given \' represent the s input . image a an of to answer following question retrieve that best "
    "matches description find caption describes this matching described changes cat dog red blue green car tree "
    "house what is colour photo sky sea one two three [UNK]"
).split()


def tiny_processor(image_size: int = 56):
    """A Qwen2-VL processor with a word-level tokenizer and small images."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessor

    vocabulary = {token: index for index, token in enumerate(QWEN_SPECIAL_TOKENS + _WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    backend.add_special_tokens(QWEN_SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="<|endoftext|>", eos_token="<|im_end|>", padding_side="left",
    )
    pixels = image_size * image_size
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": pixels, "longest_edge": pixels}, patch_size=14, merge_size=2, temporal_patch_size=2,
    )
    return QwenVLInputProcessor(tokenizer, image_processor)


TINY_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")


def _tiny_config(family: str, ids: dict[str, int], vocab_size: int, hidden_size: int):
    import transformers

    head_dim = hidden_size // 4
    mrope = [head_dim // 8, head_dim // 8, head_dim // 4]  # sums to head_dim / 2
    text = dict(
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=512,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
    )
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=hidden_size, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    tokens = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    if family == "qwen2_vl":
        return transformers.Qwen2VLConfig(
            text_config=dict(text, rope_scaling={"type": "mrope", "mrope_section": mrope}),
            vision_config=dict(depth=1, embed_dim=16, hidden_size=hidden_size, num_heads=2, mlp_ratio=2, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], **tokens,
        )
    rope = {"rope_type": "default", "mrope_section": mrope, "rope_theta": 10000.0}
    if family == "qwen2_5_vl":
        return transformers.Qwen2_5_VLConfig(text_config=dict(text, rope_parameters=rope),
                                             vision_config=dict(vision, window_size=56, fullatt_block_indexes=[1]), **tokens)
    rope = {**rope, "mrope_interleaved": True}
    if family == "qwen3_vl":
        return transformers.Qwen3VLConfig(text_config=dict(text, head_dim=head_dim, rope_parameters=rope),
                                          vision_config=dict(vision, num_position_embeddings=16, deepstack_visual_indexes=[0]), **tokens)
    if family == "qwen3_5":
        return transformers.Qwen3_5Config(
            text_config=dict(text, head_dim=head_dim, layer_types=["linear_attention", "full_attention"], linear_key_head_dim=8,
                             linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2,
                             rope_parameters={**rope, "partial_rotary_factor": 1.0}),
            vision_config=dict(vision, num_position_embeddings=16), **tokens,
        )
    raise ValueError(f"family={family!r} has no tiny config; use one of {list(TINY_FAMILIES)}.")


def tiny_vl_embedder(family: str = "qwen2_vl", seed: int = 0, normalize: bool = False, hidden_size: int = 32):
    """A :class:`QwenVLEmbedder` over a 2-layer, ``hidden_size``-wide random model of ``family``.

    Args:
        family: one of :data:`TINY_FAMILIES` (a ``config.model_type``).
        seed: torch seed of the random weights.
        hidden_size: language-model width (multiple of 32, so the M-RoPE sections are whole).
    """
    if hidden_size % 32:
        raise ValueError(f"hidden_size must be a multiple of 32 (M-RoPE sections); got {hidden_size}.")
    processor = tiny_processor()
    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    config = _tiny_config(family, ids, len(tokenizer), hidden_size)
    torch.manual_seed(seed)
    model = model_class_for(config)(config)
    return QwenVLEmbedder(model, processor, normalize=normalize)


def tiny_qwen2_vl_embedder(seed: int = 0, normalize: bool = False, hidden_size: int = 32):
    """A :class:`QwenVLEmbedder` over a 2-layer, ``hidden_size``-wide random Qwen2-VL."""
    return tiny_vl_embedder("qwen2_vl", seed=seed, normalize=normalize, hidden_size=hidden_size)


def synthetic_image(seed: int, size: int = 56):
    """A deterministic random RGB PIL image."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels, mode="RGB")
