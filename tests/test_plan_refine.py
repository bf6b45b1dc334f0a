"""compress plan's ``+refine<N>`` settings: an in-RAM code finds N candidates, the original float32 vectors rank them.

With ``--allow-disk-rescore`` a plan scores a refined copy of every in-RAM row within the budget (tier
``disk-rescore``, RAM the code's bytes, N original vectors read per query) and FAISS's IndexRefineFlat over
PCA + PQ beside them; without it, no refined row exists. ``index build --plan`` keeps the original vectors
beside the codes (their sha256 in the manifest) and ``search`` ranks the candidates with them, as scored.
Small anisotropic toy data, as the codec plan tests use.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.evaluate.metrics import evaluate_run
from embedtune.evaluate.search import run_from_topk
from embedtune.index import load_index
from embedtune.index.codecs import Precision, QuantizedIndex
from embedtune.index.deploy_bundle import write_deploy_bundle
from embedtune.index.plan_format import load_plan
from embedtune.index.planned import build_planned_index
from embedtune.index.query import search_vectors
from embedtune.index.refine import ORIGINAL_VECTORS_FILE, Refine, RefinedIndex, faiss_refine_peers, refinable, split_refined
from embedtune.io import IntegrityError
from embedtune.workflows.label_free import label_free_validation, load_corpus_experiment, run_label_free_plan

D, CANDIDATES = 32, 20
#: One compressor at one dimension, the 4-bit codec at two small budgets, no FAISS peers: seconds.
QUICK = {"methods": ["truncate"], "dims": [16], "precisions": ["float32", "int8", "binary", "binary-asym", "binary-rescore"], "peers": [],
         "codecs": ("klt-pq4",), "codec_budgets": (4, 8), "rounds": 0}


def _toy_vectors(tmp_path, n_docs: int = 400):
    """``n_docs`` unit docs with a decaying spectrum and a common direction (as sentence embeddings have), as .npy + ids."""
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((n_docs, D)) * np.geomspace(1.0, 0.1, D) + 0.3
    docs = (docs / np.linalg.norm(docs, axis=1, keepdims=True)).astype(np.float32)
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(n_docs)))
    return tmp_path / "docs.npy", tmp_path / "docs.txt"


@pytest.fixture
def toy(tmp_path):
    return _toy_vectors(tmp_path)


def _plan(toy, out, **options):
    experiment = load_corpus_experiment(doc_embeddings=toy[0], doc_ids=toy[1])
    return experiment, run_label_free_plan(experiment, out, "agreement", **{**QUICK, "work": out.parent / "work", **options})


def test_refine_names_and_bytes():
    refine = Refine(100, 384)
    assert refine.disk_read_per_query() == 100 * 4 * 384 and refine.disk_bytes(16) == 16 + 4 * 384
    assert split_refined("pca-128/int8+refine100") == ("pca-128/int8", 100) and split_refined("pca-128/int8") == ("pca-128/int8", None)
    assert not refinable(Precision("binary-rescore"), False) and not refinable(Precision("binary-asym"), False)
    assert not refinable(Precision("float32"), True) and refinable(Precision("float32"), False) and refinable(Precision("klt-pq4:16"), True)
    assert not refinable(Precision("klt-sq:16"), True)  # the reference coder is never shipped
    # The FAISS user's route: PCA to half the width (a multiple of the PQ's sub-quantisers), 8-bit PQ at the budget.
    assert faiss_refine_peers(384, (16, 32)) == ["faiss:PCA192,PQ16", "faiss:PCA192,PQ32"]
    assert faiss_refine_peers(384, (16,), n_train=500) == []  # too few points for 256 centroids a codebook
    with pytest.raises(ValueError, match="candidates must be a positive integer"):
        Refine(0, 384)


def test_a_plan_refines_only_with_allow_disk_and_counts_the_bytes(toy, tmp_path):
    _, plan = _plan(toy, tmp_path / "ram", budget_bytes=8)
    assert not any("+refine" in r["setting"] for r in plan["sweep"]) and "refine_candidates" not in plan
    assert plan["chosen"]["tier"] == "ram" and "refine" not in plan
    assert all(not r["choosable"] for r in plan["sweep"] if r["tier"] == "disk-rescore")  # binary-rescore: scored, never chosen
    _, plan = _plan(toy, tmp_path / "disk", budget_bytes=8, allow_disk=True, refine_candidates=CANDIDATES)
    rows = {r["setting"]: r for r in plan["sweep"]}
    refined = {s: r for s, r in rows.items() if "+refine" in s}
    # Every in-RAM, shippable row within 8 B, and nothing else: not the rows above the budget, not binary-asym or
    # binary-rescore (which rescore already), not the textbook coder, not the uncompressed float32 vectors.
    expected = {f"{s}+refine{CANDIDATES}" for s, r in rows.items() if "+refine" not in s and r["tier"] == "ram" and r["ram_bytes"] <= 8
                and r["choosable"] and not s.endswith("/binary-asym")}
    assert set(refined) == expected and "truncate-16/binary+refine20" in refined and "frozen-32/klt-pq4:8+refine20" in refined
    for setting, row in refined.items():
        base = rows[split_refined(setting)[0]]
        assert row["precision"] == base["precision"] and row["refine"] == CANDIDATES and row["tier"] == "disk-rescore"
        assert row["ram_bytes"] == base["ram_bytes"] and row["bytes_ram"] == base["ram_bytes"] and row["choosable"]
        assert row["disk_bytes"] == base["ram_bytes"] + 4 * D and row["disk_read_per_query"] == CANDIDATES * 4 * D
        assert row["usd_month@1B"] == base["usd_month@1B"]  # the bill is RAM's: the original vectors are on disk
        # Exact rescoring of the candidates can only find more of the exact top-10 than the codes' own ranking.
        assert row["objective"] >= base["objective"] - 1e-9
    chosen = plan["chosen"]
    assert chosen.get("refine") == CANDIDATES and chosen["tier"] == "disk-rescore" and chosen["ram_bytes"] <= 8
    assert plan["refine"] == {"candidates": CANDIDATES, "original_dim": D, "vectors": ORIGINAL_VECTORS_FILE,
                              "disk_read_per_query": CANDIDATES * 4 * D}
    assert plan["ram_bytes"] == chosen["ram_bytes"] and plan["disk_bytes"] == chosen["ram_bytes"] + 4 * D
    assert plan["deployment"]["refine"]["candidates"] == CANDIDATES


def test_the_index_built_from_a_refined_plan_serves_what_was_scored(toy, tmp_path):
    out = tmp_path / "plan"
    experiment, plan = _plan(toy, out, budget_bytes=4, allow_disk=True, refine_candidates=CANDIDATES)
    chosen = plan["chosen"]
    assert chosen["setting"].endswith(f"+refine{CANDIDATES}") and chosen["method"] in ("truncate", "frozen")  # no fit: refit = sweep
    index_dir = build_planned_index(toy[0], tmp_path / "index", out, ids=toy[1])
    index = load_index(index_dir)
    assert index.manifest["plan"]["refine"]["candidates"] == CANDIDATES and index.manifest["files"]["original_vectors"] == ORIGINAL_VECTORS_FILE
    assert ORIGINAL_VECTORS_FILE in index.manifest["xxh3_128"] and isinstance(index.original_vectors, np.memmap)
    # The sweep's scoring of the chosen setting, rebuilt as the sweep builds it: the codes, then the original vectors.
    _, compressor, precision, calibration = load_plan(out)
    docs = experiment.embeddings.doc_embeddings
    scored = RefinedIndex(QuantizedIndex.build(compressor.transform(docs), precision, calibration=calibration), docs, Refine(CANDIDATES, D),
                          compressor)
    queries = label_free_validation(experiment, "agreement").queries
    D_scored, I_scored = scored.search(queries.vectors, 11)
    # `search --query-vectors`: the original-space vectors of the held-out documents, mapped and refined by the index.
    np.save(tmp_path / "queries.npy", queries.vectors)
    (tmp_path / "queries.txt").write_text("".join(f"{q}\n" for q in queries.ids))
    _, hits = search_vectors(index_dir, tmp_path / "queries.npy", tmp_path / "queries.txt", top_k=11, ignore_identical_ids=False)
    ids = list(experiment.embeddings.doc_ids)
    assert [[h["id"] for h in found] for found in hits] == [[ids[row] for row in rows] for rows in I_scored]
    assert np.allclose([[h["score"] for h in found] for found in hits], D_scored, atol=1e-6)
    # ... and the served ranking gives the objective the plan chose it by (agreement with the exact top-10).
    D_served, I_served = index.search(compressor.transform(queries.vectors), 101, original_queries=queries.vectors)
    served = evaluate_run(queries.judgments, run_from_topk(queries.ids, D_served, I_served, ids, 100, True), ("recall@10",))
    assert served["recall@10"] == pytest.approx(chosen["objective"])
    # An index that refines needs the queries' original vectors: a caller that gives only the codes' space is told so.
    with pytest.raises(ValueError, match="original vectors"):
        index.search(compressor.transform(queries.vectors), 10)


def test_a_tampered_original_vectors_file_is_refused(toy, tmp_path):
    out = tmp_path / "plan"
    _plan(toy, out, budget_bytes=4, allow_disk=True, refine_candidates=CANDIDATES)
    # The deploy bundle says that its stores serve the codes, and that the rescoring with the original vectors is the client's.
    deploy = write_deploy_bundle(out, tmp_path / "bundle", include_model=False)
    assert deploy["refine"]["candidates"] == CANDIDATES and "original_vectors.npy" in (tmp_path / "bundle" / "README.md").read_text()
    index_dir = build_planned_index(toy[0], tmp_path / "index", out, ids=toy[1])
    path = index_dir / ORIGINAL_VECTORS_FILE
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte of one original vector: a silently different rescoring
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=ORIGINAL_VECTORS_FILE):
        load_index(index_dir)
    path.unlink()  # gone altogether: the manifest still lists it
    with pytest.raises((IntegrityError, FileNotFoundError), match=ORIGINAL_VECTORS_FILE):
        load_index(index_dir)


def test_the_faiss_refine_peer_is_scored_beside_the_refined_rows(tmp_path):
    toy = _toy_vectors(tmp_path, n_docs=1100)  # 8-bit PQ: 256 centroids a codebook need a thousand training points
    _, plan = _plan(toy, tmp_path / "plan", budget_bytes=8, allow_disk=True, refine_candidates=CANDIDATES, methods=["frozen"],
                    precisions=["float32", "binary"])
    peers = {r["setting"]: r for r in plan["sweep"] if r["family"] == "FAISS PCA+PQ (IndexRefineFlat peer)"}
    assert set(peers) == {"frozen-32/faiss:PCA16,PQ4", "frozen-32/faiss:PCA16,PQ8",
                          f"frozen-32/faiss:PCA16,PQ4+refine{CANDIDATES}", f"frozen-32/faiss:PCA16,PQ8+refine{CANDIDATES}"}
    refined = peers[f"frozen-32/faiss:PCA16,PQ8+refine{CANDIDATES}"]
    assert refined["ram_bytes"] == 8 and refined["tier"] == "disk-rescore" and refined["disk_read_per_query"] == CANDIDATES * 4 * D


def test_cli_refine_flags(toy, tmp_path, capsys):
    common = ["compress", "plan", "--label-free", "agreement", "--doc-embeddings", str(toy[0]), "--doc-ids", str(toy[1]),
              "--methods", "truncate", "--dims", "16", "--precisions", "float32", "int8", "--peers", "", "--codecs", "none",
              "--budget-bytes", "16", "--work", str(tmp_path / "work")]
    assert main([*common, "--refine-candidates", "50", "--out", str(tmp_path / "bad")]) == 2
    assert "--allow-disk-rescore" in capsys.readouterr().err
    assert main([*common, "--allow-disk-rescore", "--refine-candidates", "0", "--out", str(tmp_path / "bad")]) == 2
    assert "--refine-candidates is a positive number" in capsys.readouterr().err
    assert main([*common, "--allow-disk-rescore", "--refine-candidates", "30", "--out", str(tmp_path / "plan")]) == 0
    printed = capsys.readouterr().out
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["chosen"]["setting"] == "truncate-16/int8+refine30" and plan["refine"]["candidates"] == 30
    assert "truncate-16/int8+refine30" in printed and "refine: each query's top 30" in printed
