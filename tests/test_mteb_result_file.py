"""The MTEB-format file (``OUT/mteb/<Task>.json``): the full retrieval metric set, from fine-tuning as from
``evaluate``, and a stated ``mteb_version`` (the installed mteb's, or the format release with the reason)."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from embedtune.cli import main
from embedtune.workflows.results import MTEB_FORMAT_VERSION, installed_mteb_version, write_mteb_result

# What MTEB writes for a retrieval task, at the cutoffs a top-100 run can score.
MTEB_RETRIEVAL = {f"{m}_at_{k}" for m in ("ndcg", "map", "recall", "precision", "mrr") for k in (1, 3, 5, 10, 20, 100)}


def test_finetune_writes_the_metrics_evaluate_writes(toy40, tiny_bert_dir, tmp_path, capsys, one_torch_thread):
    out = tmp_path / "ft"
    assert main(["finetune", "pace", "--preset", "direct-dot-full", "--steps", "1", "--model", str(tiny_bert_dir), "--data", str(toy40),
                 "--train-split", "test", "--batch-size", "4", "--n-negatives", "2", "--hard-pool", "5", "--evaluate-split", "test",
                 "--out", str(out)]) == 0
    tuned = json.loads((out / "mteb" / "toy40.json").read_text())
    scores = tuned["scores"]["test"][0]
    assert MTEB_RETRIEVAL <= set(scores) and "ndcg_at_1000" not in scores and scores["main_score"] == scores["ndcg_at_10"]
    results = json.loads((out / "results.json").read_text())
    assert scores["ndcg_at_10"] == pytest.approx(results["metrics"]["ndcg_at_10"])
    assert set(results["per_query"][next(iter(results["per_query"]))]) == {"ndcg_at_10", "recall_at_10", "recall_at_100",
                                                                          "precision_at_1", "mrr_at_10"}  # per query: the defaults
    # The same model through `evaluate`: the same metrics, the same values.
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(toy40), "--out", str(tmp_path / "ev")]) == 0
    evaluated = json.loads((tmp_path / "ev" / "mteb" / "toy40.json").read_text())["scores"]["test"][0]
    assert set(evaluated) == set(scores)
    for name in MTEB_RETRIEVAL:
        assert scores[name] == pytest.approx(evaluated[name], abs=1e-6), name
    assert isinstance(tuned["mteb_version"], str) and tuned["mteb_version_source"] and "embedtune" in tuned["written_by"]


def test_mteb_version_is_the_installed_one_or_says_why_not(tmp_path, monkeypatch):
    real_version = importlib.metadata.version

    def without_mteb(name):
        if name == "mteb":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", without_mteb)
    version, source = installed_mteb_version()
    assert version == MTEB_FORMAT_VERSION and "mteb is not installed" in source and "written by embedtune in MTEB's layout" in source
    document = json.loads(write_mteb_result(tmp_path, "scifact", "test", {"ndcg@10": 0.5}).read_text())
    assert document["mteb_version"] == MTEB_FORMAT_VERSION and document["mteb_version_source"] == source
    assert document["written_by"].startswith("embedtune ") and "MTEB itself did not run" in document["written_by"]
    assert document["task_name"] == "SciFact" and document["scores"]["test"][0]["main_score"] == 0.5

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.8.7" if name == "mteb" else real_version(name))
    document = json.loads(write_mteb_result(tmp_path, "scifact", "test", {"ndcg@10": 0.5}).read_text())
    assert document["mteb_version"] == "9.8.7" and document["mteb_version_source"] == "the installed mteb"
