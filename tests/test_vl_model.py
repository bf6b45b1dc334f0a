"""Tiny random Qwen2-VL built offline: last-token pooling, frozen vision side, two-stage recipe, evaluate-mmeb."""

from __future__ import annotations

import argparse
import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from embedtune.encoders.tiny_vl import synthetic_image, tiny_qwen2_vl_embedder  # noqa: E402
from embedtune.encoders.vision_language import LANGUAGE_MODEL_LORA_TARGETS, TASK_INSTRUCTIONS, VLInput  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def mixed_inputs():
    return [
        VLInput("a red cat"),                                                        # text only, shortest
        VLInput("what is this", [synthetic_image(0)], TASK_INSTRUCTIONS["vqa"]),     # image + text
        VLInput("two photo of the sea", [synthetic_image(1), synthetic_image(2)]),  # interleaved, longest
        VLInput("", [synthetic_image(3)]),                                           # image only
    ]


def test_pooling_picks_final_template_token_under_left_padding():
    embedder = tiny_qwen2_vl_embedder(seed=0).eval()
    inputs = mixed_inputs()
    features = embedder.tokenize(inputs)
    mask = features["attention_mask"]
    assert (mask[:, 0] == 0).any(), "the batch must actually be left-padded"
    with torch.no_grad():
        output = embedder(features)
    end_of_text = embedder.processor.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    rows = torch.arange(len(inputs))
    index = output["last_token_index"]
    assert index.tolist() == [mask.shape[1] - 1] * len(inputs)
    assert (features["input_ids"][rows, index] == end_of_text).all()
    assert torch.equal(output["sentence_embedding"], output["token_embeddings"][rows, index])
    # Padding must not change any row's embedding.
    batched = output["sentence_embedding"]
    for row, item in enumerate(inputs):
        alone = embedder.encode([item])[0]
        torch.testing.assert_close(batched[row], alone, atol=1e-4, rtol=1e-4)


def test_lora_targets_only_the_language_model():
    qwen25_vision_mlp = "visual.blocks.0.mlp.gate_proj"  # Qwen2.5-VL reuses the LM's MLP names
    assert re.fullmatch(LANGUAGE_MODEL_LORA_TARGETS, qwen25_vision_mlp) is None
    assert re.fullmatch(LANGUAGE_MODEL_LORA_TARGETS, "model.language_model.layers.3.mlp.gate_proj")
    assert re.fullmatch(LANGUAGE_MODEL_LORA_TARGETS, "language_model.layers.0.self_attn.q_proj")

    from embedtune.finetune.modeling import add_lora

    embedder = tiny_qwen2_vl_embedder(seed=1)
    add_lora(embedder, rank=2, target_modules=LANGUAGE_MODEL_LORA_TARGETS, exclude_modules=None)
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in embedder.named_parameters() if ".lora_A" in name}
    assert len(adapted) == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down)
    assert all("language_model.layers." in name and "visual" not in name for name in adapted)
    trainable = [name for name, parameter in embedder.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


def test_two_stage_recipe_freezes_vision_and_trains_language_model(tmp_path):
    from embedtune.data.mmeb import MMEBTrainExample
    from embedtune.finetune import PACEConfig, StageConfig, train_vl_pace

    embedder = tiny_qwen2_vl_embedder(seed=2)
    examples = [
        MMEBTrainExample(VLInput("a red cat", instruction=TASK_INSTRUCTIONS["t2i"]), VLInput("", [synthetic_image(10)]), [VLInput("", [synthetic_image(11)])]),
        MMEBTrainExample(VLInput("", [synthetic_image(12)], TASK_INSTRUCTIONS["i2t"]), VLInput("a blue car"), [VLInput("a green tree")]),
        MMEBTrainExample(VLInput("what colour", [synthetic_image(13)], TASK_INSTRUCTIONS["vqa"]), VLInput("red"), [VLInput("blue")]),
        MMEBTrainExample(VLInput("one dog", [synthetic_image(14), synthetic_image(15)], TASK_INSTRUCTIONS["composed"]),
                         VLInput("", [synthetic_image(16)]), [VLInput("a dog", [synthetic_image(17)])]),
    ]
    vision_before = {name: parameter.detach().clone() for name, parameter in embedder.vision_parameters()}
    language_before = {name: parameter.detach().clone() for name, parameter in embedder.language_parameters()}
    assert any(name.startswith("visual.merger.") for name in vision_before)  # the projector is covered
    config = PACEConfig(backbone="vl", stage1=StageConfig(steps=2, learning_rate=1e-2, similarity="cosine", parameters="lora", temperature=0.02),
                        stage2=StageConfig(steps=2, learning_rate=1e-3, similarity="dot", parameters="full", temperature=1.0),
                        batch_size=4, lora_rank=2, n_negatives=None)
    result = train_vl_pace(embedder, examples, config)
    assert [log.stage for log in result["logs"]] == [1, 1, 2, 2]
    assert all(torch.isfinite(torch.tensor(log.loss)) for log in result["logs"])
    assert result["similarity"] == "dot"
    vision_after = dict(embedder.vision_parameters())
    language_after = dict(embedder.language_parameters())
    assert vision_after.keys() == vision_before.keys() and language_after.keys() == language_before.keys()  # merged, no lora_
    for name, before in vision_before.items():
        assert torch.equal(vision_after[name], before), f"vision parameter {name} changed"
        assert not vision_after[name].requires_grad
    changed = [name for name, before in language_before.items() if not torch.equal(language_after[name], before)]
    assert any("layers.0.self_attn.q_proj" in name for name in changed)
    assert any("embed_tokens" in name for name in changed)  # Stage II trains the full LM, not only LoRA targets

    # Save, reload and score through the CLI handler.
    model_dir = embedder.save(tmp_path / "model", similarity=result["similarity"])
    for index in range(3):
        synthetic_image(20 + index).save(tmp_path / f"img{index}.png")
    rows = [{"qry_text": "what colour", "qry_img_path": f"img{index}.png", "tgt_text": ["red", "blue", "green"], "tgt_img_path": ["", "", ""]}
            for index in range(3)]
    task_file = tmp_path / "OK-VQA.jsonl"
    task_file.write_text("\n".join(json.dumps(row) for row in rows) + "\n")

    from embedtune.cli.mmeb import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["evaluate-mmeb", "--model", str(model_dir), "--tasks", str(task_file), "--json"])
    assert args.handler(args) == 0
    args = parser.parse_args(["evaluate-mmeb", "--model", str(model_dir), "--tasks", str(task_file), "--similarity", "cosine"])
    assert args.handler(args) == 0

    from embedtune.workflows.mmeb import evaluate_mmeb_model

    scores = evaluate_mmeb_model(model_dir, [task_file])
    assert scores["similarity"] == "dot" and set(scores["per_dataset"]) == {"OK-VQA"}
    assert scores["vqa"] == scores["ind"] == scores["overall"] == scores["per_dataset"]["OK-VQA"]
    assert scores["retrieval"] is None
