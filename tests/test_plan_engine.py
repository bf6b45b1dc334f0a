"""The plan's one sweep engine: the labelled and the label-free plan differ only in their objective.

Both ``run_plan`` and ``run_label_free_plan`` go through :func:`embedtune.workflows.plan.run_sweep`,
so they record the same plan.json fields (``split_seed`` included), and both score the CSR peer
when asked; the labelled plan's output keeps its structure. Also the opt-in FAISS additive
quantiser peers (``rq``, ``lsq``) at exactly their byte budgets. Tiny synthetic data throughout.
"""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest

from conftest import write_toy_vectors
from embedtune.cli import main
from embedtune.index.codecs import Precision, QuantizedIndex
from embedtune.workflows import label_free
from embedtune.workflows import plan as plan_module
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.label_free import LabelFreeObjective, load_corpus_experiment, run_label_free_plan
from embedtune.workflows.plan import ADDITIVE_PEERS, DEFAULT_PEERS, LabelledObjective, peer_factories, run_plan

D = 24
#: What the engine writes into plan.json before write_plan adds the folder's own fields, in both modes.
ENGINE_FIELDS = {"embedtune_version", "model", "dataset", "split_seed", "seed", "threads", "budget_bytes", "target_retention", "allow_disk",
                 "count_tables", "allow_index_over_float32", "codecs",
                 "chosen", "deployment", "reference", "validation", "retention", "frontier", "frontier_not_choosable", "sweep", "fit_sample", "bill", "skipped_peers", "skipped_settings"}
#: The fields of every sweep row (a labelled one; a label-free row adds ``objective``).
ROW_FIELDS = {"setting", "candidate", "method", "family", "dim", "precision", "ram_bytes", "disk_bytes", "fixed_bytes", "transform_bytes", "amortized_bytes", "tier",
              "choosable", "mse", "score_mse", "bound_mse", "gap_db", "score_error", "ndcg@10", "recall@10", "recall@100", "n_queries", "queries",
              "build_s", "latency_ms", "latency_queries", "latency_vs_reference",
              # the bill (embedtune.index.bill.vector_bill)
              "bytes_ram", "disk_read_per_query", "float32_share", "vectors_per_gb", "ram_gb@1M", "ram_gb@100M", "ram_gb@1B",
              "usd_month@1M", "usd_month@100M", "usd_month@1B"}
FITTED_ROW_FIELDS = ROW_FIELDS | {"variant", "fit_s"}
# The csr budget: float16 at 12 dims is 24 B, which k = 8 (uint8 index + fp16 value) of 4 × 24 = 96 latents fill.
CSR_SWEEP = {"methods": ("truncate", "pca"), "dims": (12,), "precisions": ("float16", "int8"), "peers": ("csr",), "rounds": 0}


@pytest.fixture
def toy(tmp_path):
    """60 unit docs, 40 queries each judged relevant to one doc, as a BEIR folder and .npy vectors with id files."""
    return write_toy_vectors(tmp_path, dim=D)


def _experiment(toy):
    root, files = toy
    return load_experiment(root, doc_embeddings=files["doc"][0], doc_ids=files["doc"][1],
                           query_embeddings=files["query"][0], query_ids=files["query"][1])


@pytest.fixture
def engine_calls(monkeypatch):
    """Every (objective, plan fields) the engine hands to write_plan, and the ``y`` each choice was made on."""
    calls: list[dict] = []
    real_write, real_choose = plan_module.write_plan, plan_module.choose

    def recording_write(out, compressor, precision, docs, plan, prebuilt=None):
        calls[-1]["plan"] = dict(plan)
        return real_write(out, compressor, precision, docs, plan, prebuilt=prebuilt)

    def recording_choose(rows, budget_bytes=None, target_retention=None, reference=None, y="ndcg@10", x="ram_bytes"):
        calls.append({"y": y, "x": x, "pool": [r["setting"] for r in rows]})
        return real_choose(rows, budget_bytes, target_retention, reference, y=y, x=x)

    monkeypatch.setattr(plan_module, "write_plan", recording_write)
    monkeypatch.setattr(plan_module, "choose", recording_choose)
    return calls


def test_both_modes_go_through_the_one_engine_with_the_same_fields(toy, tmp_path, engine_calls):
    """The same experiment, planned with labels and without: one engine, the same plan.json fields, csr rows in both, never chosen."""
    experiment = _experiment(toy)
    options = dict(budget_bytes=24, work=tmp_path / "work", labels={"model": "toy"}, **CSR_SWEEP)
    labelled = run_plan(experiment, tmp_path / "labelled", **options)
    free = run_label_free_plan(experiment, tmp_path / "free", "agreement", held_out_fraction=0.3, **options)
    assert [call["y"] for call in engine_calls] == ["ndcg@10", "objective"]
    labelled_fields, free_fields = set(engine_calls[0]["plan"]), set(engine_calls[1]["plan"])
    assert labelled_fields == ENGINE_FIELDS and free_fields == ENGINE_FIELDS | {"objective"}
    assert set(labelled) - labelled_fields == set(free) - free_fields  # write_plan's own fields, the same in both
    for plan in (labelled, free):
        assert plan["split_seed"] == experiment.split.seed
        csr_rows = [r for r in plan["sweep"] if r["method"] == "csr"]
        assert [(r["setting"], r["ram_bytes"], r["dim"], r["choosable"]) for r in csr_rows] == [("csr+k8-96/sparse-fp16", 24, 96, False)]
        assert plan["chosen"]["method"] != "csr"
    assert all("csr+k8-96/sparse-fp16" not in call["pool"] for call in engine_calls)  # never in the pool the choice is made from
    # The label-free CSR is fitted like its other compressors: on the corpus without the held-out documents.
    assert (tmp_path / "work" / "label-free").is_dir() and any((tmp_path / "work" / "label-free").rglob("csr"))
    # The label-free module keeps no sweep of its own: the choice, the frontier, the bars and the folder are the engine's.
    for name in ("write_plan", "choose", "pareto_frontier", "plot_frontier", "progress_bar", "exclusive_lock", "score_precisions"):
        assert name not in vars(label_free), name


def test_a_corpus_only_label_free_plan_records_no_split(toy, tmp_path):
    _, files = toy
    experiment = load_corpus_experiment(doc_embeddings=files["doc"][0], doc_ids=files["doc"][1])
    plan = run_label_free_plan(experiment, tmp_path / "plan", "agreement", budget_bytes=24, held_out_fraction=0.3, work=tmp_path / "work",
                               **CSR_SWEEP)
    recorded = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert "split_seed" in recorded and recorded["split_seed"] is None and plan["split_seed"] is None
    assert recorded["objective"]["labels_read"] is False
    assert {r["setting"] for r in recorded["sweep"] if r["method"] == "csr"} == {"csr+k8-96/sparse-fp16"}
    assert all(set(r) >= ROW_FIELDS | {"objective"} for r in recorded["sweep"])


def test_the_labelled_plan_keeps_its_structure(toy, tmp_path, engine_calls):
    """Fields, references, rows and the order of the sweep, as the labelled plan wrote them before the engine was shared."""
    plan = run_plan(_experiment(toy), tmp_path / "plan", target_retention=0.9, methods=["truncate", "pca"], dims=[16, 8],
                    precisions=["float32", "int8", "binary-rescore"], peers=["pq-fs", "int4"], final=True, rounds=0, work=tmp_path / "work",
                    labels={"model": "toy"}, full_sweep=True)
    assert set(engine_calls[0]["plan"]) == ENGINE_FIELDS
    assert plan["skipped_settings"] == []
    folder_fields = {"precision", "dim", "faiss_factory", "ram_bytes", "disk_bytes", "index_kind", "compressor_state_sha256", "files_sha256"}
    assert set(plan) == ENGINE_FIELDS | folder_fields | {"test"}
    assert set(json.loads((tmp_path / "plan" / "plan.json").read_text())) == set(plan) | {"content_sha256"}
    assert plan["reference"] == {"setting": "frozen-24/float32", "ndcg@10": plan["reference"]["ndcg@10"], "queries": "val"}
    assert set(plan["validation"]) == {"rule", "n_val", "n_unseen_val"}
    assert set(plan["test"]) == {"queries", "ndcg@10", "recall@10", "n_queries", "setting", "subsets"}
    # The default codecs: on 60 documents neither klt-pq (256 codewords) nor klt-pq4 (16) has 4 training points a codeword,
    # so only their textbook reference is scored, on the frozen vectors, after the peers.
    assert [r["setting"] for r in plan["sweep"]] == [
        "frozen-24/float32", "frozen-24/int8", "frozen-24/binary-rescore", "frozen-24/faiss:PQ2x4fs", "frozen-24/faiss:PQ4x4fs",
        "frozen-24/int4", "frozen-24/klt-sq:16", "truncate-16/float32", "truncate-16/int8", "truncate-16/binary-rescore",
        "truncate-8/float32", "truncate-8/int8", "truncate-8/binary-rescore", "pca-16/float32", "pca-16/int8", "pca-16/binary-rescore",
        "pca-8/float32", "pca-8/int8", "pca-8/binary-rescore"]
    for row in plan["sweep"]:
        assert set(row) == (ROW_FIELDS if row["candidate"] is None else FITTED_ROW_FIELDS), row["setting"]
        assert row["queries"] == "val"
    assert plan["retention"] == plan["chosen"]["ndcg@10"] / plan["reference"]["ndcg@10"]
    assert {r["setting"] for r in plan["frontier"]} <= {r["setting"] for r in plan["sweep"]}
    # The frontier is that of what the plan may choose: without allow_disk the disk tier, and the textbook reference, are
    # measured for comparison on a frontier of their own, each row saying why the plan may not choose it.
    assert plan["frontier"] and all(r["choosable"] for r in plan["frontier"])
    set_aside = plan["frontier_not_choosable"]
    assert set_aside and not any(r["choosable"] for r in set_aside)
    assert {r["setting"] for r in set_aside} <= {r["setting"] for r in plan["sweep"]}
    why = {r["tier"]: r["why_not_choosable"] for r in set_aside}
    assert why["disk-rescore"].endswith("--allow-disk-rescore")
    assert all(r["why_not_choosable"] for r in set_aside)


def test_the_plots_draw_the_frontier_of_what_the_plan_may_choose(toy, tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plan_module, "plot_frontier", lambda rows, path, *args, **kwargs: drawn.append((rows, kwargs)))
    run_plan(_experiment(toy), tmp_path / "plan", budget_bytes=32, methods=["pca"], dims=[8], precisions=["float32", "binary-rescore"],
             peers=[], rounds=0, work=tmp_path / "work")
    assert len(drawn) == 2
    for rows, kwargs in drawn:
        assert any(not r["choosable"] for r in rows)  # the disk tier and the reference coder: plotted, not on the line
        assert kwargs["frontier_of"] == [r for r in rows if r["choosable"]]


def test_counting_the_tables_chooses_within_the_budget_with_their_share(toy, tmp_path):
    """On 60 documents a PCA's matrix or a PQ's codebooks weigh more than the codes: counted, they decide the choice."""
    options = dict(budget_bytes=24, methods=["truncate", "pca"], dims=[8, 4], precisions=["float32", "int8"], peers=["pq-fs"], rounds=0,
                   work=tmp_path / "work")
    codes_only = run_plan(_experiment(toy), tmp_path / "codes", **options)
    counted = run_plan(_experiment(toy), tmp_path / "counted", count_tables=True, **options)
    assert codes_only["count_tables"] is False and counted["count_tables"] is True
    assert codes_only["chosen"]["amortized_bytes"] > 24  # what the codes alone let through
    assert counted["chosen"]["amortized_bytes"] <= 24
    within = [r for r in counted["sweep"] if r["choosable"] and r["amortized_bytes"] <= 24]
    assert counted["chosen"]["ndcg@10"] == max(r["ndcg@10"] for r in within)
    costs = [r["amortized_bytes"] for r in counted["frontier"]]
    assert costs == sorted(costs)
    # The pruned sweep, counting the tables, chooses what scoring every setting chooses.
    every = run_plan(_experiment(toy), tmp_path / "every", count_tables=True, full_sweep=True, **options)
    assert counted["chosen"]["setting"] == every["chosen"]["setting"]
    # A PCA map in front is held once as a codec's rotation is: its k x d matrix and bias are counted, truncation holds none.
    for row in counted["sweep"]:
        expected = 4 * (row["dim"] * D + row["dim"]) if row["method"] == "pca" else 0
        assert row["transform_bytes"] == expected, row["setting"]
        assert row["amortized_bytes"] == pytest.approx(row["ram_bytes"] + (row["fixed_bytes"] + expected) / 60), row["setting"]


def test_a_setting_whose_index_outweighs_the_float32_vectors_is_chosen_only_when_allowed(toy, tmp_path):
    """On 60 documents of 24 dims, PCA to 20 dims at float32 holds 80 B of codes and a 1,920 B matrix: 113 B a vector
    with its share, more than the 96 B float32 vectors. Scored and listed, never chosen unless asked."""
    options = dict(budget_bytes=90, methods=["pca"], dims=[20], precisions=["float32"], peers=[], codecs=[], rounds=0,
                   work=tmp_path / "work")
    with pytest.raises(ValueError, match="pca-20/float32 would .*113 bytes per vector.*larger than the float32 vectors.*--allow-index-over-float32"):
        run_plan(_experiment(toy), tmp_path / "guarded", **options)
    allowed = run_plan(_experiment(toy), tmp_path / "allowed", allow_index_over_float32=True, **options)
    assert allowed["allow_index_over_float32"] is True and allowed["chosen"]["setting"] == "pca-20/float32"
    assert allowed["chosen"]["amortized_bytes"] == pytest.approx(80 + 4 * (20 * D + 20) / 60) and allowed["chosen"]["amortized_bytes"] > 4 * D
    # With a cheaper precision beside it, the guarded plan chooses that, and lists the larger index with the reason.
    guarded = run_plan(_experiment(toy), tmp_path / "int8", **{**options, "precisions": ["float32", "int8"]})
    assert guarded["chosen"]["amortized_bytes"] <= 4 * D and guarded["allow_index_over_float32"] is False
    over = [r for r in guarded["sweep"] if r["amortized_bytes"] > 4 * D]
    assert over and all(r["over_float32"] and not r["choosable"] for r in over)
    assert all(not r.get("over_float32") for r in guarded["sweep"] if r["amortized_bytes"] <= 4 * D)
    for row in guarded["frontier_not_choosable"]:
        if row.get("over_float32"):
            assert "larger than the float32 vectors: --allow-index-over-float32" in row["why_not_choosable"]


def test_a_label_free_plan_on_a_sample_shares_the_tables_over_every_corpus_row(toy, tmp_path):
    _, files = toy
    experiment = load_corpus_experiment(doc_embeddings=files["doc"][0], doc_ids=files["doc"][1])
    plan = run_label_free_plan(experiment, tmp_path / "plan", "agreement", budget_bytes=24, held_out_fraction=0.3, fit_sample=40,
                               methods=["pca"], dims=[8], precisions=["float32", "int8"], peers=[], rounds=0, work=tmp_path / "work")
    assert plan["fit_sample"]["rows"] == 40 and plan["fit_sample"]["of"] == 60
    for row in plan["sweep"]:
        assert row["amortized_bytes"] == pytest.approx(row["ram_bytes"] + (row["fixed_bytes"] + row["transform_bytes"]) / 60), row["setting"]


def test_objectives_say_what_differs(toy, tmp_path):
    experiment = _experiment(toy)
    labelled = LabelledObjective(experiment)
    assert (labelled.metric, labelled.y, labelled.queries.part) == ("ndcg@10", "ndcg@10", "val")
    assert set(labelled.queries.ids) <= set(experiment.split.val)
    validation = label_free.label_free_validation(experiment, "agreement", held_out_fraction=0.3)
    free = LabelFreeObjective(experiment, validation)
    assert (free.metric, free.y) == ("recall@10", "objective") and free.queries is validation.queries
    assert free.record()["objective"] == validation.record and "validation" in labelled.record()
    # A projection wider than its fitting documents is left out by the label-free objective only.
    cells = [plan_module.candidate_for("pca", len(validation.fit_doc_ids) + 1), plan_module.candidate_for("truncate", 12)]
    assert free.candidates(cells) == cells[1:] and labelled.candidates(cells) == cells


def test_additive_peers_are_opt_in_at_exactly_their_budget():
    assert not set(ADDITIVE_PEERS) & set(DEFAULT_PEERS)  # minutes of training each: only when asked
    assert peer_factories(384, [8, 16], ("rq", "lsq")) == ["RQ8x8", "LSQ8x8", "RQ16x8", "LSQ16x8"]
    assert peer_factories(384, [8, 7], ("prq",)) == ["PRQ2x4x8"]  # two splits: an even budget only
    assert peer_factories(100, [7], ("rq",)) == ["RQ7x8"]  # no sub-vectors: any dimension
    for factory, budget in (("RQ8x8", 8), ("LSQ16x8", 16), ("PRQ2x4x8", 8)):
        # Inner-product search (every plan index's metric) needs no stored norm, so the code is the budget.
        assert faiss.index_factory(384, factory, faiss.METRIC_INNER_PRODUCT).sa_code_size() == budget
        assert Precision(f"faiss:{factory}").ram_bytes(384) == budget
    # 256 codewords per codebook: left out below 4 training points per codeword, as 8-bit PQ is.
    assert peer_factories(384, [8], ("rq", "lsq", "pq-fs"), n_train=1023) == ["PQ16x4fs"]
    with pytest.raises(ValueError, match="unknown peer kind"):
        peer_factories(384, [], ("nope",))  # even with no budget to build at


def test_a_residual_quantiser_peer_is_scored_at_its_bytes(tmp_path):
    rng = np.random.default_rng(1)
    docs = rng.standard_normal((1100, D)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(len(docs))))
    index = QuantizedIndex.build(docs, Precision("faiss:RQ3x8"))
    assert index.backend.sa_code_size() == 3 == index.ram_bytes()
    experiment = load_corpus_experiment(doc_embeddings=tmp_path / "docs.npy", doc_ids=tmp_path / "docs.txt")
    plan = run_label_free_plan(experiment, tmp_path / "plan", "agreement", budget_bytes=3, methods=["truncate"], dims=[D],
                               precisions=["binary"], peers=["rq"], rounds=0, work=tmp_path / "work")
    rq = next(r for r in plan["sweep"] if r["setting"] == "frozen-24/faiss:RQ3x8")
    assert rq["ram_bytes"] == 3 and rq["family"] == "FAISS RQ/LSQ"


def test_cli_label_free_plan_takes_the_csr_peer(toy, tmp_path, capsys):
    """`compress plan --label-free agreement --peers csr`: the peer the label-free plan used to drop."""
    _, files = toy
    out = tmp_path / "plan"
    assert main(["compress", "plan", "--doc-embeddings", str(files["doc"][0]), "--doc-ids", str(files["doc"][1]), "--label-free", "agreement",
                 "--held-out-fraction", "0.3", "--methods", "truncate", "--dims", "12", "--precisions", "float16", "--peers", "csr",
                 "--budget-bytes", "24", "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    assert "no labels read" in capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    assert plan["split_seed"] is None and plan["chosen"]["method"] != "csr"
    assert [r["setting"] for r in plan["sweep"] if r["method"] == "csr"] == ["csr+k8-96/sparse-fp16"]


def test_cli_plan_counts_the_tables_when_asked_and_says_how_otherwise(toy, tmp_path, capsys):
    _, files = toy
    common = ["compress", "plan", "--doc-embeddings", str(files["doc"][0]), "--doc-ids", str(files["doc"][1]), "--label-free", "agreement",
              "--held-out-fraction", "0.3", "--methods", "pca", "--dims", "8", "--precisions", "float32", "int8", "--peers", "pq-fs",
              "--budget-bytes", "24", "--work", str(tmp_path / "work")]
    assert main([*common, "--out", str(tmp_path / "codes")]) == 0
    said = capsys.readouterr().out
    assert "with_tables" not in said
    codes = json.loads((tmp_path / "codes" / "plan.json").read_text())
    assert codes["chosen"]["amortized_bytes"] > 24  # int8's ranges, shared by 60 documents
    assert main([*common, "--count-tables", "--out", str(tmp_path / "counted")]) == 0
    said = capsys.readouterr().out
    counted = json.loads((tmp_path / "counted" / "plan.json").read_text())
    assert counted["count_tables"] is True and counted["chosen"]["amortized_bytes"] <= 24
    assert "with_tables" in said.split("Pareto frontier", 1)[1].splitlines()[1]


def test_where_the_tables_outweigh_the_codes_and_the_float32_vectors_the_plan_says_so_and_names_the_flag(capsys):
    from embedtune.cli.plan import _print_tables

    chosen = {"setting": "frozen-1000/klt-apq:48", "ram_bytes": 48, "fixed_bytes": 54_603_563, "amortized_bytes": 48 + 54_603_563 / 3000,
              "choosable": True, "objective": 0.592}
    sweep = [{"setting": "frozen-1000/float32", "ram_bytes": 4000, "amortized_bytes": 4000.0, "choosable": True, "objective": 1.0},
             chosen,
             {"setting": "truncate-333/binary-asym", "ram_bytes": 42, "amortized_bytes": 42.0, "choosable": True, "objective": 0.439,
              "gap_db": 4.31},
             {"setting": "truncate-83/binary-asym", "ram_bytes": 11, "amortized_bytes": 11.0, "choosable": True, "objective": 0.323},
             {"setting": "truncate-333/binary-rescore", "ram_bytes": 42, "amortized_bytes": 42.0, "choosable": False, "objective": 0.713}]
    plan = {"chosen": chosen, "budget_bytes": 48, "reference": {"setting": "frozen-1000/float32"}, "sweep": sweep}
    _print_tables(plan, "objective", "agreement@10")
    said = capsys.readouterr().out
    assert "outweigh its codes" in said and "larger than the float32 vectors' 4,000 bytes per vector" in said
    assert "to count them in the budget and the choice: --count-tables" in said
    # The best choosable setting within the budget whose index stays below the float32 vectors is named.
    assert "the best setting scored whose index is not: truncate-333/binary-asym (agreement@10 0.4390, 42 bytes per vector" in said
    assert "all in RAM, +4.3 dB from the Gaussian bound)" in said  # its tier and its distance from the limit, as the choice's
    # The codec's own tables outweigh its codes: fitted on these documents, they hold part of them.
    assert "a larger corpus of this kind scores it lower than this one" in said
    _print_tables({**plan, "count_tables": True}, "objective", "agreement@10")
    assert "--count-tables" not in capsys.readouterr().out
    # A map's weights (pca-96's matrix on 1,033 documents) outweigh the codes, the codec holds almost nothing: no such warning.
    mapped = {"chosen": {"setting": "pca-96/int4", "ram_bytes": 48, "fixed_bytes": 1_536, "transform_bytes": 147_840,
                         "amortized_bytes": 48 + (1_536 + 147_840) / 1033},
              "reference": {"setting": "frozen-384/float32"}, "sweep": [{"setting": "frozen-384/float32", "ram_bytes": 1536}]}
    _print_tables(mapped, "ndcg@10", "validation nDCG@10")
    said = capsys.readouterr().out
    assert "outweigh its codes" in said and "larger corpus" not in said and "larger than the float32" not in said
    # By default such an index is not chosen: the plan names the best one passed over for it, and the flag that allows it.
    guarded_chosen = {**sweep[2]}
    over = {**chosen, "choosable": False, "over_float32": True, "gap_db": 0.52}
    _print_tables({**plan, "chosen": guarded_chosen, "sweep": [sweep[0], over, *sweep[2:]]}, "objective", "agreement@10")
    said = capsys.readouterr().out
    assert ("frozen-1000/klt-apq:48 scored higher (agreement@10 0.5920) but was not chosen: with its tables its index takes "
            "18,249 bytes per vector") in said and "--allow-index-over-float32 lets the plan choose it" in said
    assert "more than the float32 vectors (from about 13,817 vectors it would not be)" in said  # 54,603,563 / (4,000 - 48)
    assert "; its codes are +0.5 dB from the Gaussian bound; --allow-index-over-float32" in said  # its distance from the limit
    _print_tables({**plan, "allow_index_over_float32": True}, "objective", "agreement@10")
    assert "(chosen with --allow-index-over-float32)" in capsys.readouterr().out


@pytest.mark.parametrize("target", [{"target_retention": 0.9}, {"budget_bytes": 24}, {"target_retention": 0.8, "budget_bytes": 48}])
def test_the_sweep_skips_only_settings_the_choice_could_not_be(toy, tmp_path, target):
    """The pruned sweep chooses what the full sweep chooses, and scores every row the full sweep scores at or below the choice."""
    settings = dict(methods=["truncate", "pca"], dims=[16, 8], precisions=["float32", "int8", "int4", "binary"], peers=["pq-fs", "pq", "int4"],
                    rounds=0, labels={"model": "toy"})
    full = run_plan(_experiment(toy), tmp_path / "full", **target, **settings, work=tmp_path / "work-full", full_sweep=True)
    pruned = run_plan(_experiment(toy), tmp_path / "pruned", **target, **settings, work=tmp_path / "work-pruned")
    assert pruned["chosen"]["setting"] == full["chosen"]["setting"]
    assert pruned["chosen"]["ndcg@10"] == full["chosen"]["ndcg@10"]
    scored = {r["setting"] for r in pruned["sweep"]}
    skipped = {s["setting"]: s for s in pruned["skipped_settings"]}
    assert skipped, "the toy sweep has settings dearer than the choice: some must be skipped"
    assert not scored & set(skipped)
    full_rows = {r["setting"]: r for r in full["sweep"]}
    assert set(skipped) <= set(full_rows)
    for setting, entry in skipped.items():
        assert entry["ram_bytes"] == full_rows[setting]["ram_bytes"]
        assert entry["ram_bytes"] > pruned["chosen"]["ram_bytes"], setting
        assert "budget" in entry["reason"] or "keeps the target" in entry["reason"]
    assert {s for s, r in full_rows.items() if r["ram_bytes"] <= pruned["chosen"]["ram_bytes"]} <= scored


LEVELS = [f"klt-apq:{b}" for b in (16, 32, 48, 64, 96, 128)]


def _bytes(level: str) -> int:
    return int(level.split(":")[1])


def _recording_scorer(keeps_from: int):
    """``(scored, score)``: ``score(level)`` keeps the target from ``keeps_from`` bytes up and appends each level to ``scored``."""
    scored: list[str] = []

    def score(level):
        scored.append(level)
        return _bytes(level) >= keeps_from

    return scored, score


def _assert_the_cheapest_keeping_is_found(scored: list[str], keeps_from: int) -> list[str]:
    """The cheapest scored level keeping the target is the exhaustive answer; returns the levels that keep it."""
    keeping = [level for level in scored if _bytes(level) >= keeps_from]
    exhaustive = [level for level in LEVELS if _bytes(level) >= keeps_from]
    assert (min(keeping, key=_bytes) if keeping else None) == (exhaustive[0] if exhaustive else None)
    return exhaustive


@pytest.mark.parametrize("keeps_from", [16, 32, 48, 64, 96, 128, 256])
def test_searched_codec_budgets_find_the_cheapest_keeping_the_target_in_few_fits(keeps_from):
    scored, score = _recording_scorer(keeps_from)
    not_scored = plan_module.search_budgets(LEVELS, lambda level: None, score, has_target=True)
    _assert_the_cheapest_keeping_is_found(scored, keeps_from)
    assert len(scored) <= 3 and len(set(scored)) == len(scored)
    assert set(scored) | set(not_scored) == set(LEVELS) and not set(scored) & set(not_scored)
    for level, reason in not_scored.items():
        assert ("fell short" in reason and _bytes(level) < keeps_from) or ("keeps the target" in reason and _bytes(level) > keeps_from)


def test_searched_codec_budgets_respect_the_budget_and_a_cheaper_setting_that_keeps_the_target():
    scored: list[str] = []
    dearer_than_48 = lambda level: "dearer than x (48 B), which already keeps the target" if _bytes(level) > 48 else None  # noqa: E731
    not_scored = plan_module.search_budgets(LEVELS, dearer_than_48, lambda level: scored.append(level) or False, has_target=True)
    assert all(_bytes(level) <= 48 for level in scored) and "dearer than x" in not_scored["klt-apq:128"]
    scored.clear()
    above_64 = lambda level: "above the budget" if _bytes(level) > 64 else None  # noqa: E731
    not_scored = plan_module.search_budgets(LEVELS, above_64, lambda level: scored.append(level) or False, has_target=False)
    assert scored == ["klt-apq:64"]  # a budget alone: the family's best within it is its dearest
    assert not_scored["klt-apq:96"] == "above the budget" and "costs more and fits the budget" in not_scored["klt-apq:16"]
    scored.clear()
    # With its tables, the dearest level's index may be oversized (above the budget, or larger than float32): the search
    # steps down until a level is not, and stops there.
    over_32 = lambda level: _bytes(level) > 32  # noqa: E731
    not_scored = plan_module.search_budgets(LEVELS, above_64, lambda level: scored.append(level) or False, has_target=False,
                                            oversized=over_32)
    assert scored == ["klt-apq:64", "klt-apq:48", "klt-apq:32"] and set(not_scored) == set(LEVELS) - set(scored)
    assert "klt-apq:32 of the same family costs more and fits the budget" in not_scored["klt-apq:16"]
    scored.clear()
    not_scored = plan_module.search_budgets(LEVELS, above_64, lambda level: scored.append(level) or False, has_target=False,
                                            oversized=lambda level: True)
    assert scored == [level for level in LEVELS if _bytes(level) <= 64][::-1]  # every level oversized: all scored, none fits
    scored.clear()
    assert plan_module.search_budgets(LEVELS, above_64, lambda level: scored.append(level) or False, has_target=True, everything=True) == {}
    assert scored == LEVELS


@pytest.mark.parametrize("keeps_from", [16, 32, 48, 64, 96, 128, 256])
def test_a_ladder_searched_from_its_top_finds_the_same_cheapest_and_settles_a_short_family_in_one_fit(keeps_from):
    scored, score = _recording_scorer(keeps_from)
    not_scored = plan_module.search_budgets(LEVELS, lambda level: None, score, has_target=True, top_first=True)
    exhaustive = _assert_the_cheapest_keeping_is_found(scored, keeps_from)
    assert scored[0] == LEVELS[-1] and len(scored) <= 4 and len(set(scored)) == len(scored)
    if not exhaustive:
        assert scored == [LEVELS[-1]]
        assert all("klt-apq:128 of the same family costs more and fell short" in reason for reason in not_scored.values())
    assert set(scored) | set(not_scored) == set(LEVELS) and not set(scored) & set(not_scored)
    # the dearest the choice could be comes first: a level dearer than a setting keeping the target is never fitted
    scored.clear()
    dearer_than_64 = lambda level: "dearer than x (64 B), which already keeps the target" if _bytes(level) > 64 else None  # noqa: E731
    plan_module.search_budgets(LEVELS, dearer_than_64, score, has_target=True, top_first=True)
    assert scored[0] == "klt-apq:64" and all(_bytes(level) <= 64 for level in scored)


@pytest.mark.parametrize("keeps_from", [16, 32, 48, 64, 96, 128, 256])
@pytest.mark.parametrize("oversized_from", [16, 48, 128, 512])
def test_a_ladder_finds_the_cheapest_level_keeping_the_target_that_is_not_oversized(keeps_from, oversized_from):
    """Tables grow with a family's bytes: an oversized level sends the search to cheaper levels, from the top or the middle."""
    for top_first in (False, True):
        scored, score = _recording_scorer(keeps_from)
        plan_module.search_budgets(LEVELS, lambda level: None, score, has_target=True, top_first=top_first,
                                   oversized=lambda level: _bytes(level) >= oversized_from)
        usable = [level for level in LEVELS if keeps_from <= _bytes(level) < oversized_from]
        found = [level for level in scored if keeps_from <= _bytes(level) < oversized_from]
        assert (min(found, key=_bytes) if found else None) == (usable[0] if usable else None), (top_first, scored)
        assert len(scored) <= 4


def test_the_searched_codec_starts_at_its_top_only_when_nothing_at_or_below_its_bytes_keeps_the_target():
    """One fit settles a searched codec that falls short everywhere; a bisection from the middle serves one that can keep it."""
    rows = [{"setting": "frozen-384/int8", "ram_bytes": 384.0, "objective": 0.99, "choosable": True},
            {"setting": "frozen-384/klt-pq4:64", "ram_bytes": 64.0, "objective": 0.80, "choosable": True},
            {"setting": "frozen-384/float32+refine100", "ram_bytes": 96.0, "objective": 1.0, "choosable": False}]
    out_of_reach = lambda target: plan_module._target_out_of_reach(rows, LEVELS, 384, target, 1.0, "objective")  # noqa: E731
    assert out_of_reach(0.95)  # only int8 (384 B, above klt-apq's 128 B) and an unchoosable row keep it
    assert not out_of_reach(0.8)  # klt-pq4:64 keeps it: the family likely does below 128 B
    assert not out_of_reach(None) and not plan_module._target_out_of_reach(rows, [], 384, 0.95, 1.0, "objective")
    scored, score = _recording_scorer(keeps_from=10**6)
    plan_module.search_budgets(LEVELS, lambda level: None, score, has_target=True, top_first=out_of_reach(0.95))
    assert scored == ["klt-apq:128"]


def test_an_8_bit_peer_cheaper_than_a_searched_codec_level_that_fell_short_is_not_trained():
    rows = [{"setting": "frozen-384/klt-apq:128", "method": "frozen", "precision": "klt-apq:128", "ram_bytes": 128.0, "objective": 0.93},
            {"setting": "frozen-384/klt-apq:48", "method": "frozen", "precision": "klt-apq:48", "ram_bytes": 48.0, "objective": 0.82},
            {"setting": "frozen-384/klt-apq:128+refine100", "method": "frozen", "precision": "klt-apq:128", "refine": 100,
             "ram_bytes": 128.0, "objective": 0.5}]
    short = lambda peer_bytes, target=0.95, searched=("klt-apq",): plan_module._short_searched_codec(  # noqa: E731
        rows, searched, peer_bytes, target, 1.0, "objective")
    assert "cheaper than frozen-384/klt-apq:48 (48 B), which fell short" in short(32)  # the cheapest short level above it is named
    assert "klt-apq:128 (128 B)" in short(64)
    assert short(128) is None  # at equal bytes a peer can win: still trained
    assert short(32, target=0.8) is None  # every level above 32 B keeps 0.8
    assert short(32, target=None) is None and short(32, searched=()) is None


def test_the_near_limit_benchmark_still_shows_klt_apq_above_every_cheaper_8_bit_faiss_peer():
    """The measured rule behind not training a peer cheaper than a klt-apq budget that fell short, re-read from the
    committed near-limit rows: a rerun that breaks it fails here."""
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "near-limit"
    margins = []
    for corpus in sorted(p for p in root.iterdir() if p.is_dir()):
        rows = {f.stem[len("frozen__"):]: json.loads(f.read_text()) for f in corpus.glob("frozen__*.json")}
        searched = {r["ram_bytes"]: r["agreement"] for name, r in rows.items() if name.startswith("klt-apq_")}
        peers = [r for name, r in rows.items() if name.startswith("faiss_") and "fs" not in name and r.get("agreement") is not None]
        for budget, agreement in searched.items():
            margins += [agreement - peer["agreement"] for peer in peers if peer["ram_bytes"] < budget]
    assert len(margins) >= 20
    assert min(margins) > 0.03, f"an 8-bit FAISS peer came within {min(margins):.3f} of klt-apq at more bytes"


def test_no_code_of_a_space_in_the_committed_frontier_beats_its_float32_vectors_by_the_ceiling_margin():
    """The measured rule behind skipping a space whose float32 vectors fall short of the target, re-read from the committed
    frontier rows (labelled nDCG@10, the noisier objective): every other precision of a space stays below its float32 row
    plus SPACE_CEILING_MARGIN of the reference."""
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "frontier"
    excesses = []
    for seed_dir in root.glob("*/*/*/s*"):
        rows = {f.stem: json.loads(f.read_text()) for f in seed_dir.glob("*.json")}
        reference_file = seed_dir.parent.parent / next((p.name for p in seed_dir.parent.parent.glob("frozen-*")), "") / seed_dir.name / "float32.json"
        if "float32" not in rows or not reference_file.is_file():
            continue
        reference = json.loads(reference_file.read_text())["ndcg@10"]
        excesses += [(r["ndcg@10"] - rows["float32"]["ndcg@10"]) / reference for name, r in rows.items()
                     if name != "float32" and "rescore" not in name and "refine" not in name]
    assert len(excesses) >= 500
    assert max(excesses) < plan_module.SPACE_CEILING_MARGIN, f"a code scored {max(excesses):.4f} of the reference above its float32 space"


def test_a_space_whose_float32_vectors_fall_short_is_probed_only_when_the_choice_already_keeps_the_target():
    rows = [{"setting": "frozen-384/int8", "ram_bytes": 384.0, "objective": 0.99, "choosable": True}]
    applies = lambda **kw: plan_module._ceiling_applies(rows, **{"budget_bytes": None, "target_retention": 0.95, "reference": 1.0,  # noqa: E731
                                                                 "y": "objective", "allow_disk": False, "full_sweep": False, **kw})
    assert applies()
    assert not applies(budget_bytes=256)  # the keeping row is above the budget: the choice may be any setting's best
    assert not applies(target_retention=None) and not applies(allow_disk=True) and not applies(full_sweep=True)
    assert not applies(target_retention=0.995)


def test_label_free_dive_is_not_fitted_when_its_pca_starts_fall_far_short_of_the_target():
    rows = [{"candidate": "pca-64", "precision": "float32", "objective": 0.70},
            {"candidate": "pca-uncentred-64", "precision": "float32", "objective": 0.72},
            {"candidate": "pca-uncentred-64", "precision": "int8", "objective": 0.99},  # not the start's float32: ignored
            {"candidate": "pca-128", "precision": "float32", "objective": 0.86}]
    falls_short = lambda dim, margin=0.1, method="dive": plan_module._start_falls_short(  # noqa: E731
        rows, plan_module.candidate_for(method, dim), margin, 0.95, 1.0, "objective")
    assert "keep at most 0.7200" in falls_short(64)
    assert falls_short(128) is None  # 0.86 + 0.1 reaches 0.95: DIVE might
    assert falls_short(32) is None  # no start scored: fitted
    assert falls_short(64, margin=None) is None  # with labels the bound is off
    assert falls_short(64, method="pca") is None
    assert plan_module.PlanObjective.learned_start_margin is None and label_free.LabelFreeObjective.learned_start_margin == 0.15


@pytest.fixture(scope="module")
def ladder_corpus(tmp_path_factory):
    """1,500 clustered documents, and one work folder for the full plans and one for the pruned ones: each target's plans
    reuse the fits and FAISS tables of the target before (a cache changes what is built, never what is scored)."""
    folder = tmp_path_factory.mktemp("ladders")
    rng = np.random.default_rng(3)
    docs = (rng.standard_normal((1500, 6)) @ rng.standard_normal((6, D)) + 0.3 * rng.standard_normal((1500, D))).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    np.save(folder / "docs.npy", docs)
    (folder / "docs.txt").write_text("".join(f"d{i}\n" for i in range(len(docs))))
    return folder


# 0.999: both ladders fall short everywhere; 0.97: only their dearest peers keep it; 0.6: the cheapest do.
@pytest.mark.parametrize("target", [0.999, 0.97, 0.6])
def test_the_8_bit_peer_ladders_train_the_fewest_peers_and_choose_what_training_all_chooses(ladder_corpus, tmp_path, target):
    """The PQm and OPQm,PQm ladders, and each space's codec budgets, are searched from their dearest possible level: the
    pruned plan chooses exactly what a plan that trains every peer and codec chooses, and trains fewer peers."""
    experiment = load_corpus_experiment(doc_embeddings=ladder_corpus / "docs.npy", doc_ids=ladder_corpus / "docs.txt")
    settings = dict(target_retention=target, methods=["truncate", "pca"], dims=[D, 12], precisions=["float32", "int8", "int4", "binary"],
                    peers=["pq", "opq"], rounds=0, codecs=("klt-pq4",), codec_budgets=(3, 6, 12), searched_codecs=())
    full = run_label_free_plan(experiment, tmp_path / "full", "agreement", **settings, work=ladder_corpus / "work-full", full_sweep=True)
    pruned = run_label_free_plan(experiment, tmp_path / "pruned", "agreement", **settings, work=ladder_corpus / "work-pruned")
    assert pruned["chosen"]["setting"] == full["chosen"]["setting"]
    assert pruned["chosen"]["objective"] == full["chosen"]["objective"]

    def peers(plan):
        return {r["setting"]: r for r in plan["sweep"] if r["family"] == "FAISS PQ/OPQ" and "x4fs" not in r["setting"]}

    trained, every = peers(pruned), peers(full)
    assert len(every) >= 6 and set(trained) < set(every)
    assert {s["setting"] for s in pruned["skipped_peers"]} == set(every) - set(trained)
    for kind in ("faiss:PQ", "faiss:OPQ"):
        ladder = sorted((r for s, r in every.items() if f"/{kind}" in s), key=lambda r: r["ram_bytes"])
        keeping = [r for r in ladder if r["objective"] >= target * full["reference"]["objective"]]
        if not keeping:  # a ladder short of the target everywhere: its dearest peer alone settles it
            assert [s for s in trained if f"/{kind}" in s] == [ladder[-1]["setting"]]


def _row(setting: str, method: str, ram: int, scores: np.ndarray) -> dict:
    return {"setting": setting, "method": method, "ram_bytes": ram, "tier": "ram", "choosable": True, "objective": float(scores.mean()),
            "per_query": {f"q{i}": float(v) for i, v in enumerate(scores)}}


def test_a_learned_map_is_chosen_only_where_a_paired_test_says_it_beats_the_plain_setting():
    rng = np.random.default_rng(0)
    plain = rng.uniform(0.3, 0.9, 400)
    rows = [_row("frozen-32/klt-pq4:16", "frozen", 16, plain),
            _row("dive-16/klt-pq4:16", "dive", 16, plain + rng.normal(0.004, 0.1, 400)),    # higher mean, noise: not shown
            _row("dive-8/klt-pq4:32", "dive", 32, plain + rng.normal(0.05, 0.05, 400)),     # far ahead on most queries
            _row("pca-16/klt-pq4:16", "pca", 16, plain + 0.01)]                            # closed-form: never gated
    gated = plan_module.gate_learned(rows, "objective")
    assert [r["setting"] for r in gated] == ["dive-16/klt-pq4:16"]
    assert not rows[1]["choosable"] and rows[1]["gated_by"]["setting"] == "pca-16/klt-pq4:16" and rows[1]["gated_by"]["p"] >= 0.05
    assert rows[2]["choosable"] and rows[3]["choosable"]
    # The rival is the best setting without a learned map at the same or fewer bytes: a dearer one is no rival.
    lone = [_row("dive-16/klt-pq4:16", "dive", 16, plain), _row("frozen-32/int8", "frozen", 32, plain + 0.2)]
    assert plan_module.gate_learned(lone, "objective") == [] and lone[0]["choosable"]
    # Above 1 the gate is off: the mean alone decides, as before.
    again = [_row("frozen-32/klt-pq4:16", "frozen", 16, plain), _row("dive-16/klt-pq4:16", "dive", 16, plain + rng.normal(0.004, 0.1, 400))]
    assert plan_module.gate_learned(again, "objective", p_below=2.0) == [] and again[1]["choosable"]


def test_the_learned_gate_is_a_plan_flag_checked_on_the_command_line(tmp_path, capsys):
    code = main(["compress", "plan", "--label-free", "agreement", "--budget-bytes", "8", "--learned-gate-p", "0", "--out", str(tmp_path / "p")])
    assert code != 0 and "--learned-gate-p is a p-value threshold above 0" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
