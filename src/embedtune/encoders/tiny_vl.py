"""A tiny, randomly initialised Qwen2-VL embedder built offline (tests and the GPU smoke benchmark).

Nothing is downloaded: the tokenizer is a word-level ``tokenizers`` model with Qwen's special
tokens, the image processor uses 56-pixel images (a 4x4 patch grid, 4 tokens after the 2x2 merge).
"""

from __future__ import annotations

import torch

__all__ = ["QWEN_SPECIAL_TOKENS", "tiny_qwen2_vl_embedder", "tiny_processor", "synthetic_image"]

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

    from embedtune.encoders.vision_language import QwenVLInputProcessor

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


def tiny_qwen2_vl_embedder(seed: int = 0, normalize: bool = False, hidden_size: int = 32):
    """A :class:`QwenVLEmbedder` over a 2-layer, ``hidden_size``-wide random Qwen2-VL."""
    from transformers import Qwen2VLConfig, Qwen2VLModel

    from embedtune.encoders.vision_language import QwenVLEmbedder

    processor = tiny_processor()
    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    head_dim = hidden_size // 4
    config = Qwen2VLConfig(
        text_config=dict(
            hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=512,
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
            rope_scaling={"type": "mrope", "mrope_section": [head_dim // 8, head_dim // 8, head_dim // 4]},
        ),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=hidden_size, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
    )
    torch.manual_seed(seed)
    model = Qwen2VLModel(config)
    return QwenVLEmbedder(model, processor, normalize=normalize)


def synthetic_image(seed: int, size: int = 56):
    """A deterministic random RGB PIL image."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels, mode="RGB")
