"""The PACE recipe on a tiny random BERT: LoRA merge, stage transition, presets, outputs, CLI."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from embedtune.finetune import PACEConfig, StageConfig, preset_config, train_pace
from embedtune.finetune.config import PRESETS
from embedtune.finetune.modeling import add_lora, has_lora, load_base_model, load_stage_checkpoint, merge_lora, parameter_fingerprint

TEXTS = ["what about topic 1 number 3", "document number 4 about topic 2", "title 7"]


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    """conftest's toy BEIR dataset, built once for this module."""
    from conftest import write_beir

    corpus = [{"_id": f"d{i}", "title": f"title {i}", "text": f"document number {i} about topic {i % 5}"} for i in range(20)]
    queries = [{"_id": f"q{i}", "text": f"what about topic {i % 5} number {i}"} for i in range(10)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(10)] + [(f"q{i}", f"d{i + 10}", 2) for i in range(10)]
    return write_beir(tmp_path_factory.mktemp("pace-data") / "toy", corpus, queries, qrels)


@pytest.fixture(scope="module")
def full_run(tiny_bert_dir, toy_data, tmp_path_factory):
    """PACE with Stage I run to the end (4 steps) and Stage II from step 2 (fraction 0.5)."""
    config = tiny_config(tiny_bert_dir, toy_data, tmp_path_factory.mktemp("pace-full"), stage2_init=0.5)
    return config, train_pace(config)


def tiny_config(tiny_bert_dir, toy_beir, tmp_path, preset="pace", **overrides):
    options = dict(
        stage1_steps=4,
        stage2_steps=1,
        model=str(tiny_bert_dir),
        data=str(toy_beir),
        train_split="test",
        output_dir=str(tmp_path / "run"),
        batch_size=4,
        n_negatives=2,
        hard_pool=5,
        save_steps=2,
        lora_rank=4,
        auto_temperature_samples=4,
    )
    options.update(overrides)
    return preset_config(preset, **options)


def test_merge_keeps_outputs_and_makes_everything_trainable(tiny_bert_dir):
    model = load_base_model(str(tiny_bert_dir))
    model.eval()
    add_lora(model, rank=4)
    assert has_lora(model)
    assert all(not p.requires_grad for name, p in model.named_parameters() if "lora_" not in name)
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA B starts at zero; make the adapter change the outputs
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    before = model.encode(TEXTS, convert_to_tensor=True)
    base = load_base_model(str(tiny_bert_dir)).eval().encode(TEXTS, convert_to_tensor=True)
    assert not torch.allclose(before, base, atol=1e-3)
    merge_lora(model)
    after = model.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    assert not has_lora(model)
    assert all(p.requires_grad for p in model.parameters())
    assert not any("lora_" in name for name, _ in model.named_parameters())


def test_stage_two_starts_from_the_chosen_checkpoint(full_run):
    config, result = full_run
    stage1, stage2 = result.stages
    assert stage1.steps_run == 4 and stage2.steps_run == 1
    assert stage2.init_checkpoint.endswith("checkpoint-2")
    chosen = parameter_fingerprint(load_stage_checkpoint(stage2.init_checkpoint, config.model))
    final = parameter_fingerprint(load_stage_checkpoint(stage1.checkpoints[-1], config.model))
    assert stage1.checkpoints[-1].endswith("checkpoint-4")
    assert stage2.init_fingerprint == pytest.approx(chosen)
    assert stage2.init_fingerprint["sum_sq"] != pytest.approx(final["sum_sq"], rel=1e-9)
    # Stage II trains every parameter with the dot product at the auto temperature.
    assert stage2.trainable_parameters == stage2.total_parameters
    assert stage2.similarity == "dot" and stage2.norm_product_median > 0
    assert stage2.temperature == pytest.approx(0.1 * stage2.norm_product_median)
    assert {"mean_weight", "mean_confidence", "positive_accuracy"} <= set(stage1.log_history[0])
    # The output is a normal s-t folder that ranks by the dot product.
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(result.model_dir, device="cpu")
    assert model.similarity_fn_name == "dot"
    saved = json.loads((Path(config.output_dir) / "results.json").read_text())["details"]  # the training record
    assert not (Path(config.output_dir) / "result.json").exists()  # the older name is no longer written
    assert saved["stages"][1]["init_checkpoint"] == stage2.init_checkpoint
    assert PACEConfig.load(config.output_dir).stage2_init == 0.5


def test_stop_stage1_at_init_gives_the_same_checkpoint(full_run, tiny_bert_dir, toy_data, tmp_path):
    _, full_result = full_run
    short = tiny_config(tiny_bert_dir, toy_data, tmp_path, stage2_init=2, stage2_steps=1, stop_stage1_at_init=True)
    short_result = train_pace(short)
    assert short_result.stages[0].steps_run == 2 and full_result.stages[0].steps_run == 4
    assert short_result.stages[1].init_fingerprint == pytest.approx(full_result.stages[1].init_fingerprint, rel=1e-6)


def test_auto_temperature_is_tau1_times_median_norm_product(tiny_bert_dir, toy_data):
    from embedtune.data import load_beir
    from embedtune.encoders import SentenceEncoder
    from embedtune.finetune import auto_temperature, mine_training_tuples

    dataset = load_beir(str(toy_data), "test")
    tuples = mine_training_tuples(dataset, SentenceEncoder(str(tiny_bert_dir), show_progress=False), n_negatives=2, hard_pool=5)
    train = tuples.to_dataset(dataset)
    model = load_base_model(str(tiny_bert_dir))
    tau, median = auto_temperature(model, train, base_temperature=0.1, n_samples=len(train))
    q = model.encode(list(train["anchor"]), convert_to_numpy=True)
    c = model.encode([t for name in ("positive", "negative_1", "negative_2") for t in train[name]], convert_to_numpy=True)
    expected = np.median(np.outer(np.linalg.norm(q, axis=1), np.linalg.norm(c, axis=1)))
    assert median == pytest.approx(float(expected), rel=1e-4)
    assert tau == pytest.approx(0.1 * median)
    assert len(tuples) == 20 and tuples.n_negatives == 2 and set(train.column_names) == {"anchor", "positive", "negative_1", "negative_2"}


def test_presets_match_the_paper_rows():
    pace = preset_config("pace", stage1_steps=100, stage2_steps=60)
    assert (pace.stage1.similarity, pace.stage1.parameters, pace.stage1.learning_rate, pace.stage1.temperature) == ("cosine", "lora", 2e-5, 0.1)
    assert (pace.stage2.similarity, pace.stage2.parameters, pace.stage2.learning_rate, pace.stage2.temperature) == ("dot", "full", 2e-6, "auto")
    assert pace.stage1.weighting == pace.stage2.weighting == "focal" and pace.stage1.gamma == 2.0
    assert pace.lora_rank == 32 and pace.n_negatives == 5 and pace.stage2_init_step(100) == 25
    infonce = preset_config("infonce-lora", stage1_steps=100, stage2_steps=60)
    assert infonce.stage2 is None and infonce.stage1.weighting == "none" and infonce.stage1.steps == 25 + 60
    direct = preset_config("direct-dot-full", steps=50)
    assert (direct.stage1.similarity, direct.stage1.parameters, direct.stage1.steps) == ("dot", "full", 50)
    assert preset_config("no-focal").stage2.weighting == "none"
    assert preset_config("no-dot").stage2.similarity == "cosine"
    assert preset_config("s2-lora").stage2.parameters == "lora"
    reversed_sim = preset_config("dot-to-cos")
    assert (reversed_sim.stage1.similarity, reversed_sim.stage2.similarity) == ("dot", "cosine")
    reversed_params = preset_config("full-to-lora")
    assert (reversed_params.stage1.parameters, reversed_params.stage2.parameters) == ("full", "lora")
    assert preset_config("s2-from-final").stage2_init_step(80) == 80
    variant = preset_config("stage1-only", stage1_steps=30, weighting="qn", gamma=4.0)
    assert variant.stage2 is None and variant.stage1.weighting == "qn" and variant.stage1.gamma == 4.0
    assert preset_config("pace", stage2_temperature=100).stage2.temperature == 100.0
    assert set(PRESETS) >= {"pace", "infonce-lora", "direct-dot-full", "no-focal", "no-dot", "s2-lora", "dot-to-cos", "full-to-lora", "s2-from-final"}


def test_config_validation_and_round_trip(tmp_path):
    with pytest.raises(ValueError, match=r"\['cosine', 'dot'\]"):
        StageConfig(similarity="l2")
    with pytest.raises(ValueError, match="'auto'"):
        StageConfig(temperature="hot")
    with pytest.raises(ValueError, match="stage2_init"):
        PACEConfig(stage2_init=1.5)
    assert PACEConfig(stage2_init="final").stage2_init_step(10) == 10
    assert PACEConfig(stage2_init="300").stage2_init_step(1000) == 300
    with pytest.raises(ValueError, match="beyond"):
        PACEConfig(stage2_init=30).stage2_init_step(20)
    with pytest.raises(ValueError, match="unknown preset"):
        preset_config("nope")
    config = preset_config("pace", stage1_steps=8, stage2_steps=4, output_dir=str(tmp_path))
    path = config.save(tmp_path)
    document = json.loads(path.read_text())
    assert document["embedtune_version"] and list(document) == sorted(document)
    document["from_the_future"] = 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = PACEConfig.from_dict(document)
    assert any("from_the_future" in str(w.message) for w in caught)
    assert loaded == config


@pytest.mark.parametrize("preset", ["s2-lora", "full-to-lora"])
def test_lora_final_stage_is_merged_into_a_plain_model(tiny_bert_dir, toy_data, tmp_path, preset):
    result = train_pace(tiny_config(tiny_bert_dir, toy_data, tmp_path, preset=preset, stage1_steps=2, stage2_init=1, save_steps=1))
    assert result.stages[1].parameters == "lora" and result.stages[1].trainable_parameters < result.stages[1].total_parameters
    files = {p.name for p in (tmp_path / "run" / "model").iterdir()}
    assert "model.safetensors" in files and "adapter_config.json" not in files


def test_cli_handler_one_stage_baseline_and_dot_evaluation(tiny_bert_dir, toy_data, tmp_path, capsys):
    from embedtune.cli import finetune
    from embedtune.finetune import evaluate_model

    parser = argparse.ArgumentParser()
    finetune.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args([
        "finetune", "pace", "--preset", "direct-dot-full", "--steps", "2", "--model", str(tiny_bert_dir), "--data", str(toy_data),
        "--train-split", "test", "--out", str(tmp_path / "cli"), "--batch-size", "4", "--n-negatives", "2", "--hard-pool", "5",
        "--evaluate-split", "test", "--json",
    ])
    assert args.handler(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["similarity"] == "dot" and printed["stages"][0]["steps_run"] == 2 and "ndcg@10" in printed["metrics"]
    # Trained and scored on the same qrels split: every scored query is seen, and the report says so.
    counts = printed["subsets"]["counts"]
    assert counts["unseen"] == 0 and counts["seen"] + counts["mixed"] == counts["all"] > 0
    again = evaluate_model(printed["model_dir"], str(toy_data), "test", similarity="dot")
    assert again.to_dict()["ndcg@10"] == pytest.approx(printed["metrics"]["ndcg@10"])


def test_default_preset_generalises_and_direct_dot_full_keeps_its_schedule(tiny_bert_dir, toy_data, tmp_path, capsys):
    """With no preset named, text runs no-dot (cosine in both stages); VL keeps the paper's recipe.
    direct-dot-full, chosen by name, still runs its measured 5 epochs."""
    from embedtune.cli import build_parser
    from embedtune.finetune.config import DEFAULT_PRESETS, ONE_STAGE_DEFAULT_EPOCHS, stage_steps

    parser = build_parser()
    assert parser.parse_args(["finetune", "pace"]).preset == DEFAULT_PRESETS["text"] == "no-dot"
    assert parser.parse_args(["finetune", "pace-vl"]).preset == DEFAULT_PRESETS["vl"] == "pace"
    assert parser.parse_args(["pipeline", "--out", "x"]).preset == "no-dot"
    default = preset_config(DEFAULT_PRESETS["text"])
    assert default.stage1.similarity == default.stage2.similarity == "cosine" and default.stage2.parameters == "full"
    direct = preset_config("direct-dot-full")
    assert direct.stage2 is None and direct.stage1.steps is None and direct.stage1.epochs == ONE_STAGE_DEFAULT_EPOCHS["direct-dot-full"] == 5.0
    # 20 tuples at batch 4: 5 steps per epoch, 25 for five epochs; steps given always win.
    assert stage_steps(direct.stage1, 20, 4) == 25 and stage_steps(direct.stage1, 21, 4) == 30
    assert stage_steps(preset_config("direct-dot-full", steps=7).stage1, 20, 4) == 7
    assert preset_config("direct-dot-full", stage1_steps=8, stage2_steps=4).stage1.steps == 2 + 4
    assert preset_config("direct-dot-full", backbone="vl").stage1.epochs == 1.0
    with pytest.raises(ValueError, match="preset 'infonce-lora' needs steps="):
        preset_config("infonce-lora")
    with pytest.raises(ValueError, match="epochs must be a finite number > 0; got 0"):
        StageConfig(epochs=0)
    document = json.loads(preset_config("pace", stage1_steps=8, stage2_steps=4).save(tmp_path / "old").read_text())
    for stage in ("stage1", "stage2"):
        del document[stage]["epochs"]  # as saved before `epochs` existed
    assert PACEConfig.from_dict(document).stage1.epochs == 1.0

    config = tiny_config(tiny_bert_dir, toy_data, tmp_path, preset="direct-dot-full", stage1_steps=None, stage2_steps=None)
    config.stage1.epochs = 1.5
    result = train_pace(config)
    n_tuples = len(json.loads((tmp_path / "run" / "train_tuples.json").read_text())["tuples"])
    assert result.stages[0].steps_run == round(1.5 * -(-n_tuples // 4))
