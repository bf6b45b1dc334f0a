"""`embedtune pipeline`: PACE, then compression of the fine-tuned embeddings, then held-out evaluation (tiny BERT)."""

from __future__ import annotations

import json

import pytest

from conftest import write_beir
from embedtune.finetune import preset_config
from embedtune.workflows.pipeline import RESULT_NAME, PipelineConfig, run_pipeline


@pytest.fixture
def toy_train_test(tmp_path):
    corpus = [{"_id": f"d{i}", "title": "", "text": f"document number {i} about topic {i % 5}"} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": f"what about topic {i % 5} number {i}"} for i in range(30)]
    root = write_beir(tmp_path / "toy", corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(20, 30)], split="test")
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(20)))
    return root


def _pace(tiny_bert_dir, data, **overrides):
    options = dict(stage1_steps=2, stage2_steps=1, stage2_init=1, model=str(tiny_bert_dir), data=str(data), batch_size=4,
                   n_negatives=2, hard_pool=5, save_steps=1, lora_rank=4, auto_temperature_samples=4)
    options.update(overrides)
    return preset_config("pace", **options)


def test_pipeline_finetunes_compresses_evaluates_and_resumes(tiny_bert_dir, toy_train_test, tmp_path, monkeypatch):
    config = PipelineConfig(methods=["dive", "pca"], dim=8, seeds=[2027], dive_preset="paper",
                            compressor_overrides={"dive": {"epochs": 1, "batch_size": 8}},
                            variants={"norm-preserving": {"method": "dive", "output_norm": "input", "epochs": 1, "batch_size": 8}})
    result = run_pipeline(_pace(tiny_bert_dir, toy_train_test), config, tmp_path / "run")
    assert result["similarity"] == "dot"
    rows = result["rows"]
    assert {(r["model"], r["method"], r["variant"]) for r in rows} == {
        (model, method, variant) for model in ("finetuned", "base")
        for method, variant in (("full", ""), ("dive", ""), ("pca", ""), ("dive", "norm-preserving"))
    }
    # A seed shaped only DIVE's rows: the uncompressed model and PCA (seed-free, run once) name none.
    assert all(("seed" in r) == (r["method"] == "dive") for r in rows)
    assert {r["dim"] for r in rows if r["method"] == "full"} == {32} and {r["dim"] for r in rows if r["method"] != "full"} == {8}
    # Every row is scored on the 10 judged test queries only; PACE and the compressors saw q0..q19.
    assert {r["n_queries"] for r in rows} == {10}
    saved = json.loads((tmp_path / "run" / RESULT_NAME).read_text())
    assert RESULT_NAME == "results.json" and saved["task"] == "pipeline" and saved["details"]["rows"] == rows
    assert not (tmp_path / "run" / "pipeline_result.json").exists()
    # Per-query scores make the paired tests possible: each method vs DIVE, and fine-tuned vs base.
    assert all(len(r["per_query_ndcg@10"]) == 10 for r in rows)
    pairs = {(c["a"], c["b"]) for c in result["comparisons"]}
    assert ("finetuned: pca", "finetuned: dive") in pairs and ("base: full", "base: dive") in pairs
    assert ("finetuned: dive (norm-preserving)", "base: dive (norm-preserving)") in pairs
    assert len(pairs) == 2 * 3 + 4
    for c in result["comparisons"]:
        assert 0 < c["p_value"] <= 1 and c["ci_low"] <= c["difference"] <= c["ci_high"] and c["n_queries"] == 10
        assert c["difference"] == pytest.approx(c["mean_a"] - c["mean_b"])

    # Seen and unseen: relative to the train qrels; the paired tests repeat on each subset.
    counts = result["subsets"]["counts"]
    assert counts["seen"] + counts["unseen"] + counts["mixed"] == 10
    for row in rows:
        for subset in ("seen", "unseen"):
            assert (row[f"ndcg@10_{subset}"] is None) == (counts[subset] == 0)
    for subset in ("seen", "unseen"):
        assert all(c["n_queries"] == counts[subset] for c in result["subsets"][subset])

    # A second run reuses the fine-tuning instead of training again.
    monkeypatch.setattr("embedtune.workflows.pipeline.train_pace", lambda *a, **k: pytest.fail("fine-tuning should have been reused"))
    again = run_pipeline(_pace(tiny_bert_dir, toy_train_test), config, tmp_path / "run")
    def scores(rows):
        return [{k: v for k, v in row.items() if k != "fit_seconds"} for row in rows]

    assert scores(again["rows"]) == scores(rows)  # same split, triplets and seeds: same metrics
    with pytest.raises(ValueError, match="another recipe"):
        run_pipeline(_pace(tiny_bert_dir, toy_train_test, stage2_steps=2), config, tmp_path / "run")


def test_pipeline_rejects_training_on_the_test_split(tiny_bert_dir, toy_train_test, tmp_path):
    with pytest.raises(ValueError, match="test split"):
        run_pipeline(_pace(tiny_bert_dir, toy_train_test, train_split="test"), PipelineConfig(dim=8), tmp_path / "run")
    with pytest.raises(ValueError, match="compressor"):
        PipelineConfig(methods=[])


@pytest.mark.slow
def test_pipeline_cli_applies_the_dive_preset(tiny_bert_dir, toy_train_test, tmp_path, capsys):
    from embedtune.cli import build_parser, main

    # One default preset across commands: robust, as in `compress train`.
    from embedtune.cli.pipeline import configs_from_args

    assert configs_from_args(build_parser().parse_args(["pipeline", "--out", "x"]))[1].dive_preset == "robust"
    code = main(["pipeline", "--model", str(tiny_bert_dir), "--data", str(toy_train_test), "--out", str(tmp_path / "run"),
                 "--stage1-steps", "2", "--stage2-steps", "1", "--stage2-init", "1", "--batch-size", "4", "--dim", "8",
                 "--methods", "dive", "--dive-preset", "best", "--no-base", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pipeline_config"]["dive_preset"] == "best"
    assert [r["method"] for r in result["rows"]] == ["full", "dive"]
