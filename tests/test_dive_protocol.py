"""The protocol harness on a tiny random BERT and toy BEIR folders (no quality claims)."""

import json

import pytest

from conftest import write_beir
from embedtune.bench.dive_protocol import ProtocolExecutor, plan_phase_one, run_protocol
from embedtune.bench.dive_report import build_report
from embedtune.bench.grid import RunStore, run_grid
from embedtune.bench.protocol_config import BackboneSpec, DatasetSpec, ProtocolConfig, load_protocol_config
from embedtune.workflows.fit_and_score import assert_no_test_queries
from embedtune.workflows.experiment import load_experiment


def _toy(root, n_queries=20, offset=0):
    corpus = [{"_id": f"d{i}", "title": "", "text": f"document number {i + offset} about topic {i % 5}"} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": f"what about topic {i % 5} number {i + offset}"} for i in range(n_queries)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(n_queries)]
    return write_beir(root, corpus, queries, qrels)


def _config(tmp_path, model_dir, datasets, studies=("main",), methods=("frozen", "truncate", "pca", "dive")):
    return ProtocolConfig(
        datasets=datasets,
        backbones=[BackboneSpec("tiny", str(model_dir), (8,))],
        methods=list(methods),
        studies=list(studies),
        final_seeds=[2027, 2028],
        selection_seeds=[2027],
        n_negatives=2,
        head_values=[2, 4, 8],
        lr_candidates={"search-adaptor": [1e-4, 1e-3, 1e-2]},
        method_overrides={"dive": {"epochs": 1, "batch_size": 8}, "search-adaptor": {"epochs": 1, "batch_size": 8}},
        n_resamples=200,
        results_dir=str(tmp_path / "results"),
    )


def test_paper_config_file_loads():
    config = load_protocol_config("benchmarks/dive_paper.toml")
    assert [b.name for b in config.backbones] == ["minilm", "mpnet"]
    assert config.final_seeds == [2027, 2028, 2029] and config.fractions == (0.6, 0.2, 0.2)
    assert set(config.lr_candidates) == {"mrl-adaptor", "search-adaptor", "smec"}
    assert config.ablations["w/o contrast"] == {"view_weight": 0.0}


def test_lr_audit_needs_exactly_three_candidates(tmp_path):
    with pytest.raises(ValueError, match="exactly three"):
        ProtocolConfig(datasets=[DatasetSpec("a", "x")], backbones=[BackboneSpec("b", "m", (8,))], lr_candidates={"smec": [1e-4, 1e-3]})


def test_grid_runs_reports_and_resumes_after_crash(tmp_path, tiny_bert_dir):
    config = _config(tmp_path, tiny_bert_dir, [DatasetSpec("toy", str(_toy(tmp_path / "toy")))], studies=("main", "ablation", "heads"))
    store = RunStore(config.results_dir)
    specs = plan_phase_one(config)
    executor = ProtocolExecutor(config, store.root)
    calls = []

    def crashing(spec):
        if len(calls) == 3:
            raise KeyboardInterrupt("simulated kill")
        calls.append(spec.key)
        return executor(spec)

    with pytest.raises(KeyboardInterrupt):
        run_grid(specs, store, crashing, progress=False)
    assert len(list((store.root / "runs").rglob("*.json"))) == 3
    redone = []
    records = run_grid(specs, store, lambda spec: (redone.append(spec.key), executor(spec))[1], progress=False)
    assert len(redone) == len(specs) - 3 and not set(redone) & set(calls)
    assert len(records) == len(specs)
    # Frozen, truncate and PCA ignore the seed: one run each; DIVE runs every final seed.
    main = [r for r in records.values() if r["spec"]["stage"] == "test"]
    assert sorted(r["spec"]["method"] for r in main) == ["dive", "dive", "frozen", "pca", "truncate"]
    # d=32, k=8: H=2 and H=4 run; H=8 (k·H=64 > 32) is recorded as skipped, not crashed.
    heads = {r["spec"]["overrides"]["heads"]: r for r in records.values() if "heads:" in ",".join(r["spec"]["studies"])}
    assert "k·H" in heads[8]["skipped"] and "ndcg@10" in heads[4]["metrics"] and "ndcg@10" in heads[2]["metrics"]
    record = json.loads(store.path(specs[0]).read_text())
    assert {"config", "metrics", "per_query", "history", "fit_seconds", "wall_seconds"} <= set(record)
    report = build_report(config.results_dir, n_resamples=200).read_text()
    for section in ("Main comparison", "Ablation", "Head-count", "Significance", "Training dynamics"):
        assert section in report
    # Each ablation variant carries a paired test against DIVE in the same cell; DIVE itself has none.
    ablation = report.split("## 2. Ablation")[1].split("## 3.")[0]
    variant_rows = [line.split(" | ") for line in ablation.splitlines() if line.startswith("| ") and "w/o" in line]
    assert len(variant_rows) == 3 and all(0.0 <= float(row[-1].rstrip(" |")) <= 1.0 for row in variant_rows)
    dive_row = next(line for line in ablation.splitlines() if line.startswith("| ") and " | dive | " in line)
    assert dive_row.rstrip(" |").endswith("–")


def test_cqadupstack_communities_are_averaged_with_equal_weight(tmp_path, tiny_bert_dir):
    root = tmp_path / "cqadupstack"
    _toy(root / "android", n_queries=20)
    _toy(root / "gis", n_queries=10, offset=100)
    config = _config(tmp_path, tiny_bert_dir, [DatasetSpec("cqadupstack", str(root))], methods=("frozen",))
    config.final_seeds = [2027]
    records = run_protocol(config, progress=False)
    per_community = {r["spec"]["dataset"]: r["metrics"]["ndcg@10"] for r in records.values()}
    assert set(per_community) == {"cqadupstack/android", "cqadupstack/gis"}
    build_report(config.results_dir, n_resamples=100)
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    row = summary["main"]["tiny/cqadupstack/k8"]["frozen"]
    assert row["ndcg@10"] == pytest.approx((per_community["cqadupstack/android"] + per_community["cqadupstack/gis"]) / 2)
    assert row["communities"] == 2


def test_lr_audit_selects_on_validation_then_retrains_on_test(tmp_path, tiny_bert_dir):
    config = _config(tmp_path, tiny_bert_dir, [DatasetSpec("toy", str(_toy(tmp_path / "toy")))], studies=("lr_audit",),
                     methods=("search-adaptor",))
    records = run_protocol(config, progress=False)
    val = [r for r in records.values() if r["spec"]["stage"] == "val"]
    test = [r for r in records.values() if r["spec"]["stage"] == "test"]
    assert len(val) == 3 and len(test) == 2
    best = max(val, key=lambda r: r["metrics"]["ndcg@10"])
    chosen_lr = best["spec"]["overrides"]["learning_rate"]
    assert all(t["config"]["learning_rate"] == chosen_lr for t in test)


def test_selection_never_touches_test_queries(tmp_path, tiny_bert_dir):
    experiment = load_experiment(_toy(tmp_path / "toy"), str(tiny_bert_dir), encoder_options={"show_progress": False})
    assert_no_test_queries(experiment, ["train", "val"])
    leaky = type(experiment.split)(**{**experiment.split.__dict__, "val": experiment.split.val + experiment.split.test[:1]})
    experiment.split = leaky
    with pytest.raises(AssertionError, match="held-out test"):
        assert_no_test_queries(experiment, ["train", "val"])


def test_preset_selected_on_validation_then_scored_on_test_with_variants_and_report(tmp_path, tiny_bert_dir):
    from embedtune.bench.dive_protocol import select_preset

    config = _config(tmp_path, tiny_bert_dir, [DatasetSpec("toy", str(_toy(tmp_path / "toy")))], studies=("main", "variants", "preset"),
                     methods=("pca", "dive"))
    config.variants = {"pca-init": {"init": "pca"}}
    config.preset_candidates = {"paper": {}, "pca, m=0.2": {"init": "pca", "margin": 0.2}, "softplus": {"triplet_loss": "softplus"}}
    records = run_protocol(config, progress=False)
    candidates = [r for r in records.values() if any(t.startswith("candidate:") for t in r["spec"]["studies"])]
    assert len(candidates) == 3 and all(r["spec"]["stage"] == "val" for r in candidates)
    best, scores = select_preset(records)
    assert scores[best] == max(scores.values()) == max(r["metrics"]["ndcg@10"] for r in candidates)
    chosen = [r for r in records.values() if any(t.startswith("preset_best:") for t in r["spec"]["studies"])]
    assert sorted(r["spec"]["seed"] for r in chosen) == [2027, 2028] and all(r["spec"]["stage"] == "test" for r in chosen)
    assert all(f"preset_best:{best}" in r["spec"]["studies"] for r in chosen)
    variants = [r for r in records.values() if "variant:pca-init" in r["spec"]["studies"]]
    assert len(variants) == 2 and all(r["config"]["init"] == "pca" and r["spec"]["stage"] == "test" for r in variants)
    report = build_report(config.results_dir, n_resamples=200).read_text()
    for heading in ("## 8. DIVE variants", "## 9. Preset candidates", "## 10. The validation-selected preset"):
        assert heading in report
    assert f"Selected: **`{best}`**" in report


def test_beir_train_protocol_runs_on_train_qrels(tmp_path, tiny_bert_dir):
    root = _toy(tmp_path / "toy", n_queries=30)
    # q0..q19 judged in train.tsv, q20..q29 in test.tsv.
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(20)))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(20, 30)))
    config = _config(tmp_path, tiny_bert_dir, [DatasetSpec("toy", str(root))], methods=("frozen", "dive"))
    config.protocol = "beir-train"
    records = run_protocol(config, progress=False)
    assert {r["n_queries"] for r in records.values()} == {10}
    manifest = json.loads((tmp_path / "results" / "splits" / "toy.json").read_text())
    assert manifest["counts"] == {"train": 16, "val": 4, "test": 10} and manifest["qrels_split"] == "train+test"
    with pytest.raises(ValueError, match="protocol"):
        ProtocolConfig(datasets=[DatasetSpec("a", "x")], backbones=[BackboneSpec("b", "m", (8,))], protocol="other")


def test_selection_records_include_earlier_validation_runs_of_configured_cells_only(tmp_path):
    from embedtune.bench.dive_protocol import selection_records
    from embedtune.bench.grid import make_spec

    pa = str(_toy(tmp_path / "pa"))
    config = ProtocolConfig(datasets=[DatasetSpec("a", pa)], backbones=[BackboneSpec("b", "m", (8,))], results_dir=str(tmp_path))
    store = RunStore(tmp_path)
    kept = make_spec("a", pa, "b", "m", "val", "dive", 8, 2028, {"margin": 0.2}, "candidate:m")
    other_dataset = make_spec("z", "pz", "b", "m", "val", "dive", 8, 2028, {"margin": 0.2}, "candidate:m")
    test_run = make_spec("a", pa, "b", "m", "test", "dive", 8, 2028, {}, "main")
    for spec in (kept, other_dataset, test_run):
        store.save(spec, {"metrics": {"ndcg@10": 0.5}})
    merged = selection_records(config, store, {})
    assert set(merged) == {kept.key}


def test_one_seed_cell_shows_its_mean_without_a_made_up_std():
    from embedtune.bench.beyond_report import _mean_std
    from embedtune.bench.dive_report import _fmt

    # A sample std needs two seeds; printing "± 0.0000" for one would claim zero spread.
    assert _fmt(0.51234, 0.0, 1) == "0.5123"
    assert _fmt(0.51234, 0.01, 3) == "0.5123 ± 0.0100"
    assert _mean_std([{"metrics": {"ndcg@10": 0.4}}]) == "0.4000"
    assert _mean_std([{"metrics": {"ndcg@10": 0.4}}, {"metrics": {"ndcg@10": 0.6}}]) == "0.5000 ± 0.1414"


def _main_record(method, seed, overrides, ndcg):
    key = f"scifact/minilm/test/{method}/{','.join(f'{k}={v}' for k, v in overrides.items()) or 'default'}/k64-s{seed}"
    spec = {"backbone": "minilm", "dataset": "scifact", "dim": 64, "method": method, "seed": seed, "key": key,
            "overrides": overrides, "studies": ["main"]}
    return {"spec": spec, "metrics": {"ndcg@10": ndcg}}


def test_main_table_names_non_default_settings_and_refuses_mixed_configs():
    from embedtune.bench.dive_report import group_runs, settings_label

    assert settings_label("smec", {"epoch_budget": "total"}) == "smec (epoch_budget=total)"
    assert settings_label("dive", {"heads": "auto", "max_heads": 4}) == "dive"  # heads go in the H column
    assert settings_label("pca", {}) == "pca"
    one_config = [_main_record("smec", seed, {"epoch_budget": "total"}, 0.5) for seed in (1, 2)]
    assert len(group_runs(one_config, "main")) == 1
    # The same seed under two settings of one method: pooling them would mix the two configs.
    mixed = [*one_config, _main_record("smec", 1, {}, 0.6)]
    with pytest.raises(ValueError, match="own --results folder"):
        group_runs(mixed, "main")
