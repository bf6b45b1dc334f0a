"""fit_compressor, the library function behind `compress train`: presets, seeds, output layout."""

from __future__ import annotations

import json

import pytest

from embedtune.compress import ROBUST, MiningOptions, Preset, get_compressor_class, load_compressor
from embedtune.workflows import fit_compressor, load_experiment
from embedtune.workflows.train_compressor import compressor_dir, resolve_preset


@pytest.fixture
def experiment(toy40, tiny_bert_dir):
    return load_experiment(toy40, str(tiny_bert_dir))


def test_seed_free_methods_run_once_and_land_without_a_seed_folder(experiment, tmp_path):
    result = fit_compressor(experiment, "pca", 8, seeds=[1, 2], compare=["autoencoder"], settings={},
                            out=tmp_path / "run")
    assert result.summaries["pca"]["seeds"] == [1]  # PCA does not depend on the seed
    assert result.summaries["autoencoder"]["seeds"] == [1, 2]
    assert (tmp_path / "run" / "pca" / "config.json").is_file()
    assert (tmp_path / "run" / "autoencoder" / "seed-2" / "config.json").is_file()
    assert result.report["preset"] == "defaults" and "triplets" not in result.report
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["task"] == "compress train" and saved["command"] is None and saved["details"]["preset"] == "defaults"
    assert not (tmp_path / "run" / "report.json").exists()


def test_presets_are_objects_or_names_and_carry_their_mining(experiment, tmp_path):
    assert resolve_preset("dive", None) is ROBUST is resolve_preset("dive", "robust")
    assert ROBUST.mining.max_triplets_per_query == 32 and ROBUST.settings["epoch_selection"] == "best"
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        resolve_preset("dive", "nope")
    quick = Preset("quick", {"epochs": 1, "batch_size": 8, "progress": False}, MiningOptions(max_triplets_per_query=2))
    result = fit_compressor(experiment, "dive", 8, preset=quick, out=tmp_path / "run")
    assert result.report["triplets"]["max_triplets_per_query"] == 2 and result.report["preset"] == "quick"
    fitted = load_compressor(tmp_path / "run")  # one compressor: the --out folder is enough
    assert fitted.config.epochs == 1 and result.summaries["dive"]["heads"] == fitted.heads_
    # A mapping changes the preset's mining; MiningOptions validates it.
    with pytest.raises(ValueError, match="max_triplets_per_query"):
        fit_compressor(experiment, "dive", 8, preset=quick, mining={"max_triplets_per_query": 0})


def test_output_layout():
    assert compressor_dir("OUT", "dive", 2027, 1).as_posix() == "OUT/dive"
    assert compressor_dir("OUT", "dive", 2027, 3).as_posix() == "OUT/dive/seed-2027"
    assert get_compressor_class("dive").default_preset == "robust"
