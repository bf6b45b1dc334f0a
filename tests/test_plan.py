"""compress plan: frontier and choice, the deployable folder, and plan -> export -> index round trips (tiny synthetic data)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_toy_vectors
from embedtune.cli import main
from embedtune.compress import available_methods, get_compressor_class, register
from embedtune.index import load_index
from embedtune.index.codecs import Calibration, Precision, QuantizedIndex
from embedtune.index.deployment import deployment_recipe
from embedtune.index.plan_format import load_plan
from embedtune.index.planned import build_planned_index
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.frontier_plot import plot_frontier
from embedtune.workflows.pareto import best_within, choose, pareto_frontier
from embedtune.workflows.plan import Candidate, method_settings, peer_factories, run_plan, score_plan, sweep_dims

D = 24


@pytest.fixture
def toy(tmp_path):
    """60 docs, 40 queries each judged relevant to one doc, and their 24-d vectors on disk."""
    return write_toy_vectors(tmp_path, dim=D)


def _experiment(toy):
    root, files = toy
    return load_experiment(root, doc_embeddings=files["doc"][0], doc_ids=files["doc"][1],
                           query_embeddings=files["query"][0], query_ids=files["query"][1])


def test_frontier_and_choice_rules():
    rows = [{"setting": "a", "ram_bytes": 16, "ndcg@10": 0.5}, {"setting": "b", "ram_bytes": 32, "ndcg@10": 0.45},
            {"setting": "c", "ram_bytes": 48, "ndcg@10": 0.6}, {"setting": "d", "ram_bytes": 16, "ndcg@10": 0.4},
            {"setting": "e", "ram_bytes": 384, "ndcg@10": 0.62}]
    assert [r["setting"] for r in pareto_frontier(rows)] == ["a", "c", "e"]
    assert best_within(rows, 40)["setting"] == "a" and best_within(rows, 8) is None
    assert choose(rows, budget_bytes=48)["setting"] == "c"
    assert choose(rows, target_retention=0.95, reference=0.62)["setting"] == "c"  # the cheapest >= 0.589
    assert choose(rows, target_retention=0.8, reference=0.62)["setting"] == "a"
    with pytest.raises(ValueError, match="no setting keeps 0.990"):
        choose(rows, budget_bytes=48, target_retention=0.99, reference=0.62)
    with pytest.raises(ValueError, match="no setting fits 8"):
        choose(rows, budget_bytes=8)
    with pytest.raises(ValueError, match="budget"):
        choose(rows)
    assert sweep_dims(384) == [384, 192, 128, 64, 32]
    assert peer_factories(384, [16, 48], ("pq", "opq", "pq-fs")) == ["PQ16", "OPQ16,PQ16", "PQ32x4fs", "PQ48", "OPQ48,PQ48", "PQ96x4fs"]
    # Fewer than 4 points per 8-bit centroid (1,024 documents): only the 4-bit fast-scan peers are trained.
    assert peer_factories(384, [16, 48], ("pq", "opq", "pq-fs"), n_train=1023) == ["PQ32x4fs", "PQ96x4fs"]
    assert peer_factories(384, [16], ("pq", "opq", "pq-fs"), n_train=5183) == ["PQ16", "OPQ16,PQ16", "PQ32x4fs"]  # SciFact keeps them
    assert Candidate("dive", 128, "qat-binary", (("quantization_aware", "binary"),)).name == "dive+qat-binary-128"


def test_wide_output_settings_are_a_registry_trait():
    """DIVE's one-head rule above d/2 comes from its trait, not from a method name in the plan."""
    assert get_compressor_class("dive").wide_output_settings == {"heads": 1, "view_weight": 0.0}
    assert method_settings("dive", 16, 24) == {"heads": 1, "view_weight": 0.0} and method_settings("dive", 12, 24) == {}
    assert method_settings("pca", 16, 24) == {}

    class Toy(get_compressor_class("truncate")):
        method = "toy-wide"
        wide_output_settings = {"no_such_field": 1}

    with pytest.raises(ValueError, match="no_such_field"):
        register(Toy)
    assert "toy-wide" not in available_methods()


def test_plot_frontier_writes_a_png(tmp_path):
    rows = [{"setting": f"s{i}", "ram_bytes": 2 ** i, "ndcg@10": 0.1 * i, "family": "x" if i % 2 else "y"} for i in range(1, 6)]
    path = plot_frontier(rows, tmp_path / "f.png", "t", chosen=rows[2])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("precision", ["int8", "binary-rescore", "binary-asym", "float16"])
def test_plan_export_index_round_trip(toy, tmp_path, precision):
    experiment = _experiment(toy)
    out = tmp_path / "plan"
    plan = run_plan(experiment, out, budget_bytes=4 * D, methods=["truncate", "pca"], dims=[16, 8], precisions=[precision], peers=[],
                    final=True, rounds=1, allow_disk=precision == "binary-rescore")  # a disk-rescore precision is chosen only when allowed
    assert plan["chosen"]["ram_bytes"] <= 4 * D and plan["precision"]["name"] in (precision, "float32")
    assert plan["test"]["n_queries"] == len(experiment.split.test)
    assert {r["queries"] for r in plan["sweep"]} == {"val"}  # the sweep never saw a test query
    assert (out / "frontier.png").is_file() and (out / "compressor" / "config.json").is_file()
    info, compressor, chosen, calibration = load_plan(out)
    assert (calibration is not None) == (chosen.name == "int8")
    assert info["deployment"] == deployment_recipe(chosen, info["dim"])  # FAISS and LanceDB settings of the choice
    # The index built from the plan searches exactly as the plan scored it (same codes, same ranges).
    index_dir = build_planned_index(toy[1]["doc"][0], tmp_path / "index", out, ids=toy[1]["doc"][1])
    index = load_index(index_dir)
    assert index.manifest["plan"]["precision"] == chosen.name and index.dim == info["dim"]
    queries = compressor.transform(experiment.embeddings.queries(experiment.split.test))
    docs = compressor.transform(experiment.embeddings.doc_embeddings)
    D_plan, I_plan = QuantizedIndex.build(docs, chosen, calibration=calibration).search(queries, 10)
    D_index, I_index = index.search(queries, 10)
    assert np.array_equal(I_plan, I_index)
    np.testing.assert_allclose(D_plan, D_index, rtol=1e-5, atol=1e-6)
    if chosen.name == "int8":
        saved = index.manifest["plan"]["calibration"]
        assert np.array_equal(np.array(saved["vmin"], np.float32), calibration.vmin)
        assert np.array_equal(calibration.vmin, Calibration.fit(docs).vmin)  # calibrated on the corpus
    assert score_plan(experiment, out, "test")["ndcg@10"] == plan["test"]["ndcg@10"]


def test_plan_cli_then_index_build_plan(toy, tmp_path, capsys):
    root, files = toy
    common = ["--data", str(root), "--doc-embeddings", str(files["doc"][0]), "--doc-ids", str(files["doc"][1]),
              "--query-embeddings", str(files["query"][0]), "--query-ids", str(files["query"][1])]
    out = tmp_path / "plan"
    assert main(["compress", "plan", *common, "--target-retention", "0.9", "--methods", "truncate", "pca", "--dims", "16", "8",
                 "--precisions", "float32", "int8", "binary-asym", "--peers", "", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Pareto frontier" in printed and "chosen:" in printed
    plan = json.loads((out / "plan.json").read_text())
    assert plan["retention"] >= 0.9 and "test" not in plan
    # Re-entering the folder reuses it; the index build follows the plan, and --plan excludes --kind.
    assert main(["compress", "plan", *common, "--budget-bytes", "8", "--methods", "truncate", "--dims", "8", "--precisions", "int8",
                 "--peers", "", "--out", str(out)]) == 0
    assert json.loads((out / "plan.json").read_text())["precision"]["name"] == "int8"
    capsys.readouterr()
    assert main(["index", "build", "--plan", str(out), "--embeddings", str(files["doc"][0]), "--ids", str(files["doc"][1]),
                 "--out", str(tmp_path / "index")]) == 0
    assert load_index(tmp_path / "index").manifest["kind"] == "sq8"
    assert main(["index", "build", "--plan", str(out), "--kind", "binary", "--embeddings", str(files["doc"][0]), "--ids",
                 str(files["doc"][1]), "--out", str(tmp_path / "index2")]) == 2
    assert "--plan fixes" in capsys.readouterr().err


def test_plan_refuses_missing_target(toy, tmp_path, capsys):
    root, files = toy
    assert main(["compress", "plan", "--data", str(root), "--doc-embeddings", str(files["doc"][0]), "--doc-ids", str(files["doc"][1]),
                 "--query-embeddings", str(files["query"][0]), "--query-ids", str(files["query"][1]), "--out", str(tmp_path / "p")]) == 2
    assert "--budget-bytes" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown precision"):
        Precision("int3")


def test_plan_sweeps_named_variants_and_refits_the_chosen_one(toy, tmp_path, monkeypatch):
    from embedtune import runtime

    monkeypatch.setattr(runtime, "_thread_budget", 3)  # as `embedtune --threads 3` leaves it: the plan records it
    experiment = _experiment(toy)
    out = tmp_path / "plan"
    # A tiny budget, so the choice is one of the 1-byte settings; DIVE beats PCA on this toy, though not by a paired test
    # over its few validation queries, so the gate on learned maps is off here (learned_gate_p above 1).
    plan = run_plan(experiment, out, budget_bytes=1, methods=["pca", "dive"], dims=[8], precisions=["binary"], peers=[],
                    rounds=1, variants=["qat-binary"], learned_gate_p=2.0)
    settings = {r["setting"] for r in plan["sweep"]}
    assert {"pca-8/binary", "dive-8/binary", "dive+qat-binary-8/binary"} <= settings
    assert "pca+qat-binary-8/binary" not in settings  # PCA has no such option
    # A learned map's rows say how its fit went (DIVE: its heads and its PCA start); a projection's say nothing.
    assert plan["threads"] == 3  # the fits round differently on other thread counts: the count reproduces the plan
    rows = {r["setting"]: r for r in plan["sweep"]}
    assert rows["dive-8/binary"]["fit_details"]["heads"] >= 1 and "fit_details" not in rows["pca-8/binary"]
    chosen = plan["chosen"]
    _, compressor, _, _ = load_plan(out)
    assert chosen["method"] == "dive", chosen["setting"]
    assert compressor.config.quantization_aware == ("binary" if chosen["variant"] == "qat-binary" else None)
    with pytest.raises(ValueError, match="unknown variant"):
        run_plan(experiment, tmp_path / "x", budget_bytes=1, methods=["pca"], dims=[8], precisions=["binary"], peers=[], variants=["qat-8bit"])
    with pytest.raises(ValueError, match="applies to none"):
        run_plan(experiment, tmp_path / "y", budget_bytes=1, methods=["pca"], dims=[8], precisions=["binary"], peers=[], variants=["qat-binary"])


def test_a_plan_waits_for_another_plan_on_its_sweep_folder(toy, tmp_path, caplog):
    import logging
    import threading
    import time

    from embedtune.locks import exclusive_lock

    work, held, released = tmp_path / "work", threading.Event(), []

    def other_plan():
        with exclusive_lock(work / ".lock"):
            held.set()
            time.sleep(0.5)
            released.append(time.monotonic())

    thread = threading.Thread(target=other_plan)
    thread.start()
    held.wait(5)
    with caplog.at_level(logging.INFO, logger="embedtune.locks"):
        run_plan(_experiment(toy), tmp_path / "plan", budget_bytes=4 * D, methods=["truncate"], dims=[8], precisions=["float32"], peers=[],
                 work=work, rounds=0)
    thread.join()
    assert released and f"another plan is using the sweep folder {work}" in caplog.text
