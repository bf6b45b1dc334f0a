"""compress plan with the registered codecs: distortion in every row, codecs on every space, and the RAM-only choice.

Every sweep row says how far its codes are from the vectors they code (``mse``, ``score_mse``), from
the Gaussian rate-distortion bound (``bound_mse``, ``gap_db``) and from the uncompressed inner
products as served (``score_error``), with its bytes amortised over the corpus and its tier. The
registered codecs are scored on the frozen vectors and on every compressor's output; a plan that
chooses one builds exactly the index it scored. Settings that rescore from disk are chosen only
when allowed. Small anisotropic toy data (a codec's 4-bit tables need a few hundred documents),
and one plan on the bundled SciFact MiniLM vectors.
"""

from __future__ import annotations

import json
import math
from importlib.resources import files

import numpy as np
import pytest

from conftest import write_beir
from plan_checks import assert_served_as_scored, record_builds
from embedtune.cli import main
from embedtune.index import load_index
from embedtune.index.codecs import Precision
from embedtune.index.deployment import deployment_recipe
from embedtune.index.planned import build_planned_index
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.label_free import held_out_documents, load_corpus_experiment, run_label_free_plan
from embedtune.workflows.plan import (
    CODEC_BUDGETS,
    DEFAULT_CODECS,
    REFERENCE_FAMILY_LABEL,
    check_codecs,
    codec_precisions,
    faiss_cache_dir,
    load_faiss_cache,
    run_plan,
)

N_DOCS, N_QUERIES, D = 400, 100, 32
#: The fields every sweep row gains.
DISTORTION_FIELDS = {"mse", "score_mse", "bound_mse", "gap_db", "score_error", "amortized_bytes", "tier", "choosable"}
#: A small, quick sweep: one compressor at one dimension, no FAISS peers, the 4-bit codec at two small budgets.
QUICK = {"methods": ["truncate"], "dims": [16], "peers": [], "codecs": ("klt-pq4",), "codec_budgets": (4, 8), "rounds": 0}


@pytest.fixture
def toy(tmp_path):
    """400 unit docs with a decaying spectrum and a common direction (as sentence embeddings have), 100 noisy queries, one positive each."""
    rng = np.random.default_rng(0)
    scales = np.geomspace(1.0, 0.1, D)
    docs = rng.standard_normal((N_DOCS, D)) * scales + 0.3
    targets = rng.permutation(N_DOCS)[:N_QUERIES]
    queries = docs[targets] + 0.5 * rng.standard_normal((N_QUERIES, D)) * scales
    docs = (docs / np.linalg.norm(docs, axis=1, keepdims=True)).astype(np.float32)
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    doc_ids, query_ids = [f"d{i}" for i in range(N_DOCS)], [f"q{i}" for i in range(N_QUERIES)]
    root = write_beir(tmp_path / "toy", [{"_id": i, "text": i} for i in doc_ids], [{"_id": q, "text": q} for q in query_ids],
                      [(q, doc_ids[t], 1) for q, t in zip(query_ids, targets)])
    paths = {}
    for name, ids, vectors in (("doc", doc_ids, docs), ("query", query_ids, queries)):
        np.save(tmp_path / f"{name}.npy", vectors)
        (tmp_path / f"{name}.txt").write_text("".join(i + "\n" for i in ids))
        paths[name] = (tmp_path / f"{name}.npy", tmp_path / f"{name}.txt")
    return root, paths


def _experiment(toy):
    root, paths = toy
    return load_experiment(root, doc_embeddings=paths["doc"][0], doc_ids=paths["doc"][1],
                           query_embeddings=paths["query"][0], query_ids=paths["query"][1])


def test_codec_budgets_follow_the_dimension_and_the_corpus():
    assert DEFAULT_CODECS == ("klt-pq4", "klt-pq4-sphere") and CODEC_BUDGETS == (16, 32, 48, 64)
    # klt-pq4:B has 2B four-bit sub-quantisers: at most d/2 bytes; klt-pq:B needs B dimensions.
    assert codec_precisions(("klt-pq4", "klt-pq"), CODEC_BUDGETS, 64) == ["klt-pq4:16", "klt-pq4:32", "klt-pq:16", "klt-pq:32",
                                                                           "klt-pq:48", "klt-pq:64"]
    assert codec_precisions(("klt-pq4",), CODEC_BUDGETS, 24) == []
    # Budgets above float32 of the vectors never make sense; the textbook coder refuses more bits than 8 an axis.
    assert codec_precisions(("klt-sq",), (4, 8, 16, 200), 16) == ["klt-sq:4", "klt-sq:8", "klt-sq:16"]
    # The 8-bit codecs (256 codewords a codebook) need 4 training points a codeword, as the 8-bit FAISS peers do.
    assert codec_precisions(("klt-pq", "klt-pq4"), (16,), 384, n_train=1023) == ["klt-pq4:16"]
    assert codec_precisions(("klt-pq", "klt-pq4"), (16,), 384, n_train=1024) == ["klt-pq:16", "klt-pq4:16"]
    with pytest.raises(ValueError, match=r"--codecs: unknown codec family 'klt-xx'.*klt-pq4.*--codecs none"):
        check_codecs(["klt-xx"])
    with pytest.raises(ValueError, match="--codec-budgets"):
        check_codecs(["klt-pq"], [0])


def test_every_row_carries_its_distortion_tier_and_amortised_bytes(toy, tmp_path):
    plan = run_plan(_experiment(toy), tmp_path / "plan", budget_bytes=64, precisions=["float32", "int8", "binary", "binary-asym",
                                                                                      "binary-rescore"], work=tmp_path / "work", full_sweep=True, **QUICK)
    rows = {r["setting"]: r for r in plan["sweep"]}
    for row in rows.values():
        assert set(row) >= DISTORTION_FIELDS, row["setting"]
        assert row["amortized_bytes"] == pytest.approx(row["ram_bytes"] + (row["fixed_bytes"] + row["transform_bytes"]) / N_DOCS)
        assert row["tier"] == ("disk-rescore" if row["precision"] == "binary-rescore" else "ram")
        if row["mse"] is not None and row["gap_db"] is not None:
            assert row["gap_db"] == pytest.approx(10 * math.log10(row["mse"] / row["bound_mse"]))
    # float32 codes are the vectors: no error, so no gap; its served scores are the exact ones (up to float rounding).
    for setting in ("frozen-32/float32", "truncate-16/float32"):
        assert rows[setting]["mse"] == 0 and rows[setting]["score_mse"] == 0 and rows[setting]["gap_db"] is None
        assert rows[setting]["bound_mse"] > 0
    assert rows["frozen-32/float32"]["score_error"] < 1e-10
    assert rows["truncate-16/float32"]["score_error"] > 1e-6  # truncating is an error of the compressor, measured as served
    # Hamming codes decode to nothing the search scores against, and their scores are distances; binary-asym's are not.
    assert rows["frozen-32/binary"]["mse"] is None and rows["frozen-32/binary"]["score_error"] is None
    assert rows["frozen-32/binary-asym"]["mse"] > 0 and rows["frozen-32/binary-asym"]["score_error"] > 0
    assert rows["frozen-32/int8"]["mse"] < rows["frozen-32/binary-asym"]["mse"]
    # The codecs on the frozen vectors and on the compressor's output; the textbook coder on the frozen vectors, never chosen.
    for setting in ("frozen-32/klt-pq4:4", "frozen-32/klt-pq4:8", "truncate-16/klt-pq4:4", "truncate-16/klt-pq4:8"):
        assert rows[setting]["family"] == "embedtune codec (klt-pq4)" and rows[setting]["choosable"] and rows[setting]["tier"] == "ram"
        assert rows[setting]["gap_db"] is not None and rows[setting]["fixed_bytes"] > 0
    references = [r for r in plan["sweep"] if r["family"] == REFERENCE_FAMILY_LABEL]
    assert [r["setting"] for r in references] == ["frozen-32/klt-sq:4", "frozen-32/klt-sq:8"]
    assert not any(r["choosable"] for r in references) and all(r["gap_db"] is not None for r in references)
    assert rows["frozen-32/klt-pq4:8"]["mse"] < rows["frozen-32/klt-pq4:4"]["mse"]  # more bytes, less error
    assert plan["codecs"] == {"families": ["klt-pq4"], "budgets": [4, 8], "reference": "klt-sq",
                              "searched": {"families": ["klt-apq", "klt-apq-sphere"], "budgets": [16, 32, 48, 64, 96, 128]}}
    # The codecs' indexes are cached (the frozen vectors' beside the FAISS peers, a compressor's under its fit's digest),
    # and a second plan on the same fits reuses them: the same index, so the same recorded build time.
    cached = load_faiss_cache(faiss_cache_dir(tmp_path / "work", _experiment(toy).embeddings.doc_embeddings))
    assert {"klt-pq4:4", "klt-pq4:8"} <= set(cached) and not {"klt-sq:4", "klt-sq:8"} & set(cached)
    assert len(list((tmp_path / "work" / "space-faiss").glob("*/klt-pq4_8.faiss"))) == 1
    again = {r["setting"]: r for r in run_plan(_experiment(toy), tmp_path / "again", budget_bytes=64, precisions=["float32"],
                                               work=tmp_path / "work", **QUICK)["sweep"]}
    for setting in ("frozen-32/klt-pq4:8", "truncate-16/klt-pq4:8"):
        assert again[setting]["build_s"] == rows[setting]["build_s"] and again[setting]["ndcg@10"] == rows[setting]["ndcg@10"]


def test_a_budget_only_a_codec_meets_is_met_by_the_codec_and_served_as_scored(toy, tmp_path, monkeypatch):
    """4 B a vector: no precision of 16-d truncations gets there (int8: 16 B); klt-pq4:4 does, and `index build --plan` serves it."""
    built = record_builds(monkeypatch)
    experiment = _experiment(toy)
    out = tmp_path / "plan"
    plan = run_plan(experiment, out, budget_bytes=4, precisions=["float32", "float16", "int8"], work=tmp_path / "work", **QUICK)
    chosen = plan["chosen"]
    assert Precision(chosen["precision"]).is_codec and chosen["ram_bytes"] <= 4 and chosen["tier"] == "ram"
    assert plan["allow_disk"] is False and plan["precision"]["name"] == chosen["precision"] and plan["ram_bytes"] == 4
    assert (out / "codec.faiss").is_file() and plan["index_kind"] == chosen["precision"] == plan["faiss_factory"]
    assert plan["deployment"] == deployment_recipe(Precision(chosen["precision"]), plan["dim"])
    assert_served_as_scored(experiment, plan, out, built, toy[1]["doc"][0], toy[1]["doc"][1], tmp_path / "index")


def test_a_disk_rescore_setting_is_chosen_only_when_allowed(toy, tmp_path):
    experiment = _experiment(toy)
    options = dict(budget_bytes=2, precisions=["float32", "binary-rescore"], work=tmp_path / "work", **{**QUICK, "codecs": ()})
    # 2 B a vector: only binary-rescore of the 16-d truncation fits, and it reads float32 vectors from disk at query time.
    with pytest.raises(ValueError, match=r"truncate-16/binary-rescore would qualify.*--allow-disk-rescore"):
        run_plan(experiment, tmp_path / "ram", **options)
    plan = run_plan(experiment, tmp_path / "disk", allow_disk=True, **options)
    assert plan["chosen"]["setting"] == "truncate-16/binary-rescore" and plan["chosen"]["tier"] == "disk-rescore"
    assert json.loads((tmp_path / "disk" / "plan.json").read_text())["allow_disk"] is True
    # With a RAM setting in reach the default plan takes it, whatever the disk-rescore rows score.
    plan = run_plan(experiment, tmp_path / "ram", **{**options, "budget_bytes": 4, "codecs": ("klt-pq4",)})
    assert plan["chosen"]["tier"] == "ram" and plan["allow_disk"] is False
    assert all(not r["choosable"] for r in plan["sweep"] if r["tier"] == "disk-rescore")


def test_a_reference_codec_asked_for_by_name_is_scored_under_its_own_label_and_never_chosen(toy, tmp_path):
    _, paths = toy
    experiment = load_corpus_experiment(doc_embeddings=paths["doc"][0], doc_ids=paths["doc"][1])
    plan = run_label_free_plan(experiment, tmp_path / "plan", "agreement", budget_bytes=8, methods=["truncate"], dims=[16],
                               precisions=["float32", "int8"], peers=[], codecs=("klt-pq4", "klt-sq-sphere"), codec_budgets=(4, 8),
                               rounds=0, work=tmp_path / "work")
    reference = {r["setting"]: r for r in plan["sweep"] if r["family"] == "reference codec (klt-sq-sphere)"}
    assert set(reference) == {"frozen-32/klt-sq-sphere:4", "frozen-32/klt-sq-sphere:8"}
    assert all(not r["choosable"] and r["gap_db"] is not None for r in reference.values())
    assert {r["setting"] for r in plan["sweep"] if r["family"] == REFERENCE_FAMILY_LABEL} == {"frozen-32/klt-sq:4", "frozen-32/klt-sq:8"}
    assert "klt-sq" not in plan["chosen"]["setting"]


def test_the_trellis_code_asked_for_by_name_is_scored_on_every_space_and_can_be_chosen(toy, tmp_path):
    _, paths = toy
    experiment = load_corpus_experiment(doc_embeddings=paths["doc"][0], doc_ids=paths["doc"][1])
    # On 60 documents the trellis code's tables outweigh the float32 vectors: allowed, as this is about scoring it.
    plan = run_label_free_plan(experiment, tmp_path / "plan", "agreement", budget_bytes=8, methods=["truncate"], dims=[16],
                               precisions=["float32", "int8"], peers=[], codecs=("klt-tcq",), codec_budgets=(4, 8),
                               rounds=0, work=tmp_path / "work", allow_index_over_float32=True)
    trellis = {r["setting"]: r for r in plan["sweep"] if r["family"] == "embedtune codec (klt-tcq)"}
    assert {"frozen-32/klt-tcq:4", "frozen-32/klt-tcq:8", "truncate-16/klt-tcq:8"} <= set(trellis)
    assert all(r["choosable"] and r["gap_db"] is not None for r in trellis.values())


def test_the_label_free_plan_scores_the_codecs_too(toy, tmp_path):
    _, paths = toy
    experiment = load_corpus_experiment(doc_embeddings=paths["doc"][0], doc_ids=paths["doc"][1])
    plan = run_label_free_plan(experiment, tmp_path / "plan", "agreement", budget_bytes=8, methods=["truncate", "pca"], dims=[16],
                               precisions=["float32", "int8"], peers=[], codecs=("klt-pq4",), codec_budgets=(4, 8), rounds=0,
                               work=tmp_path / "work")
    codec_rows = {r["setting"] for r in plan["sweep"] if r["family"] == "embedtune codec (klt-pq4)"}
    # On the frozen vectors every budget; on a compressor's output a budget alone needs only the family's dearest within it.
    assert codec_rows == {"frozen-32/klt-pq4:4", "frozen-32/klt-pq4:8", "truncate-16/klt-pq4:8", "pca-16/klt-pq4:8"}
    skipped = {s["setting"]: s["reason"] for s in plan["skipped_settings"]}
    assert all("klt-pq4:8 of the same family costs more and fits the budget" in skipped[f"{space}/klt-pq4:4"] for space in ("truncate-16", "pca-16"))
    assert {r["setting"] for r in plan["sweep"] if r["family"] == REFERENCE_FAMILY_LABEL} == {"frozen-32/klt-sq:4", "frozen-32/klt-sq:8"}
    assert all(set(r) >= DISTORTION_FIELDS | {"objective"} for r in plan["sweep"])
    assert plan["chosen"]["ram_bytes"] <= 8 and plan["chosen"]["tier"] == "ram"
    # --codecs none: no codec rows, and no reference without codecs to measure.
    bare = run_label_free_plan(experiment, tmp_path / "bare", "agreement", budget_bytes=64, methods=["truncate"], dims=[16],
                               precisions=["float32", "int8"], peers=[], codecs=(), rounds=0, work=tmp_path / "work")
    assert not any(Precision(r["precision"]).is_codec for r in bare["sweep"]) and bare["codecs"]["reference"] is None


def test_cli_codecs_flags_and_the_gap_in_the_output(toy, tmp_path, capsys):
    root, paths = toy
    common = ["compress", "plan", "--data", str(root), "--doc-embeddings", str(paths["doc"][0]), "--doc-ids", str(paths["doc"][1]),
              "--query-embeddings", str(paths["query"][0]), "--query-ids", str(paths["query"][1]), "--methods", "truncate", "--dims", "16",
              "--peers", "", "--work", str(tmp_path / "work")]
    out = tmp_path / "plan"
    assert main([*common, "--precisions", "float32", "int8", "--codecs", "klt-pq4", "--codec-budgets", "4", "8", "--budget-bytes", "4",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gap_db" in printed and "dB from the Gaussian rate-distortion bound" in printed
    plan = json.loads((out / "plan.json").read_text())
    assert plan["precision"]["name"] in ("klt-pq4:4",) and plan["codecs"]["families"] == ["klt-pq4"]
    assert main(["index", "build", "--plan", str(out), "--embeddings", str(paths["doc"][0]), "--ids", str(paths["doc"][1]),
                 "--out", str(tmp_path / "index")]) == 0
    assert load_index(tmp_path / "index").manifest["kind"] == "klt-pq4:4"
    assert main([*common, "--precisions", "float32", "--codecs", "klt-xx", "--budget-bytes", "4", "--out", str(tmp_path / "bad")]) == 2
    assert "--codecs: unknown codec family 'klt-xx'" in capsys.readouterr().err
    # `--codecs none` sweeps none; `--allow-disk-rescore` lets binary-rescore be chosen.
    assert main([*common, "--precisions", "float32", "binary-rescore", "--codecs", "none", "--budget-bytes", "2", "--out",
                 str(tmp_path / "none")]) == 2
    assert "--allow-disk-rescore" in capsys.readouterr().err
    assert main([*common, "--precisions", "float32", "binary-rescore", "--codecs", "none", "--budget-bytes", "2", "--allow-disk-rescore",
                 "--out", str(tmp_path / "disk")]) == 0
    plan = json.loads((tmp_path / "disk" / "plan.json").read_text())
    assert plan["precision"]["name"] == "binary-rescore" and plan["allow_disk"] is True and plan["codecs"]["families"] == []


def test_codec_deployment_recipes():
    recipe = deployment_recipe(Precision("klt-pq:32"), 384)
    assert recipe["faiss"]["factory"] == recipe["faiss"]["index_kind"] == "klt-pq:32" and "codec.faiss" in recipe["faiss"]["load"]
    lance = recipe["lancedb"]
    assert lance["index"] == {"index_type": "IVF_PQ", "distance_type": "dot", "num_sub_vectors": 32, "num_bits": 8}
    assert lance["exact"] is False and "own codebooks" in lance["note"]
    # IVF_PQ's sub-vectors divide the dimension: the nearest divisor to the codec's bytes.
    assert deployment_recipe(Precision("klt-pq4:16"), 100)["lancedb"]["index"]["num_sub_vectors"] == 20
    json.dumps(recipe)


def _bundled_scifact(tmp_path):
    """The bundled SciFact MiniLM document vectors as own vectors (``tmp_path/docs.npy`` and ``docs.txt``), and their experiment."""
    bundled = np.load(files("embedtune.datasets") / "scifact-minilm-vectors.npz")
    docs = np.ascontiguousarray(bundled["document"], dtype=np.float32)
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "docs.txt").write_text("".join(f"{i}\n" for i in bundled["document_ids"]))
    return docs, load_corpus_experiment(doc_embeddings=tmp_path / "docs.npy", doc_ids=tmp_path / "docs.txt")


@pytest.mark.slow
def test_a_label_free_plan_on_scifact_chooses_an_in_ram_codec_and_serves_it_as_scored(tmp_path):
    """The bundled SciFact MiniLM corpus (5,183 x 384-d), no labels, 32 B a vector: only a codec fits, and the index serves what was scored."""
    docs, experiment = _bundled_scifact(tmp_path)
    out, work = tmp_path / "plan", tmp_path / "work"
    plan = run_label_free_plan(experiment, out, "agreement", budget_bytes=32, methods=["frozen"], precisions=["float32", "int8", "binary"],
                               peers=[], codecs=("klt-pq4",), codec_budgets=(16, 32), rounds=0, work=work, searched_codecs=())
    chosen = plan["chosen"]
    assert Precision(chosen["precision"]).is_codec and chosen["ram_bytes"] <= 32 and chosen["tier"] == "ram"
    assert chosen["objective"] > 0.5  # agreement@10 with the float32 top-10 of the held-out documents
    assert -1.0 < chosen["gap_db"] < 6.0 and chosen["score_error"] > 0
    references = {r["setting"]: r for r in plan["sweep"] if r["family"] == REFERENCE_FAMILY_LABEL}
    assert set(references) == {"frozen-384/klt-sq:16", "frozen-384/klt-sq:32"}
    # The index built from the plan is the one the sweep scored (cached under WORK/frozen-faiss): the same top-10.
    scored = load_faiss_cache(faiss_cache_dir(work, experiment.embeddings.doc_embeddings))[chosen["precision"]][0]
    index = load_index(build_planned_index(tmp_path / "docs.npy", tmp_path / "index", out, ids=tmp_path / "docs.txt"))
    # The index says the bytes a vector takes in RAM as its plan counted them (a codec's code), not nothing.
    assert json.loads((tmp_path / "index" / "manifest.json").read_text())["bytes_per_vector"] == chosen["ram_bytes"]
    row = {doc_id: i for i, doc_id in enumerate(experiment.embeddings.doc_ids)}
    held_out = experiment.embeddings.doc_embeddings[[row[d] for d in held_out_documents(experiment.embeddings.doc_ids)]]
    assert len(held_out) == plan["objective"]["n_queries"]
    _, I_scored = scored.search(held_out, 10)
    _, I_served = index.search(held_out, 10)
    assert np.array_equal(I_scored, I_served)


@pytest.mark.slow
def test_the_searched_codec_is_fitted_at_the_budget_and_served_as_scored(tmp_path):
    """klt-apq on the bundled SciFact vectors: with 32 B alone only klt-apq:32 is fitted, and `index build --plan` finds what it scored."""
    docs, experiment = _bundled_scifact(tmp_path)
    options = dict(budget_bytes=32, methods=["frozen"], precisions=["float32", "binary"], peers=[], codecs=("klt-pq4",), codec_budgets=(32,),
                   rounds=0, work=tmp_path / "work")
    # By default: klt-apq:32's 14 MB of tables make its index larger than SciFact's float32 vectors (5,183 x 1,536 B), so the
    # ladder steps down to klt-apq:16, and the choice is among the settings whose index is not larger.
    guarded = run_label_free_plan(experiment, tmp_path / "guarded", "agreement", **options)
    searched = {r["setting"]: r for r in guarded["sweep"] if "klt-apq" in r["setting"]}
    assert set(searched) == {f"frozen-384/klt-apq{sphere}:{b}" for sphere in ("", "-sphere") for b in (16, 32)}
    for setting, row in searched.items():
        over = row["amortized_bytes"] > 1536
        assert over == setting.endswith(":32") and row["choosable"] is not over and bool(row.get("over_float32")) is over
    assert guarded["chosen"]["amortized_bytes"] <= 1536
    # Allowed, the dearest level within the budget alone is fitted (its fit reused from the work folder).
    plan = run_label_free_plan(experiment, tmp_path / "plan", "agreement", allow_index_over_float32=True, **options)
    searched = {r["setting"]: r for r in plan["sweep"] if "klt-apq" in r["setting"]}
    # A budget alone: the dearest level within it; the sphere family ranks the same fit's codes by direction.
    assert list(searched) == ["frozen-384/klt-apq:32", "frozen-384/klt-apq-sphere:32"]
    assert searched["frozen-384/klt-apq-sphere:32"]["build_s"] == searched["frozen-384/klt-apq:32"]["build_s"]  # not refitted
    skipped = {s["setting"]: s["reason"] for s in plan["skipped_settings"]}
    assert "above the budget" in skipped["frozen-384/klt-apq:48"] and "fits the budget" in skipped["frozen-384/klt-apq:16"]
    row = searched["frozen-384/klt-apq:32"]
    assert row["choosable"] and row["tier"] == "ram" and row["family"] == "embedtune codec (klt-apq)"
    assert row["objective"] > next(r for r in plan["sweep"] if r["setting"] == "frozen-384/klt-pq4:32")["objective"]
    row = max(searched.values(), key=lambda r: r["objective"])
    assert plan["chosen"]["setting"] == row["setting"]
    # The index built from the plan scores the held-out documents' agreement@10 the sweep recorded.
    index = load_index(build_planned_index(tmp_path / "docs.npy", tmp_path / "index", tmp_path / "plan", ids=tmp_path / "docs.txt"))
    position = {doc_id: i for i, doc_id in enumerate(experiment.embeddings.doc_ids)}
    rows = np.array([position[d] for d in held_out_documents(experiment.embeddings.doc_ids)])
    exact = docs[rows] @ docs.T
    exact[np.arange(len(rows)), rows] = -np.inf
    truth = np.argsort(-exact, axis=1, kind="stable")[:, :10]
    _, served = index.search(docs[rows], 11)
    found = [[r for r in result if r != own][:10] for result, own in zip(served.tolist(), rows)]
    agreement = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth.tolist())])
    assert agreement == pytest.approx(row["objective"], abs=1e-9)
