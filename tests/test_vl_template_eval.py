"""Chat template (PACE A.2), Precision@1 with the tie rule, MMEB grouping and MMEB-format loaders (no model)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.encoders.vision_language import SYSTEM_PROMPT, TASK_INSTRUCTIONS, last_token_indices, render_prompt
from embedtune.evaluate.mmeb import MMEB_TASKS, aggregate_mmeb, precision_at_1


def test_template_renders_exactly():
    assert SYSTEM_PROMPT == "Represent the user's input."
    assert render_prompt("a red cat") == (
        "<|im_start|>system\nRepresent the user's input.<|im_end|>\n"
        "<|im_start|>user\na red cat<|im_end|>\n"
        "<|im_start|>assistant\n<|endoftext|>"
    )
    assert render_prompt("what is this?", n_images=1, instruction=TASK_INSTRUCTIONS["vqa"]) == (
        "<|im_start|>system\nRepresent the user's input.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
        "Represent the given image to answer the following question. what is this?<|im_end|>\n"
        "<|im_start|>assistant\n<|endoftext|>"
    )
    image_only = render_prompt("", n_images=2)
    assert "user\n<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|><|im_end|>" in image_only


def test_table5_instructions():
    assert TASK_INSTRUCTIONS["t2i"] == "Retrieve an image that best matches the following description."
    assert TASK_INSTRUCTIONS["i2t"] == "Find the caption that best describes this image."
    assert TASK_INSTRUCTIONS["composed"] == "Find an image matching the described changes."
    assert TASK_INSTRUCTIONS["classification"] == TASK_INSTRUCTIONS["vqa"]


def test_last_token_indices_left_and_right_padding():
    import torch

    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert last_token_indices(left).tolist() == [3, 3, 3]
    assert last_token_indices(right).tolist() == [1, 3, 0]


def test_precision_at_1_hand_made_with_tie():
    xq = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    xc = np.array([
        [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]],   # hit
        [[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]],   # miss: a distractor wins
        [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]],    # tie with the ground truth: a miss
        [[3.0, 0.0], [1.0, 0.0], [0.0, 1.0]],    # hit (cosine ties 0 and 1, dot does not)
    ])
    precision, hits = precision_at_1(xq, xc, "dot")
    assert hits.tolist() == [True, False, False, True] and precision == 0.5
    precision, hits = precision_at_1(xq, xc, "cosine")
    assert hits.tolist() == [True, False, False, False] and precision == 0.25
    with pytest.raises(ValueError, match="cosine"):
        precision_at_1(xq, xc, "euclidean")


def test_aggregation_follows_table1_grouping():
    assert sum(split == "ind" for _, split in MMEB_TASKS.values()) == 20
    assert sum(split == "ood" for _, split in MMEB_TASKS.values()) == 16
    scores = {"ImageNet-1K": 0.6, "Place365": 0.2, "OK-VQA": 0.5, "CIRR": 0.4, "RefCOCO": 0.9}
    result = aggregate_mmeb(scores)
    assert result["classification"] == pytest.approx(0.4)
    assert result["vqa"] == pytest.approx(0.5) and result["retrieval"] == pytest.approx(0.4) and result["grounding"] == pytest.approx(0.9)
    assert result["ind"] == pytest.approx(0.5) and result["ood"] == pytest.approx(0.55)
    assert result["overall"] == pytest.approx(np.mean(list(scores.values())))


def test_mmeb_loaders_jsonl_and_parquet_lazy_images(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from embedtune.data.mmeb import LazyImage, load_mmeb_eval, load_mmeb_train

    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "red.png")
    train = [{"qry": "<|image_1|> a red square", "qry_image_path": "red.png", "pos_text": "red",
              "pos_image_path": "", "neg_text": ["blue", "green"], "neg_image_path": ["", "red.png"]}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(row) for row in train) + "\n")
    pq.write_table(pa.Table.from_pylist(train), tmp_path / "train.parquet")
    for name in ("train.jsonl", "train.parquet"):
        (example,) = load_mmeb_train(tmp_path / name, instruction="Find it.")
        assert example.query.text == "a red square" and example.query.instruction == "Find it."
        assert isinstance(example.query.images[0], LazyImage)  # not opened yet
        assert example.query.images[0]().size == (8, 8)
        assert example.positive.images == [] and [n.text for n in example.negatives] == ["blue", "green"]
        assert len(example.negatives[1].images) == 1
    rows = [{"qry_text": "colour?", "qry_img_path": "red.png", "tgt_text": ["red", "blue", "green"], "tgt_img_path": ["", "", ""]}]
    (tmp_path / "ImageNet-1K.jsonl").write_text(json.dumps(rows[0]) + "\n")
    eval_set = load_mmeb_eval(tmp_path / "ImageNet-1K.jsonl")
    assert eval_set.name == "ImageNet-1K" and [c.text for c in eval_set.examples[0].candidates] == ["red", "blue", "green"]
