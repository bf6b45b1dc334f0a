"""A trained tiny Qwen-VL embedder as a SentenceTransformer: identical embeddings after save -> load."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

from embedtune.encoders.tiny_vl import synthetic_image, tiny_vl_embedder  # noqa: E402
from embedtune.encoders.vision_language import TASK_INSTRUCTIONS, QwenVLEmbedder, VLInput  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _inputs():
    return [VLInput("a red cat"), VLInput("what is this", [synthetic_image(0)], TASK_INSTRUCTIONS["vqa"]),
            VLInput("", [synthetic_image(1), synthetic_image(2)])]


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
def test_save_load_round_trip_identical_embeddings(tmp_path, similarity):
    from embedtune.encoders.st_vl import QwenVLModule, load_sentence_transformer, to_sentence_transformer

    embedder = tiny_vl_embedder("qwen2_5_vl", seed=3)
    with torch.no_grad():  # stand-in for training: move the LM off its init so a lost weight would show
        embedder.model.language_model.norm.weight.mul_(1.5)
    inputs = _inputs()
    model = to_sentence_transformer(embedder, similarity)
    before = model.encode(inputs, batch_size=1, convert_to_tensor=True)
    reference = embedder.encode(inputs, batch_size=1)
    if similarity == "cosine":
        reference = torch.nn.functional.normalize(reference, dim=-1)
    assert torch.equal(before, reference)  # the s-t pipeline (lasttoken Pooling) is the training embedder

    embedder.save(tmp_path / "model", similarity=similarity)
    modules = json.loads((tmp_path / "model" / "modules.json").read_text())
    assert modules[0]["type"] == "embedtune.encoders.st_vl.QwenVLModule"
    assert [m["type"].rsplit(".", 1)[1] for m in modules[1:]] == (["Pooling", "Normalize"] if similarity == "cosine" else ["Pooling"])
    assert json.loads((tmp_path / "model" / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "lasttoken"

    loaded = load_sentence_transformer(tmp_path / "model")
    assert isinstance(loaded[0], QwenVLModule) and loaded.similarity_fn_name == similarity
    assert torch.equal(loaded.encode(inputs, batch_size=1, convert_to_tensor=True), before)
    assert torch.equal(loaded.encode(inputs, batch_size=3, convert_to_tensor=True), model.encode(inputs, batch_size=3, convert_to_tensor=True))
    again, saved_similarity = QwenVLEmbedder.load(tmp_path / "model")  # the same folder serves evaluate-mmeb
    assert saved_similarity == similarity and again.family.model_type == "qwen2_5_vl"
    assert torch.equal(again.encode(inputs, batch_size=1), embedder.encode(inputs, batch_size=1))


def test_sentence_transformer_inputs_and_named_prompts():
    from embedtune.encoders.st_vl import as_vl_input, to_sentence_transformer

    embedder = tiny_vl_embedder("qwen2_vl", seed=5)
    model = to_sentence_transformer(embedder, "dot")
    image = synthetic_image(7)
    mixed = model.encode(["a red cat", {"text": "what is this", "image": image}, image], batch_size=3, convert_to_tensor=True)
    assert mixed.shape == (3, 32)
    # prompt_name="vqa" writes the Table 5 instruction into the user content of inputs that have none.
    named = model.encode([{"text": "what is this", "image": image}], prompt_name="vqa", convert_to_tensor=True)
    explicit = embedder.encode([VLInput("what is this", [image], TASK_INSTRUCTIONS["vqa"])])
    assert torch.equal(named, explicit)
    assert as_vl_input(VLInput("x", instruction="own"), prompt="other").instruction == "own"
    with pytest.raises(ValueError, match="unknown keys"):
        as_vl_input({"text": "x", "audio": 1})
    with pytest.raises(TypeError, match="cannot embed"):
        as_vl_input(3.5)
