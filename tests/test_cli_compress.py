import json

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.compress import load_compressor


@pytest.fixture
def toy40(tmp_path):
    from conftest import write_beir

    corpus = [{"_id": f"d{i}", "text": f"document number {i} about topic {i % 5}"} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": f"what about topic {i % 5} number {i}"} for i in range(20)]
    return write_beir(tmp_path / "toy40", corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(20)])


def test_compress_train_apply_export(toy40, tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["compress", "train", "--method", "dive", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
                 "--preset", "best", "--heads", "auto", "--epochs", "2", "--set", "batch_size=8", "--compare", "frozen,truncate,pca",
                 "--seeds", "2027", "2028", "--out", str(out), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["results"]) == {"dive", "frozen", "truncate", "pca"}
    assert report["results"]["dive"]["summary"]["seeds"] == [2027, 2028]
    assert report["results"]["frozen"]["summary"]["dim"] == 32
    assert len(report["results"]["dive"]["history_seed0"]) == 2
    assert (out / "triplets-train.json").is_file() and (out / "report.json").is_file()
    adapter = out / "dive" / "seed-2027"
    assert (adapter / "training_log.jsonl").read_text().count("\n") == 2

    vectors = np.random.default_rng(0).normal(size=(50, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", vectors)
    assert main(["compress", "apply", "--adapter", str(adapter), "--input", str(tmp_path / "x.npy"),
                 "--output", str(tmp_path / "y.npy"), "--chunk-size", "7"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), load_compressor(adapter).transform(vectors), atol=1e-6)

    capsys.readouterr()
    assert main(["compress", "export", "--adapter", str(adapter), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "st")]) == 0
    from sentence_transformers import SentenceTransformer

    exported = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    base = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    texts = ["document number 3", "topic 2"]
    np.testing.assert_allclose(exported.encode(texts), load_compressor(adapter).transform(base.encode(texts)), atol=1e-5)


def test_unknown_setting_and_method_fail_cleanly(toy40, tiny_bert_dir, capsys):
    assert main(["compress", "train", "--method", "nope", "--data", str(toy40), "--model", str(tiny_bert_dir)]) == 2
    assert "unknown compression method 'nope'" in capsys.readouterr().err
    assert main(["compress", "train", "--method", "pca", "--data", str(toy40), "--model", str(tiny_bert_dir), "--set", "margin=0.3",
                 "--compare", ""]) == 2
    assert "pca has no setting 'margin'" in capsys.readouterr().err


def test_dim_times_heads_error_names_both_fixes(toy40, tiny_bert_dir, capsys):
    code = main(["compress", "train", "--method", "dive", "--data", str(toy40), "--model", str(tiny_bert_dir), "--dim", "16",
                 "--heads", "4", "--compare", "", "--preset", "best"])
    assert code == 2
    err = capsys.readouterr().err
    assert "heads" in err and "dim" in err


def test_preset_flag_applies_dive_presets_and_rejects_bad_use(toy40, tiny_bert_dir, tmp_path, capsys, monkeypatch):
    from embedtune.compress.dive import DIVEConfig

    monkeypatch.setitem(DIVEConfig.PRESETS, "test-preset", {"init": "pca", "margin": 0.3})
    code = main(["compress", "train", "--method", "dive", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
                 "--preset", "test-preset", "--epochs", "1", "--set", "batch_size=8", "--set", "margin=0.5", "--compare", "",
                 "--out", str(tmp_path / "run"), "--json"])
    assert code == 0
    capsys.readouterr()
    config = load_compressor(tmp_path / "run" / "dive" / "seed-2027").config
    assert config.init == "pca" and config.margin == 0.5  # --set overrides the preset
    assert main(["compress", "train", "--method", "dive", "--data", str(toy40), "--model", str(tiny_bert_dir), "--preset", "nope"]) == 2
    assert "unknown" in capsys.readouterr().err
    assert main(["compress", "train", "--method", "pca", "--data", str(toy40), "--model", str(tiny_bert_dir), "--preset", "paper"]) == 2
    assert "DIVE preset" in capsys.readouterr().err


def test_dive_defaults_to_the_robust_preset_and_paper_is_one_flag_away(toy40, tiny_bert_dir, tmp_path, capsys):
    from embedtune.cli.compress import MINING_PRESETS
    from embedtune.compress.dive import DIVEConfig

    common = ["compress", "train", "--method", "dive", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
              "--epochs", "1", "--set", "batch_size=8", "--compare", "", "--json"]
    # A random tiny model ranks every positive last, so the default filter drops every candidate: a clear error.
    assert main([*common, "--out", str(tmp_path / "filtered")]) == 2
    assert "--false-negative-margin none" in capsys.readouterr().err
    assert main([*common, "--false-negative-margin", "-1.0", "--out", str(tmp_path / "default")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dive_preset"] == "robust"
    expected = {**MINING_PRESETS["robust"], "false_negative_margin": -1.0}
    assert {k: report["triplets"][k] for k in expected} == expected
    config = load_compressor(tmp_path / "default" / "dive" / "seed-2027").config
    assert all(getattr(config, k) == v for k, v in DIVEConfig.PRESETS["robust"].items())
    assert config.init == "pca" and config.margin == 0.4 and config.epoch_selection == "best"

    assert main([*common, "--preset", "paper", "--out", str(tmp_path / "paper")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "false_negative_margin" not in report["triplets"] and "max_triplets_per_query" not in report["triplets"]
    paper = load_compressor(tmp_path / "paper" / "dive" / "seed-2027").config
    assert (paper.init, paper.margin, paper.epoch_selection) == ("identity", 0.7, "last")

    # Explicit flags beat the preset; 'none' turns a filter off.
    assert main([*common, "--false-negative-margin", "none", "--max-triplets-per-query", "3", "--out", str(tmp_path / "mixed")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "false_negative_margin" not in report["triplets"] and report["triplets"]["max_triplets_per_query"] == 3


def test_text_table_prints_a_spread_only_with_several_seeds(toy40, tiny_bert_dir, capsys):
    base = ["compress", "train", "--method", "pca", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8"]
    assert main([*base, "--seeds", "2027"]) == 0
    one_seed = capsys.readouterr().out
    assert "pca" in one_seed and "±" not in one_seed
    assert main([*base, "--seeds", "2027", "2028"]) == 0
    assert "± 0.0000" in capsys.readouterr().out  # PCA ignores the seed: two identical runs, zero spread
