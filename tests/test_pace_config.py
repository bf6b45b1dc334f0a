"""One PACE config for text and vision-language backbones, and the persistence helper every config uses."""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field

import pytest

from embedtune.finetune import PACEConfig, StageConfig, VLOptions, preset_config
from embedtune.io import config_from_dict, load_config, save_config

# A vl_pace_config.json as the former VL stack wrote it (its own schema: train_data, lora, one gamma, image fields).
LEGACY_VL_FILE = {
    "batch_size": 2, "embedtune_version": "0.1.0", "gamma": 1.5, "image_root": None, "instruction": "", "lora_alpha": None,
    "lora_rank": 2, "max_grad_norm": 1.0, "max_image_pixels": 1605632, "max_seq_length": 8192, "model": "tiny-qwen2.5-vl",
    "n_negatives": 1, "output_dir": "runs/x", "precision": "fp32", "preset": "pace", "seed": 0, "stage2_init": 2,
    "stage1": {"learning_rate": 0.01, "lora": True, "scheduler": "linear", "similarity": "cosine", "steps": 3, "temperature": 0.1,
               "warmup_ratio": 0.05, "weighting": "focal"},
    "stage2": {"learning_rate": 0.001, "lora": False, "scheduler": "constant", "similarity": "dot", "steps": 2, "temperature": 100.0,
               "warmup_ratio": 0.05, "weighting": "focal"},
    "stop_stage1_at_init": False, "task": "vqa", "train_data": "train.jsonl", "weight_temperature": 0.1,
}
# A pace_config.json of the previous release (text): no backbone, vl, max_grad_norm or scheduler keys.
LEGACY_TEXT_FILE = {
    "auto_temperature_samples": 32, "batch_size": 32, "data": "scifact", "deepspeed": None, "embedtune_version": "0.1.0",
    "hard_pool": 50, "logging_steps": 1, "lora_alpha": None, "lora_dropout": 0.0, "lora_exclude_modules": ".*pooler.*",
    "lora_rank": 32, "lora_target_modules": "all-linear", "max_seq_length": 128, "mini_batch_size": None, "model": "minilm",
    "n_negatives": 5, "normalize": "global", "output_dir": "runs/pace", "precision": "auto", "preset": "pace", "save_steps": 500,
    "seed": 2027, "stage1": {"base_temperature": 0.1, "gamma": 2.0, "hardness_mode": None, "hardness_strength": 0.0,
                             "learning_rate": 2e-05, "loss": "focal", "parameters": "lora", "similarity": "cosine", "steps": 400,
                             "temperature": 0.1, "warmup_ratio": 0.05, "weighting": "focal"},
    "stage2": {"base_temperature": 0.1, "gamma": 2.0, "hardness_mode": None, "hardness_strength": 0.0, "learning_rate": 2e-06,
               "loss": "focal", "parameters": "full", "similarity": "dot", "steps": 300, "temperature": "auto", "warmup_ratio": 0.05,
               "weighting": "focal"},
    "stage2_init": 0.25, "stop_stage1_at_init": False, "train_split": "train", "weight_temperature": 0.1,
}


@pytest.mark.parametrize("backbone", ["text", "vl"])
def test_one_config_round_trips_for_both_backbones(tmp_path, backbone):
    extra = {"vl": {"task": "vqa", "image_root": "images"}, "data": "train.jsonl"} if backbone == "vl" else {}
    config = preset_config("pace", backbone=backbone, stage1_steps=8, stage2_steps=4, output_dir=str(tmp_path), **extra)
    path = config.save(tmp_path)
    assert path.name == "pace_config.json"
    document = json.loads(path.read_text())
    assert document["backbone"] == backbone and document["embedtune_version"]
    assert PACEConfig.load(tmp_path) == PACEConfig.load(path) == config
    if backbone == "vl":
        assert isinstance(PACEConfig.load(path).vl, VLOptions) and config.vl.max_image_pixels == 1_605_632
    else:
        assert config.vl is None


def test_files_of_the_previous_release_still_load(tmp_path):
    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "vl_pace_config.json").write_text(json.dumps(LEGACY_VL_FILE))
    vl = PACEConfig.load(tmp_path / "vl")  # the folder finds the former file name
    assert (vl.backbone, vl.data, vl.model, vl.batch_size, vl.n_negatives, vl.stage2_init) == ("vl", "train.jsonl", "tiny-qwen2.5-vl", 2, 1, 2)
    assert vl.vl == VLOptions(image_root=None, task="vqa", instruction="", max_image_pixels=1605632)
    assert (vl.stage1.parameters, vl.stage2.parameters) == ("lora", "full")
    assert vl.stage1.gamma == vl.stage2.gamma == 1.5 and vl.stage2.scheduler == "constant" and vl.stage2.temperature == 100.0

    (tmp_path / "pace_config.json").write_text(json.dumps(LEGACY_TEXT_FILE))
    text = PACEConfig.load(tmp_path)
    assert text.backbone == "text" and text.vl is None and text.max_grad_norm == 1.0 and text.stage1.scheduler == "linear"
    assert text == preset_config("pace", stage1_steps=400, stage2_steps=300, max_seq_length=128)


def test_temperature_means_one_thing_and_auto_resolves_for_both_backbones():
    for backbone in ("text", "vl"):
        config = PACEConfig(backbone=backbone, stage1=StageConfig(similarity="cosine", temperature="auto"), data="x")
        assert config.stage1.temperature == config.stage1.base_temperature  # cosine: 'auto' is τ_1
        assert config.stage2.temperature == "auto"  # dot: measured when the stage starts
    with pytest.raises(ValueError, match="'auto'"):
        StageConfig(temperature="warm")


def test_auto_temperature_on_a_vl_backbone_is_base_times_median_norm_product():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from embedtune.data.mmeb import MMEBTrainExample
    from embedtune.encoders.tiny_vl import tiny_vl_embedder
    from embedtune.encoders.vision_language import VLInput
    from embedtune.finetune.backbones.vl import VisionLanguageBackbone
    from embedtune.finetune.stages import run_stages

    torch.set_num_threads(1)
    examples = [MMEBTrainExample(VLInput(f"query {i}"), VLInput(f"answer {i}"), [VLInput(f"other {i}")]) for i in range(4)]
    config = PACEConfig(backbone="vl", stage1=StageConfig(steps=1, temperature=0.1),
                        stage2=StageConfig(similarity="dot", parameters="full", steps=1, temperature="auto", base_temperature=0.05),
                        batch_size=2, lora_rank=2, auto_temperature_samples=4, stage2_init="final")
    embedder = tiny_vl_embedder("qwen2_vl", seed=1)
    backbone = VisionLanguageBackbone(device="cpu")
    reference = tiny_vl_embedder("qwen2_vl", seed=1)
    reference.normalize = False
    with torch.no_grad():
        q = reference.embed([example.query for example in examples]).norm(dim=1)
        c = reference.embed([example.positive for example in examples] + [n for example in examples for n in example.negatives]).norm(dim=1)
    assert backbone.norm_product_median(reference, examples, config) == pytest.approx(float(torch.outer(q, c).median()), rel=1e-5)

    embedder.normalize = False
    outcome = run_stages(backbone, embedder, examples, config, None, None)
    stage2 = outcome.stages[1]
    assert stage2.norm_product_median > 0 and stage2.temperature == pytest.approx(0.05 * stage2.norm_product_median)
    assert outcome.stages[0].norm_product_median is None and outcome.stages[0].temperature == 0.1


def test_family_rules_are_checked_where_the_config_is_built():
    with pytest.raises(ValueError, match="backbone must be one of"):
        PACEConfig(backbone="audio")
    with pytest.raises(ValueError, match="stage1.steps must be >= 1"):
        PACEConfig(stage1=StageConfig(steps=0))
    assert PACEConfig(backbone="vl", stage1=StageConfig(steps=0)).stage1.steps == 0  # vl: skip Stage I
    with pytest.raises(ValueError, match="n_negatives must be >= 1"):
        PACEConfig(n_negatives=None)
    with pytest.raises(ValueError, match="stage1 has unknown keys"):
        PACEConfig(stage1={"learning_rat": 1e-5})
    assert PACEConfig(stage1={"lora": False}).stage1.parameters == "full"  # the former VL spelling


def test_deprecated_vl_names_build_the_shared_config_with_their_old_defaults():
    from embedtune.finetune import VLPACEConfig, VLStageConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        config = VLPACEConfig(stage1=VLStageConfig(steps=2), train_data="t.jsonl", task="vqa", gamma=3.0)
    assert isinstance(config, PACEConfig) and config.backbone == "vl" and config.data == "t.jsonl" and config.vl.task == "vqa"
    assert (config.stage1.learning_rate, config.stage1.temperature, config.stage1.warmup_ratio) == (1e-4, 0.02, 0.0)
    assert config.stage1.gamma == config.stage2.gamma == 3.0
    assert (config.batch_size, config.lora_rank, config.seed, config.stage2_init, config.n_negatives) == (4, 8, 0, "final", None)


# -- the persistence helper --------------------------------------------------------------------------


@dataclass
class Inner:
    rate: float = field(default=0.1, metadata={"help": "a rate"})


@dataclass
class Outer:
    name: str = field(default="x", metadata={"help": "a name"})
    inner: Inner = field(default_factory=Inner, metadata={"help": "nested"})
    optional: Inner | None = field(default=None, metadata={"help": "nested or None"})


def test_save_config_writes_sorted_indented_versioned_json(tmp_path):
    path = save_config(Outer(name="b", optional=Inner(0.5)), tmp_path, "outer.json")
    text = path.read_text()
    document = json.loads(text)
    assert list(document) == sorted(document) and text.startswith('{\n  "') and text.endswith("}\n")
    assert document["embedtune_version"] and document["optional"] == {"rate": 0.5}
    assert load_config(Outer, tmp_path, "outer.json") == load_config(Outer, path) == Outer(name="b", optional=Inner(0.5))


def test_unknown_keys_are_dropped_with_a_warning_at_every_level():
    values = {"name": "a", "future": 1, "inner": {"rate": 0.2, "newer": True}, "optional": None, "embedtune_version": "9.9"}
    with pytest.warns(UserWarning) as caught:
        loaded = config_from_dict(Outer, values)
    assert loaded == Outer(name="a", inner=Inner(0.2))
    messages = " ".join(str(w.message) for w in caught)
    assert "['future']" in messages and "Outer.inner: ignoring unknown config keys ['newer']" in messages


def test_load_config_names_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_config(Outer, tmp_path)


def test_compressor_configs_use_the_same_helper():
    from embedtune.compress.base import CompressorConfig

    with pytest.warns(UserWarning, match="ignoring unknown config keys \\['later'\\]"):
        config = CompressorConfig.from_dict({"dim": 16, "seed": 1, "later": 2})
    assert dataclasses.asdict(config) == {"dim": 16, "seed": 1}


def test_a_setting_the_preset_has_no_place_for_is_refused_not_dropped():
    with pytest.raises(ValueError, match="--steps.*two stages.*--stage1-steps 3 --stage2-steps 3"):
        preset_config("pace", steps=3)
    with pytest.raises(ValueError, match="one stage.*--stage2-lr"):
        preset_config("direct-dot-full", stage2_learning_rate=1e-5)
    assert preset_config("direct-dot-full", steps=3).stage1.steps == 3  # the flag's own place still works


def test_finetune_pace_steps_under_the_two_stage_preset_fails_before_any_work(tmp_path, capsys):
    from embedtune.cli import main

    assert main(["finetune", "pace", "--steps", "3", "--out", str(tmp_path / "run")]) != 0
    assert "--stage1-steps" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
