"""The planner at scale: the fit-sample rule, the bill's arithmetic, streamed exact top-k, and what a plan records of both."""

from __future__ import annotations

import json
from importlib.resources import files

import numpy as np
import pytest

from embedtune.encoders.dataset import DatasetEmbeddings
from embedtune.data.beir import BeirDataset
from embedtune.index.bill import (
    BILL_SCALES,
    DEFAULT_PRICE_PER_GB_MONTH,
    BillLine,
    bill_table,
    bill_record,
    disk_read_per_query,
    monthly_cost,
    ram_at,
    scale_label,
    vector_bill,
)
from embedtune.index.fit_sample import fit_sample_record, fit_sample_rows, fit_sample_size
from embedtune.workflows.experiment import Experiment
from embedtune.compress.pca import fit_sample_rows as fit_sample_rows_of_pca
from embedtune.workflows.label_free import exact_top_k, plan_sample, run_label_free_plan
from embedtune.workflows.plan import _skip_reason


# -- the fit-sample rule -----------------------------------------------------------------------
def test_fit_sample_size_is_min_of_corpus_and_max_of_floor_and_rows_per_dimension():
    assert fit_sample_size(10_000, 384) == 10_000  # a small corpus is fitted whole
    assert fit_sample_size(1_000_000, 384) == 65_536  # 100 x 384 = 38,400 is below the floor
    assert fit_sample_size(1_000_000, 4096) == 100 * 4096  # a wide model keeps 100 rows per dimension
    assert fit_sample_size(1_000_000, 768) == fit_sample_rows_of_pca(1_000_000, 768)  # one rule, PCA's
    assert fit_sample_size(100_000, 4096) == 100_000
    assert fit_sample_size(1_000_000, 384, override=5_000) == 5_000
    assert fit_sample_size(3_000, 384, override=5_000) == 3_000
    for bad in (0, -3, True):
        with pytest.raises(ValueError, match="fit-sample"):
            fit_sample_size(10, 4, override=bad)


def test_fit_sample_rows_are_seeded_sorted_and_distinct():
    rows = fit_sample_rows(1000, 100, seed=7)
    assert len(rows) == 100 and len(set(rows.tolist())) == 100 and (np.diff(rows) > 0).all()
    assert np.array_equal(rows, fit_sample_rows(1000, 100, seed=7))
    assert not np.array_equal(rows, fit_sample_rows(1000, 100, seed=8))
    assert np.array_equal(fit_sample_rows(50, 100), np.arange(50))
    record = fit_sample_record(1000, 8, 100, 7)
    assert record["rows"] == 100 and record["of"] == 1000 and record["sampled"] and record["seed"] == 7


# -- the bill --------------------------------------------------------------------------------
def test_bill_arithmetic():
    row = vector_bill(48, 384, fixed_bytes=2_000_000, price_per_gb_month=3.0)
    assert row["bytes_ram"] == 48 and row["disk_read_per_query"] == 0
    assert row["float32_share"] == pytest.approx(48 / (4 * 384))
    assert row["vectors_per_gb"] == pytest.approx(1e9 / 48)
    assert row["ram_gb@1M"] == pytest.approx((48e6 + 2e6) / 1e9)
    assert row["ram_gb@1B"] == pytest.approx((48e9 + 2e6) / 1e9)
    assert row["usd_month@1B"] == pytest.approx(row["ram_gb@1B"] * 3.0)
    assert row["usd_month@100M"] == pytest.approx((48e8 + 2e6) / 1e9 * 3.0)
    assert [scale_label(n) for n in BILL_SCALES] == ["1M", "100M", "1B"]
    assert ram_at(10, 4, 1) == 41
    assert monthly_cost(2e9, 5.0) == pytest.approx(10.0)
    assert disk_read_per_query(True, 64, 100) == 100 * 4 * 64 and disk_read_per_query(False, 64, 100) == 0
    with pytest.raises(ValueError, match="price"):
        monthly_cost(1.0, -1.0)
    with pytest.raises(ValueError, match="ram_bytes"):
        vector_bill(0, 384)
    assert bill_record()["price_per_gb_month"] == DEFAULT_PRICE_PER_GB_MONTH and "assumption" in bill_record()["price_source"]
    assert bill_record(2.5)["price_source"] == "given by the user"


def test_bill_table_puts_float32_first_and_counts_the_fixed_tables_at_scale():
    lines = bill_table([BillLine("32 B", "`klt-pq:32`", 32, fixed_bytes=5_000_000, disk_read="none")], 384, price_per_gb_month=2.0)
    assert lines[0].startswith("| budget |") and "RAM at 1M / 100M / 1B (GB)" in lines[0] and "$2/GB-month" in lines[0]
    float32_cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert float32_cells == ["float32", "`float32`", "1536", "100.00 %", "651,042", "1.54 / 154 / 1,536", "$3,072", "–"]
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    # 1M x 32 B + 5 MB of tables = 0.037 GB; 100M: 3.205 GB; 1B: 32.005 GB, at $2: $64 a month.
    assert cells == ["32 B", "`klt-pq:32`", "32", "2.08 %", "31,250,000", "0.037 / 3.21 / 32", "$64", "none"]


# -- streamed exact top-k --------------------------------------------------------------------
def test_exact_top_k_streamed_over_the_corpus_equals_one_block():
    rng = np.random.default_rng(3)
    xb = rng.standard_normal((503, 24)).astype(np.float32)
    xq = rng.standard_normal((37, 24)).astype(np.float32)
    exclude = rng.integers(-1, 503, size=37)
    whole = exact_top_k(xq, xb, 10, exclude=exclude, block=len(xq), doc_block=len(xb))
    for block, doc_block in ((5, 7), (1, 64), (37, 11), (8, 503)):
        assert np.array_equal(exact_top_k(xq, xb, 10, exclude=exclude, block=block, doc_block=doc_block), whole), (block, doc_block)
    scores = xq @ xb.T
    scores[np.flatnonzero(exclude >= 0), exclude[exclude >= 0]] = -np.inf
    assert np.array_equal(whole, np.argsort(-scores, axis=1, kind="stable")[:, :10])


def test_exact_top_k_breaks_equal_scores_by_row_in_every_block_size():
    xb = np.repeat(np.eye(4, dtype=np.float32), 5, axis=0)  # five copies of each axis: many equal scores
    xq = np.eye(4, dtype=np.float32)
    for doc_block in (1, 3, 20):
        assert exact_top_k(xq, xb, 5, doc_block=doc_block).tolist() == [list(range(5 * i, 5 * i + 5)) for i in range(4)]


# -- the peers a plan does not train ---------------------------------------------------------
def test_a_peer_dearer_than_a_setting_already_keeping_the_target_is_not_trained():
    rows = [{"setting": "a", "ram_bytes": 16, "objective": 0.96, "choosable": True},
            {"setting": "b", "ram_bytes": 8, "objective": 0.99, "choosable": False},  # not choosable: never the bar
            {"setting": "c", "ram_bytes": 64, "objective": 1.0, "choosable": True}]
    assert "dearer than a" in _skip_reason(rows, 32, None, 0.95, 1.0, "objective")
    assert _skip_reason(rows, 16, None, 0.95, 1.0, "objective") is None  # equal bytes: a better score would win the tie
    assert _skip_reason(rows, 8, None, 0.95, 1.0, "objective") is None
    assert _skip_reason(rows, 32, None, 0.99, 1.0, "objective") is None  # only c keeps 0.99, and it is dearer
    assert "above the budget" in _skip_reason(rows, 32, 24, None, 1.0, "objective")
    assert _skip_reason(rows, 16, 24, None, 1.0, "objective") is None


# -- a plan on a sample, with its bill -------------------------------------------------------
N_DOCS = 600


@pytest.fixture(scope="module")
def corpus_experiment():
    bundled = np.load(files("embedtune.datasets") / "scifact-minilm-vectors.npz")
    docs = np.ascontiguousarray(bundled["document"][:N_DOCS], dtype=np.float32)
    ids = [str(i) for i in bundled["document_ids"][:N_DOCS]]
    dataset = BeirDataset("scifact-slice", {i: {"title": "", "text": ""} for i in ids}, {}, {}, "corpus", {}, "memory")
    embeddings = DatasetEmbeddings(ids, docs, [], np.zeros((0, docs.shape[1]), dtype=np.float32), {}, {})
    return Experiment(dataset, embeddings, None, "cosine", {"model": "precomputed"})


def test_plan_sample_keeps_a_small_corpus_and_samples_a_large_one(corpus_experiment):
    whole, record = plan_sample(corpus_experiment)
    assert whole is corpus_experiment and record["rows"] == N_DOCS and not record["sampled"]
    sampled, record = plan_sample(corpus_experiment, fit_sample=250, seed=5)
    rows = fit_sample_rows(N_DOCS, 250, 5)
    assert sampled.embeddings.doc_ids == [corpus_experiment.embeddings.doc_ids[r] for r in rows]
    assert np.array_equal(sampled.embeddings.doc_embeddings, corpus_experiment.embeddings.doc_embeddings[rows])
    assert record["rows"] == 250 and record["of"] == N_DOCS and record["sampled"] and "ids_sha256" in record


def test_label_free_plan_runs_on_the_sample_and_records_it_and_the_bill(corpus_experiment, tmp_path):
    plan = run_label_free_plan(corpus_experiment, tmp_path / "plan", "agreement", target_retention=0.9, methods=["truncate", "pca"],
                               dims=[96, 48], precisions=["float32", "int8", "binary-rescore"], peers=["pq"], codecs=(), rounds=0,
                               work=tmp_path / "work", held_out_fraction=0.1, fit_sample=300, price_per_gb_month=2.5)
    sample = plan["fit_sample"]
    assert sample["rows"] == 300 and sample["of"] == N_DOCS and sample["sampled"] and sample["rule"] == "--fit-sample 300"
    assert plan["objective"]["fit_documents"] + plan["objective"]["held_out_documents"] == 300  # held out of the sample
    assert plan["bill"]["price_per_gb_month"] == 2.5
    for row in plan["frontier"] + plan["sweep"]:
        assert row["usd_month@1B"] == pytest.approx((row["ram_bytes"] * 1e9 + row["fixed_bytes"]) / 1e9 * 2.5)
        assert row["float32_share"] == pytest.approx(row["ram_bytes"] / (4 * 384))
    rescored = next(r for r in plan["sweep"] if r["precision"] == "binary-rescore")
    assert rescored["disk_read_per_query"] == 100 * 4 * rescored["dim"]
    assert (tmp_path / "plan" / "frontier_cost.png").is_file()
    written = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert written["fit_sample"] == sample and "usd_month@1B" in written["frontier"][0]


def test_a_plan_on_a_sample_measures_its_choice_over_every_document(corpus_experiment, tmp_path):
    from embedtune.index.plan_format import load_plan
    from embedtune.workflows.label_free import label_free_validation

    plan = run_label_free_plan(corpus_experiment, tmp_path / "plan", "agreement", target_retention=0.3, methods=["truncate"],
                               dims=[48], precisions=["float32"], peers=[], codecs=(), rounds=0, work=tmp_path / "work",
                               held_out_fraction=0.1, fit_sample=300)
    full = plan["full_corpus"]
    assert full["setting"] == plan["chosen"]["setting"] == "truncate-48/float32"
    assert full["n_documents"] == N_DOCS and full["n_queries"] == plan["objective"]["n_queries"]
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["full_corpus"] == full
    # The same figure by hand: the plan's held-out documents (of its sample) search all 600 documents, each never finding
    # itself; its compressor's float32 top-10 against the uncompressed top-10.
    sampled, _ = plan_sample(corpus_experiment, fit_sample=300)
    validation = label_free_validation(sampled, "agreement", held_out_fraction=0.1)
    _, compressor, _, _ = load_plan(tmp_path / "plan")
    docs, ids = corpus_experiment.embeddings.doc_embeddings, corpus_experiment.embeddings.doc_ids
    rows = np.array([ids.index(d) for d in validation.held_out])
    exact, coded = docs[rows] @ docs.T, compressor.transform(docs[rows]) @ compressor.transform(docs).T
    exact[np.arange(len(rows)), rows] = coded[np.arange(len(rows)), rows] = -np.inf
    top = lambda scores: np.argsort(-scores, axis=1, kind="stable")[:, :10]  # noqa: E731
    by_hand = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top(exact), top(coded))])
    assert full["agreement"] == pytest.approx(by_hand, abs=1e-9)
    assert full["on_sample"] == plan["chosen"]["objective"]
    # A corpus no larger than the sample is its own check: nothing more is measured.
    whole = run_label_free_plan(corpus_experiment, tmp_path / "whole", "agreement", target_retention=0.9, methods=["truncate"], dims=[48],
                                precisions=["float32"], peers=[], codecs=(), rounds=0, work=tmp_path / "work", held_out_fraction=0.1)
    assert "full_corpus" not in whole


@pytest.mark.parametrize("precision", ["int4", "int8", "float16"])  # trained tables, the plan's int8 ranges, nothing fitted
def test_the_full_corpus_check_encodes_in_blocks_with_the_plans_trained_tables(precision, corpus_experiment, tmp_path):
    from embedtune.workflows.full_corpus_check import full_corpus_agreement
    from embedtune.workflows.label_free import label_free_validation

    plan = run_label_free_plan(corpus_experiment, tmp_path / "plan", "agreement", target_retention=0.5, methods=["pca"], dims=[64],
                               precisions=[precision], peers=[], codecs=(), rounds=0, work=tmp_path / "work", held_out_fraction=0.1,
                               fit_sample=300, check_full_corpus=False)
    assert "full_corpus" not in plan and plan["chosen"]["setting"] == f"pca-64/{precision}"
    sampled, _ = plan_sample(corpus_experiment, fit_sample=300)
    validation = label_free_validation(sampled, "agreement", held_out_fraction=0.1)
    queries, held_out = validation.queries.vectors, validation.held_out
    whole = full_corpus_agreement(corpus_experiment, tmp_path / "plan", queries, held_out)
    blocks = full_corpus_agreement(corpus_experiment, tmp_path / "plan", queries, held_out, block=37)
    assert blocks["agreement"] == whole["agreement"] and 0.2 < whole["agreement"] < 1.0
    with pytest.raises(ValueError, match="one id per query"):
        full_corpus_agreement(corpus_experiment, tmp_path / "plan", queries, held_out[:-1])
    with pytest.raises(ValueError, match="not in the corpus, e.g. 'no-such-document'"):
        full_corpus_agreement(corpus_experiment, tmp_path / "plan", queries, [*held_out[:-1], "no-such-document"])


def plan_chosen(tmp_path) -> str:
    return json.loads((tmp_path / "plan" / "plan.json").read_text())["chosen"]["setting"]


def test_cli_plan_prints_the_sample_and_the_bill(corpus_experiment, tmp_path, capsys):
    from embedtune.cli import main

    np.save(tmp_path / "docs.npy", corpus_experiment.embeddings.doc_embeddings)
    (tmp_path / "ids.txt").write_text("".join(f"{i}\n" for i in corpus_experiment.embeddings.doc_ids))
    args = ["compress", "plan", "--label-free", "agreement", "--doc-embeddings", str(tmp_path / "docs.npy"), "--doc-ids", str(tmp_path / "ids.txt"),
            "--target-retention", "0.9", "--methods", "truncate", "--dims", "96", "--precisions", "float32", "int8", "--peers", "",
            "--codecs", "none", "--fit-sample", "400", "--price-per-gb-month", "2", "--work", str(tmp_path / "work")]
    assert main([*args, "--out", str(tmp_path / "plan")]) == 0
    printed = capsys.readouterr().out
    assert f"fit sample: 400 of {N_DOCS} rows (--fit-sample 400, seed 2027)" in printed
    assert f"full-corpus check: {plan_chosen(tmp_path)} finds " in printed and f"over all {N_DOCS:,} documents" in printed
    assert "$/mo@1B" in printed and "RAM@1B" in printed and "bill: $2 per GB" in printed and "given by the user" in printed
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    int8 = next(r for r in plan["sweep"] if r["setting"] == "frozen-384/int8")
    assert int8["usd_month@1B"] == pytest.approx((384e9 + int8["fixed_bytes"]) / 1e9 * 2)
    assert main([*args[:-6], "--fit-sample", "0", "--out", str(tmp_path / "bad")]) == 2
    assert "--fit-sample is a positive number of corpus rows; got 0." in capsys.readouterr().err


def test_timed_rounds_search_a_bounded_sample_of_the_queries_and_every_query_is_scored():
    from embedtune.workflows.plan import TIMING_QUERIES, QuerySet, score_precisions

    rng = np.random.default_rng(0)
    docs = rng.standard_normal((300, 16)).astype(np.float32)
    n_queries = TIMING_QUERIES + 50
    ids = [f"q{i}" for i in range(n_queries)]
    queries = QuerySet(ids, docs[:n_queries] + 0.01, {q: {f"d{i}": 1} for i, q in enumerate(ids)}, "val", ignore_identical_ids=False)
    rows = score_precisions(queries, [f"d{i}" for i in range(300)], docs, None, ["float32", "int8"], rounds=1)
    assert all(r["latency_queries"] == TIMING_QUERIES and r["n_queries"] == n_queries for r in rows)


def test_a_choice_that_falls_short_over_every_document_gives_way_to_a_dearer_one(corpus_experiment, tmp_path, caplog, monkeypatch):
    from embedtune.index.plan_format import load_plan
    from embedtune.workflows import plan as plan_module

    settings = dict(methods=["pca"], dims=[8, 32], precisions=["float32"], peers=[], codecs=(), rounds=0, held_out_fraction=0.1,
                    fit_sample=200)
    first = run_label_free_plan(corpus_experiment, tmp_path / "first", "agreement", target_retention=0.05, work=tmp_path / "work", **settings)
    assert first["chosen"]["setting"] == "pca-8/float32" and len(first["full_corpus_checks"]) == 1
    on_sample, served = first["full_corpus"]["on_sample"], first["full_corpus"]["agreement"]
    assert served < on_sample, "600 documents are denser than the 200 of the sample"
    target = (on_sample + served) / 2  # pca-8 keeps it on the sample, not over every document
    plan = run_label_free_plan(corpus_experiment, tmp_path / "plan", "agreement", target_retention=target, work=tmp_path / "work", **settings)
    checks = plan["full_corpus_checks"]
    assert [c["setting"] for c in checks] == ["pca-8/float32", "pca-32/float32"]
    assert checks[0]["agreement"] == served < target <= checks[1]["agreement"]
    assert plan["chosen"]["setting"] == plan["full_corpus"]["setting"] == "pca-32/float32" and plan["full_corpus"] == checks[1]
    assert plan["chosen"]["ram_bytes"] >= plan_module.VERIFY_STEP * 32
    written, compressor, precision, _ = load_plan(tmp_path / "plan")  # the folder holds the setting kept, its digests intact
    assert written["chosen"]["setting"] == "pca-32/float32" and written["full_corpus_checks"] == checks
    assert compressor.output_dim == 32 and precision.name == "float32"
    # With one measurement allowed, the plan keeps its sample's choice and warns.
    caplog.clear()
    monkeypatch.setattr(plan_module, "MAX_VERIFIED", 1)
    single = run_label_free_plan(corpus_experiment, tmp_path / "single", "agreement", target_retention=target, work=tmp_path / "work", **settings)
    assert single["chosen"]["setting"] == "pca-8/float32" and len(single["full_corpus_checks"]) == 1
    assert "below the target" in caplog.text and "the best of 1 settings measured" in caplog.text
