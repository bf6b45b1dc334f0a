import json

import numpy as np

from embedtune.cli import main
from embedtune.compress import load_compressor


def test_compress_train_apply_export(toy40, tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["compress", "train", "--method", "dive", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
                 "--preset", "best", "--heads", "auto", "--epochs", "2", "--set", "batch_size=8", "--compare", "frozen,truncate,pca",
                 "--seeds", "2027", "2028", "--out", str(out), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["results"]) == {"dive", "frozen", "truncate", "pca", "pca-uncentred"}  # the other PCA variant is added
    assert report["results"]["dive"]["summary"]["seeds"] == [2027, 2028]
    assert report["results"]["frozen"]["summary"]["dim"] == 32
    assert len(report["results"]["dive"]["history_seed0"]) == 2
    assert (out / "triplets-train.json").is_file() and json.loads((out / "results.json").read_text())["details"] == report
    # Several seeds: one folder per seed; seed-free methods ran once, so they have no seed folder.
    adapter = out / "dive" / "seed-2027"
    assert (adapter / "training_log.jsonl").read_text().count("\n") == 2
    assert (out / "dive" / "seed-2028" / "config.json").is_file() and (out / "pca" / "config.json").is_file()

    vectors = np.random.default_rng(0).normal(size=(50, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", vectors)
    assert main(["compress", "apply", "--adapter", str(adapter), "--input", str(tmp_path / "x.npy"),
                 "--out", str(tmp_path / "y.npy"), "--chunk-size", "7"]) == 0
    capsys.readouterr()
    # The old --output still works, with a one-line deprecation warning.
    assert main(["compress", "apply", "--adapter", str(adapter), "--input", str(tmp_path / "x.npy"),
                 "--output", str(tmp_path / "y2.npy")]) == 0
    assert "--output is deprecated" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(tmp_path / "y2.npy"), np.load(tmp_path / "y.npy"))
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
    from embedtune.compress import DIVECompressor, Preset

    monkeypatch.setitem(DIVECompressor.presets, "test-preset", Preset("test-preset", {"init": "pca", "margin": 0.3}))
    code = main(["compress", "train", "--method", "dive", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
                 "--preset", "test-preset", "--epochs", "1", "--set", "batch_size=8", "--set", "margin=0.5", "--compare", "",
                 "--out", str(tmp_path / "run"), "--json"])
    assert code == 0
    capsys.readouterr()
    config = load_compressor(tmp_path / "run" / "dive").config  # one seed: no seed folder
    assert config.init == "pca" and config.margin == 0.5  # --set overrides the preset
    assert load_compressor(tmp_path / "run").config == config  # the --out folder holds exactly one
    assert main(["compress", "train", "--method", "dive", "--data", str(toy40), "--model", str(tiny_bert_dir), "--preset", "nope"]) == 2
    assert "unknown" in capsys.readouterr().err
    assert main(["compress", "train", "--method", "pca", "--data", str(toy40), "--model", str(tiny_bert_dir), "--preset", "paper"]) == 2
    assert "pca has no preset by that name" in capsys.readouterr().err


def test_dive_defaults_to_the_robust_preset_and_paper_is_one_flag_away(toy40, tiny_bert_dir, tmp_path, capsys):
    from embedtune.compress import ROBUST
    from embedtune.compress.dive import DIVEConfig

    common = ["compress", "train", "--method", "dive", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
              "--epochs", "1", "--set", "batch_size=8", "--compare", "", "--json"]
    # A random tiny model ranks every positive last, so the default filter drops every candidate: a clear error.
    assert main([*common, "--out", str(tmp_path / "filtered")]) == 2
    assert "--false-negative-margin none" in capsys.readouterr().err
    assert main([*common, "--false-negative-margin", "-1.0", "--out", str(tmp_path / "default")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["preset"] == "robust"
    expected = {**ROBUST.mining.non_default(), "false_negative_margin": -1.0}
    assert {k: report["triplets"][k] for k in expected} == expected
    config = load_compressor(tmp_path / "default" / "dive").config
    assert all(getattr(config, k) == v for k, v in DIVEConfig.PRESETS["robust"].items())
    assert config.init == "pca" and config.margin == 0.4 and config.epoch_selection == "best"

    assert main([*common, "--preset", "paper", "--out", str(tmp_path / "paper")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "false_negative_margin" not in report["triplets"] and "max_triplets_per_query" not in report["triplets"]
    paper = load_compressor(tmp_path / "paper" / "dive").config
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
    header = next(line for line in one_seed.splitlines() if "nDCG@10" in line and "B/vector" in line)
    assert header.index("dim") < header.index("B/vector") and " 32 " in one_seed  # 8 float32 dims: 32 bytes per vector
    assert main([*base, "--seeds", "2027", "2028"]) == 0
    two_seeds = capsys.readouterr().out
    assert "seeds [2027]" in two_seeds and "±" not in two_seeds  # PCA ignores the seed: it runs once, so it has no spread


def test_adapter_accepts_the_out_folder_only_when_it_holds_one_compressor(toy40, tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["compress", "train", "--method", "pca", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
                 "--compare", "truncate", "--out", str(out)]) == 0
    np.save(tmp_path / "x.npy", np.ones((3, 32), np.float32))
    capsys.readouterr()
    assert main(["compress", "apply", "--adapter", str(out), "--input", str(tmp_path / "x.npy"), "--out", str(tmp_path / "y.npy")]) == 2
    err = capsys.readouterr().err
    assert "holds 2 fitted compressors" in err and str(out / "pca") in err and str(out / "truncate") in err


def test_lists_take_spaces_or_commas():
    from embedtune.cli import build_parser

    parser = build_parser()
    spaced = parser.parse_args(["compress", "train", "--compare", "frozen", "pca", "--seeds", "1", "2"])
    commas = parser.parse_args(["compress", "train", "--compare", "frozen,pca", "--seeds", "1,2"])
    assert spaced.compare == commas.compare == ["frozen", "pca"] and spaced.seeds == commas.seeds == [1, 2]
    assert parser.parse_args(["compress", "train", "--compare", ""]).compare == []


def test_bench_is_a_deprecated_alias_of_benchmark(capsys):
    from embedtune.cli import build_parser, main

    args = build_parser().parse_args(["bench", "dive", "--config", "x.toml"])
    assert args.handler.__name__ == "run_benchmark_dive"
    assert main(["bench", "dive", "--config", "does-not-exist.toml"]) == 2
    err = capsys.readouterr().err
    assert "`embedtune bench` is deprecated" in err and "does-not-exist.toml" in err


def test_importing_the_compress_cli_does_not_import_bench():
    import subprocess
    import sys

    code = "import embedtune.cli.compress, sys; assert not any(m.startswith('embedtune.bench') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
