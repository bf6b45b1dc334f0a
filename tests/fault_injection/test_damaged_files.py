"""Damaged files never give a different number: each load gives the intact result or a clear error.

Random bytes overwritten, or the file cut short, in a saved adapter (PCA and DIVE; weights and
config), an embedding-cache entry, a benchmark run record and a FAISS index (flat, SQ8, binary):
50 seeds of each. Plan folders (plan.json, precision.json, the int8 calibration, the compressor),
a plan's cached FAISS files, embed-corpus shard folders (read back, and resumed), exported model
folders (their precision files and compressor copy) and the embedding cache's partial shards get
two more kinds of damage: a JSON field edited with its digests recomputed, and a file swapped in
from another run; those must be caught by the files' agreement with each other.
``benchmarks/fault_injection.py`` runs the same trials at larger counts.
"""

from __future__ import annotations

import pytest

import faults

SEEDS = range(50)


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("artefacts")
    return {
        "adapter (pca)": faults.AdapterArtefact(root, "pca"),
        "adapter (dive)": faults.AdapterArtefact(root, "dive"),
        "cache entry": faults.CacheArtefact(root),
        "run record": faults.RecordArtefact(root),
    }


@pytest.mark.parametrize("damage", faults.DAMAGE)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("artefact", ["adapter (pca)", "adapter (dive)", "cache entry", "run record"])
def test_a_damaged_file_gives_the_intact_result_or_a_clear_error(artefacts, artefact, seed, damage, tmp_path):
    trial = artefacts[artefact].trial(damage, seed, tmp_path / "scratch")
    assert trial.outcome in ("clear error", "identical"), trial


@pytest.mark.parametrize("damage", faults.DAMAGE)
def test_a_damaged_faiss_index_never_reaches_faiss(damage, tmp_path):
    """Run in worker processes: a crash inside FAISS would be recorded as an unclear failure, not kill the tests."""
    spec = faults.build_indexes(tmp_path)
    trials = faults.run_index_trials(spec, [(kind, damage, seed) for kind in faults.INDEX_KINDS for seed in SEEDS], tmp_path)
    assert len(trials) == len(faults.INDEX_KINDS) * len(SEEDS)
    bad = [trial for trial in trials if trial.outcome not in ("clear error", "identical")]
    assert not bad, bad[:5]
    assert {trial.file for trial in trials} >= {"index.faiss", "ids.txt", "manifest.json"}


@pytest.fixture(scope="module")
def deploy_artefacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy-artefacts")
    return {"plan folder": faults.PlanArtefact(root), "cached FAISS file": faults.FaissCacheArtefact(root),
            "embedding shards": faults.ShardArtefact(root)}


@pytest.mark.parametrize("damage", faults.ALL_DAMAGE)
@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("artefact", ["plan folder", "cached FAISS file", "embedding shards"])
def test_a_damaged_edited_or_swapped_deploy_file_gives_the_intact_result_or_a_clear_error(deploy_artefacts, artefact, seed, damage,
                                                                                          tmp_path):
    trial = deploy_artefacts[artefact].trial(damage, seed, tmp_path / "scratch")
    assert trial.outcome in ("clear error", "identical"), trial


@pytest.mark.parametrize("damage", faults.EDITS)
def test_an_edited_or_swapped_index_file_never_gives_other_hits(damage, tmp_path):
    spec = faults.build_indexes(tmp_path)
    trials = faults.run_index_trials(spec, [(kind, damage, seed) for kind in faults.INDEX_KINDS for seed in range(25)], tmp_path)
    bad = [trial for trial in trials if trial.outcome not in ("clear error", "identical")]
    assert not bad, bad[:5]


@pytest.fixture(scope="module")
def resumed_artefacts(tmp_path_factory, tiny_bert_dir):
    root = tmp_path_factory.mktemp("resumed-artefacts")
    return {"exported model": faults.ExportedModelArtefact(root, tiny_bert_dir), "cache partial shard": faults.CachePartialArtefact(root),
            "embedding shards (resumed)": faults.ShardResumeArtefact(root)}


@pytest.mark.parametrize("damage", faults.ALL_DAMAGE)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("artefact", faults.NEW_ARTEFACTS)
def test_a_damaged_exported_model_partial_shard_or_resumed_shard_folder_never_gives_another_number(resumed_artefacts, artefact, seed,
                                                                                                    damage, tmp_path):
    trial = resumed_artefacts[artefact].trial(damage, seed, tmp_path / "scratch")
    assert trial.outcome in ("clear error", "identical"), trial
