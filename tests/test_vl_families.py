"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5, tiny and random, built offline: family resolution,
LM-only LoRA targets, frozen vision tower + projector through both PACE stages, left-padded pooling."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from embedtune.encoders.tiny_vl import TINY_FAMILIES, synthetic_image, tiny_vl_embedder  # noqa: E402
from embedtune.encoders.vision_language import TASK_INSTRUCTIONS, VLInput  # noqa: E402
from embedtune.encoders.vl_families import FAMILIES, LANGUAGE_MODEL_LORA_TARGETS, family_for, load_vl_model, model_class_for  # noqa: E402

# Adapted LM linear layers of the 2-layer tiny models: attention (4) + MLP (3) per layer; Qwen3.5's
# first layer is a Gated DeltaNet (in_proj_qkv/z/b/a, out_proj: 5) instead of attention.
EXPECTED_ADAPTED = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 14, "qwen3_5": 15}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_family_resolution_by_model_type():
    import transformers

    assert set(FAMILIES) == set(TINY_FAMILIES) == {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"}
    assert model_class_for(transformers.Qwen2_5_VLConfig()) is transformers.Qwen2_5_VLModel
    assert model_class_for(transformers.Qwen3VLConfig()) is transformers.Qwen3VLModel
    assert family_for("qwen2_vl").name == "Qwen2-VL"
    with pytest.raises(ValueError, match="model_type 'bert'.*qwen2_5_vl"):
        family_for(transformers.BertConfig())


def test_generation_checkpoint_loads_as_base_model(tmp_path):
    """Hub checkpoints are ...ForConditionalGeneration; the embedder uses the base model only."""
    import transformers

    embedder = tiny_vl_embedder("qwen2_5_vl", seed=4)
    full = transformers.Qwen2_5_VLForConditionalGeneration(embedder.model.config)
    full.save_pretrained(tmp_path)
    base = load_vl_model(tmp_path, local_files_only=True)
    assert type(base) is transformers.Qwen2_5_VLModel
    reference = dict(full.model.named_parameters())
    assert all(torch.equal(parameter, reference[name]) for name, parameter in base.named_parameters())


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_lora_targets_only_language_model_linear_layers(family):
    from embedtune.finetune.modeling import add_lora

    embedder = tiny_vl_embedder(family, seed=1)
    assert embedder.family.model_type == family
    add_lora(embedder, rank=2, target_modules=embedder.family.lora_targets, exclude_modules=None)
    adapted = embedder.check_lora_targets()
    assert len(adapted) == EXPECTED_ADAPTED[family]
    assert all(re.search(r"\.language_model\.layers\.\d+\.", name) and ".visual." not in name for name in adapted)
    trainable = [name for name, parameter in embedder.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


def test_leaf_name_targets_would_adapt_the_qwen25_vision_mlp():
    """Why the rule is anchored at the component: Qwen2.5-VL's vision MLP shares the LM's leaf names."""
    from embedtune.finetune.modeling import add_lora

    assert re.fullmatch(LANGUAGE_MODEL_LORA_TARGETS, "visual.blocks.0.mlp.gate_proj") is None
    embedder = tiny_vl_embedder("qwen2_5_vl", seed=1)
    assert any(name.startswith("visual.blocks.0.mlp.gate_proj") for name, _ in embedder.model.named_parameters())
    add_lora(embedder, rank=2, target_modules=["gate_proj", "up_proj", "down_proj"], exclude_modules=None)
    with pytest.raises(RuntimeError, match="vision side"):
        embedder.check_lora_targets()


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_pooling_reads_the_final_token_under_left_padding(family):
    embedder = tiny_vl_embedder(family, seed=0).eval()
    inputs = [VLInput("a red cat"), VLInput("what is this", [synthetic_image(0)], TASK_INSTRUCTIONS["vqa"]),
              VLInput("two photo of the sea", [synthetic_image(1), synthetic_image(2)])]
    features = embedder.tokenize(inputs)
    assert (features["attention_mask"][:, 0] == 0).any()
    batched = embedder.encode(inputs, batch_size=len(inputs))
    for row, item in enumerate(inputs):
        torch.testing.assert_close(batched[row], embedder.encode([item])[0], atol=1e-4, rtol=1e-4)


def _examples():
    from embedtune.data.mmeb import MMEBTrainExample

    return [
        MMEBTrainExample(VLInput("a red cat", instruction=TASK_INSTRUCTIONS["t2i"]), VLInput("", [synthetic_image(10)]), [VLInput("", [synthetic_image(11)])]),
        MMEBTrainExample(VLInput("", [synthetic_image(12)], TASK_INSTRUCTIONS["i2t"]), VLInput("a blue car"), [VLInput("a green tree")]),
        MMEBTrainExample(VLInput("what colour", [synthetic_image(13)], TASK_INSTRUCTIONS["vqa"]), VLInput("red"), [VLInput("blue")]),
        MMEBTrainExample(VLInput("one dog", [synthetic_image(14)], TASK_INSTRUCTIONS["composed"]), VLInput("", [synthetic_image(16)]), []),
    ]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_vision_and_projector_bit_identical_after_both_stages(family):
    from embedtune.finetune import PACEConfig, StageConfig, train_vl_pace

    embedder = tiny_vl_embedder(family, seed=2)
    vision_before = {name: parameter.detach().clone() for name, parameter in embedder.vision_parameters()}
    projector = {name for name, _ in embedder.projector_parameters()}
    language_before = {name: parameter.detach().clone() for name, parameter in embedder.language_parameters()}
    assert projector and projector <= set(vision_before)
    config = PACEConfig(backbone="vl", stage1=StageConfig(steps=2, learning_rate=1e-2, similarity="cosine", parameters="lora", temperature=0.02),
                        stage2=StageConfig(steps=2, learning_rate=1e-3, similarity="dot", parameters="full", temperature=1.0),
                        batch_size=4, lora_rank=2, n_negatives=None)
    result = train_vl_pace(embedder, _examples(), config)
    assert [log.stage for log in result["logs"]] == [1, 1, 2, 2]
    assert all(torch.isfinite(torch.tensor(log.loss)) for log in result["logs"])
    vision_after = dict(embedder.vision_parameters())
    assert vision_after.keys() == vision_before.keys()
    for name, before in vision_before.items():
        assert torch.equal(vision_after[name], before), f"{family}: vision/projector parameter {name} changed"
        assert not vision_after[name].requires_grad
    language_after = dict(embedder.language_parameters())
    assert language_after.keys() == language_before.keys()  # LoRA merged away
    changed = {name for name, before in language_before.items() if not torch.equal(language_after[name], before)}
    assert any(".layers.0." in name for name in changed) and any(".layers.1." in name for name in changed)
    assert any("embed_tokens" in name for name in changed)  # Stage II trains the whole LM
