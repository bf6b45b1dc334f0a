"""``embedtune finetune pace-vl`` end to end on a tiny random Qwen-VL with synthetic PIL images, the
validated config saved next to the weights, the paper presets, and Stage II's init checkpoint."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from embedtune.encoders.tiny_vl import synthetic_image, tiny_vl_embedder  # noqa: E402
from embedtune.finetune import PACEConfig, StageConfig, preset_config  # noqa: E402
from embedtune.workflows.results import read_results  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _write_data(root):
    for index in range(6):
        synthetic_image(30 + index).save(root / f"img{index}.png")
    train = [
        {"qry": "a red cat", "qry_image_path": "", "pos_text": "", "pos_image_path": "img0.png", "neg_text": [""], "neg_image_path": ["img1.png"], "task": "t2i"},
        {"qry": "", "qry_image_path": "img2.png", "pos_text": "a blue car", "pos_image_path": "", "neg_text": ["a green tree"], "task": "i2t"},
        {"qry": "what colour", "qry_image_path": "img3.png", "pos_text": "red", "pos_image_path": "", "neg_text": ["blue", "green"], "task": "vqa"},
        {"qry": "one dog", "qry_image_path": "img4.png", "pos_text": "", "pos_image_path": "img5.png", "neg_text": [], "instruction": "Find an image matching the described changes."},
    ]
    train_file = root / "train.jsonl"
    train_file.write_text("".join(json.dumps(row) + "\n" for row in train))
    eval_rows = [{"qry_text": "what colour", "qry_img_path": f"img{index}.png", "tgt_text": ["red", "blue", "green"], "tgt_img_path": ["", "", ""]}
                 for index in range(3)]
    eval_file = root / "OK-VQA.jsonl"
    eval_file.write_text("".join(json.dumps(row) + "\n" for row in eval_rows))
    return train_file, eval_file


def test_cli_trains_stage1_then_stage2_and_saves_config_next_to_weights(tmp_path, capsys):
    from embedtune.cli import main
    from embedtune.encoders.st_vl import load_sentence_transformer
    from embedtune.encoders.vision_language import QwenVLEmbedder

    train_file, eval_file = _write_data(tmp_path)
    out = tmp_path / "run"
    code = main([
        "finetune", "pace-vl", "--model", "tiny-qwen2.5-vl", "--data", str(train_file), "--out", str(out),
        "--stage1-steps", "3", "--stage2-steps", "2", "--stage2-init", "2", "--batch-size", "2", "--lora-rank", "2",
        "--stage1-lr", "1e-2", "--stage2-lr", "1e-3", "--stage2-temperature", "1", "--n-negatives", "1",
        "--precision", "fp32", "--eval-tasks", str(eval_file), "--json",
    ])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["similarity"] == "dot" and summary["backbone"] == "vl" and summary["stage2_init_step"] == 2
    assert [(stage["name"], stage["steps"], stage["steps_run"]) for stage in summary["stages"]] == [("stage1", 3, 3), ("stage2", 2, 2)]
    assert set(summary["metrics"]["per_dataset"]) == {"OK-VQA"}

    result = json.loads((out / "results.json").read_text())["details"]  # the training record
    assert [len(stage["log_history"]) for stage in result["stages"]] == [3, 2]
    assert all(entry["loss"] is not None for stage in result["stages"] for entry in stage["log_history"])  # finite, not NaN
    assert result["stages"][1]["init_checkpoint"].endswith("adapter-step-2")
    assert (out / "stage1" / "adapter-step-2" / "adapter_config.json").is_file()
    assert (out / "stage1" / "adapter-final" / "adapter_config.json").is_file()

    # The validated config is saved next to the weights and reads back as what the flags asked for.
    saved = PACEConfig.load(out / "model")
    assert saved == PACEConfig.load(out)
    assert saved.backbone == "vl" and saved.data == str(train_file)
    assert saved.preset == "pace" and saved.model == "tiny-qwen2.5-vl" and saved.lora_rank == 2 and saved.batch_size == 2
    assert (saved.stage1.steps, saved.stage1.learning_rate, saved.stage1.similarity, saved.stage1.parameters) == (3, 1e-2, "cosine", "lora")
    assert (saved.stage2.steps, saved.stage2.learning_rate, saved.stage2.temperature, saved.stage2.parameters) == (2, 1e-3, 1.0, "full")
    assert saved.stage2_init == 2 and saved.n_negatives == 1 and saved.vl.max_image_pixels == 1_605_632  # untouched preset value
    assert json.loads((out / "model" / "pace_config.json").read_text())["embedtune_version"]

    embedder, similarity = QwenVLEmbedder.load(out / "model")
    assert similarity == "dot" and embedder.family.model_type == "qwen2_5_vl" and not embedder.lora_modules()
    assert load_sentence_transformer(out / "model").similarity_fn_name == "dot"
    assert main(["evaluate-mmeb", "--model", str(out / "model"), "--tasks", str(eval_file), "--task-format", "auto", "--json",
                 "--out", str(tmp_path / "mmeb")]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["similarity"] == "dot" and scored["vqa"] == scored["per_dataset"]["OK-VQA"]
    results = read_results(tmp_path / "mmeb")  # the one results layout
    assert results["metrics"]["main_score"] == scored["overall"] and results["model"]["similarity"] == "dot"
    assert [row["dataset"] for row in results["rows"]] == list(scored["per_dataset"])

    # Rerun from the saved config (one flag changed): same recipe, new output.
    code = main(["finetune", "pace-vl", "--config", str(out / "pace_config.json"), "--out", str(tmp_path / "rerun"),
                 "--stage2-steps", "1", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["stages"][1]["steps"] == 1


def test_stage2_starts_from_the_stage1_init_step_checkpoint(tmp_path):
    """Stage I runs 3 steps, Stage II starts from step 1: the LM equals base + merged step-1 adapter."""
    from peft import PeftModel

    from embedtune.data.mmeb import load_mmeb_train
    from embedtune.finetune import train_vl_pace

    train_file, _ = _write_data(tmp_path)
    examples = load_mmeb_train(train_file)
    config = PACEConfig(backbone="vl", stage1=StageConfig(steps=3, learning_rate=1e-2), stage2=StageConfig(steps=0, similarity="dot", parameters="full"),
                        stage2_init=1, batch_size=2, lora_rank=2, n_negatives=None)
    embedder = tiny_vl_embedder("qwen2_vl", seed=7)
    outcome = train_vl_pace(embedder, examples, config, checkpoint_dir=tmp_path / "stage1")
    assert outcome["stage2_init_step"] == 1 and len(outcome["logs"]) == 3

    reference = tiny_vl_embedder("qwen2_vl", seed=7).model
    merged = PeftModel.from_pretrained(reference, str(tmp_path / "stage1" / "adapter-step-1")).merge_and_unload()
    expected = dict(merged.named_parameters())
    for name, parameter in embedder.model.named_parameters():
        torch.testing.assert_close(parameter, expected[name], rtol=0, atol=1e-6, msg=name)
    final = PeftModel.from_pretrained(tiny_vl_embedder("qwen2_vl", seed=7).model, str(tmp_path / "stage1" / "adapter-final")).merge_and_unload()
    assert not torch.allclose(dict(final.named_parameters())["language_model.layers.0.self_attn.q_proj.weight"],
                              expected["language_model.layers.0.self_attn.q_proj.weight"])


def test_presets_mirror_appendix_a():
    config = preset_config("pace", backbone="vl")
    assert (config.stage1.similarity, config.stage1.parameters, config.stage1.learning_rate, config.stage1.temperature) == ("cosine", "lora", 2e-5, 0.1)
    assert (config.stage2.similarity, config.stage2.parameters, config.stage2.learning_rate, config.stage2.temperature) == ("dot", "full", 2e-6, 100.0)
    assert config.stage1.warmup_ratio == config.stage2.warmup_ratio == 0.05 and config.stage1.steps is None  # one epoch each
    assert (config.lora_rank, config.batch_size, config.n_negatives, config.stage1.gamma, config.stage2_init) == (32, 32, 5, 2.0, 0.25)
    assert (config.max_seq_length, config.vl.max_image_pixels, config.precision, config.seed) == (8192, 1_605_632, "auto", 0)
    assert config.stage2_init_step(7847) == 1962  # ≈ the paper's step 2,000
    baseline = preset_config("vlm2vec", backbone="vl")
    assert baseline.stage2 is None and baseline.stage1.weighting == "none" and baseline.stage1.parameters == "lora"
    assert preset_config("no-focal", backbone="vl").stage2.weighting == "none"
    # The same preset names work for both families; only the paper's per-family values differ.
    text = preset_config("pace", stage1_steps=10, stage2_steps=5)
    assert text.stage2.temperature == "auto" and text.vl is None and text.seed == 2027


def test_config_errors_name_the_field_and_the_fix(tmp_path, capsys):
    from embedtune.cli import main

    with pytest.raises(ValueError, match="stage2.parameters='lora' is not supported.*set stage2.parameters='full'"):
        PACEConfig(backbone="vl", stage2=StageConfig(similarity="dot", parameters="lora"))
    with pytest.raises(ValueError, match="batch_size must be a positive integer; got 0"):
        PACEConfig(backbone="vl", batch_size=0)
    with pytest.raises(ValueError, match="stage1 has unknown keys \\['lr'\\]"):
        PACEConfig(backbone="vl", stage1={"lr": 1e-3})
    with pytest.raises(ValueError, match="task='grounding' is not a PACE task format"):
        PACEConfig(backbone="vl", vl={"task": "grounding"})
    with pytest.raises(ValueError, match="vl options are for backbone='vl'"):
        PACEConfig(vl={"task": "vqa"})
    with pytest.raises(ValueError, match="mini_batch_size is not supported for backbone='vl'"):
        PACEConfig(backbone="vl", mini_batch_size=2)
    with pytest.raises(ValueError, match="backbone='vl' trains with loss='focal'"):
        preset_config("st-hardness", backbone="vl", steps=3)
    with pytest.raises(ValueError, match="stage2_init=9 is beyond Stage I's 3 steps"):
        PACEConfig(backbone="vl", stage2_init=9).stage2_init_step(3)
    with pytest.raises(ValueError, match="unknown preset 'paper'"):
        preset_config("paper", backbone="vl")
    assert main(["finetune", "pace-vl", "--model", "tiny-qwen2-vl", "--out", str(tmp_path / "x")]) == 2
    assert "--data is required" in capsys.readouterr().err
    assert main(["finetune", "pace-vl", "--preset", "vlm2vec", "--model", "tiny-qwen2-vl", "--data", "t.jsonl",
                 "--out", str(tmp_path / "y"), "--stage2-steps", "3"]) == 2
    assert "preset 'vlm2vec' needs steps=, or stage1_steps= and stage2_steps=" in capsys.readouterr().err
    assert main(["finetune", "pace", "--config", str(_vl_config_file(tmp_path)), "--out", str(tmp_path / "z")]) == 2
    assert "run it with `embedtune finetune pace-vl`" in capsys.readouterr().err


def _vl_config_file(tmp_path):
    path = tmp_path / "vl" / "pace_config.json"
    PACEConfig(backbone="vl", data="t.jsonl").save(path.parent)
    return path
