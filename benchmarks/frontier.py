"""Quality per byte: compressor × dimension × precision, FAISS PQ/OPQ peers, the Pareto frontier.

    nice -n 10 .venv/bin/python benchmarks/frontier.py --data scifact --model minilm        # run (resumable)
    .venv/bin/python benchmarks/frontier.py --data scifact --model minilm --report-only     # tables + PNG

Protocol ``beir-train`` for SciFact (fit on qrels/train, 20 % of it held out as validation;
scored on all 300 test queries), the paper's 60/20/20 split for ArguAna (no train qrels).
Two phases, each a set of groups (one fitted compressor scored at every precision):

* ``val``: every compressor fitted on the train queries with seed 2027, scored on the
  validation queries. Only these scores choose a setting at a byte budget.
* ``test``: fitted on train+val (3 seeds for trained methods), scored on the test queries.

Every (phase, compressor, dim, seed, precision) is one JSON under
``RESULTS/<dataset>-<model>/<phase>/<candidate>/s<seed>/<precision>.json``; a group whose JSONs
all exist is skipped, so a killed run resumes. Fitted compressors go under ``--work`` (not
committed). ``--report-only`` reads the JSONs and writes ``REPORT.md``, ``summary.json`` and
``frontier.png`` (and ``frontier_disk.png``, ``frontier_cost.png``: quality against the RAM bill at a billion
vectors) into ``RESULTS/<dataset>-<model>/``.

Budgets: at each of 16, 32, 48, 64, 128, 384 bytes per vector (RAM), embedtune's best setting
(a trained compressor — DIVE ``robust``, its quantisation-aware variants, Matryoshka-Adaptor —
at any precision, PQ, RaBitQ, TurboQuant and int4 on it included) against the best peer (frozen at any
precision, FAISS PQ/OPQ, RaBitQ, TurboQuant and int4 on the frozen vectors, truncation or either PCA at any
precision, PQ and the same quantisers on PCA; ``--quantisers`` with no codes leaves those out), both chosen
by validation nDCG@10 and compared on test with a paired permutation test and a bootstrap CI on
per-query nDCG@10 (trained settings: the mean over seeds per query).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.bench.efficiency import machine_info
from embedtune.data.beir import load_beir
from embedtune.data.splits import query_disjoint_split, train_qrels_split
from embedtune.evaluate.subsets import query_subsets, training_positives
from embedtune.index.bill import BILL_SCALES, DEFAULT_PRICE_PER_GB_MONTH, BillLine, bill_table, scale_label, vector_bill
from embedtune.index.codecs import QuantizedIndex
from embedtune.io import atomic_write, atomic_write_json
from embedtune.runtime import set_progress, set_threads
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.frontier_plot import plot_frontier
from embedtune.workflows.pareto import best_within, pareto_frontier
from embedtune.workflows.plan import (
    DEFAULT_PRECISIONS,
    QUANTISER_PEERS,
    VARIANTS,
    Candidate,
    candidate_for,
    faiss_cache_dir,
    fit_or_load,
    load_faiss_cache,
    peer_factories,
    precision_rows,
    save_faiss_cache,
    sweep_dims,
)
from embedtune.workflows.significance import paired_test

os.environ.setdefault("EMBEDTUNE_VECTORS_PATH", str(Path(__file__).resolve().parent / "data" / "vectors"))  # committed vectors (mpnet)

logger = logging.getLogger("frontier")

BUDGETS = (16, 32, 48, 64, 128, 384)
TRAINED = {"dive", "mrl-adaptor"}
PROJECTIONS = {"pca", "pca-uncentred"}  # unsupervised methods that also get PQ and the quantisers on their output
FAMILY = {"frozen": "frozen", "truncate": "truncate", "pca": "PCA", "pca-uncentred": "uncentred PCA", "dive": "DIVE",
          "mrl-adaptor": "Matryoshka-Adaptor"}
#: FAISS's RaBitQ, TurboQuant and 4-bit scalar codes: peers on the frozen vectors and on PCA, and precisions
#: on every compressor's output, at the bytes :func:`embedtune.workflows.plan.precision_rows` counts for each.
QUANTISERS = tuple(code for codes in QUANTISER_PEERS.values() for code in codes)
PQ_BUDGETS = (16, 32, 48, 64)
# 8-bit PQ trains for minutes per code on this CPU (k-means, 256 centroids per sub-quantizer): PQ at
# every budget up to 64 B, OPQ at 16 and 32 B only; 4-bit fast-scan (cheap to train) everywhere.
PEER_KINDS = {"pq": PQ_BUDGETS, "opq": (16, 32), "pq-fs": PQ_BUDGETS, "ivf-pq-fs": PQ_BUDGETS}
_FROZEN_INDEXES: dict = {}  # frozen-corpus indexes, shared by the val and test phases (same vectors)


def stacked_pq(dim: int) -> list[str]:
    """4-bit fast-scan PQ at the small budgets (``PQ{2B}x4fs`` = B bytes), on a compressed space whose width it divides."""
    return [f"faiss:PQ{2 * b}x4fs" for b in PQ_BUDGETS if dim % (2 * b) == 0 and 2 * b < dim]


def group_dir(root: Path, phase: str, name: str, seed: int) -> Path:
    return root / phase / name / f"s{seed}"


def precision_file(precision: str) -> str:
    return precision.replace(":", "_").replace(",", "+") + ".json"


def run_group(experiment, root: Path, work: Path, phase: str, method: str, dim: int, seed: int, precisions: list[str],
              variant: str = "default", rounds: int = 5, meta: dict | None = None) -> None:
    """Fit (or reload) one compressor and write one JSON per precision; skipped when all exist."""
    candidate = None if method == "frozen" else candidate_for(method, dim, variant)
    name = candidate.name if candidate is not None else f"frozen-{dim}"
    folder = group_dir(root, phase, name, seed)
    missing = [p for p in precisions if not (folder / precision_file(p)).is_file()]
    if not missing:
        return
    # A group that already has results gets its new precisions from a refit: score float32 again and check it
    # against the stored one, so that a changed recipe can never mix into an older group unnoticed.
    check = folder / precision_file("float32")
    verify = check.is_file() and "float32" not in missing
    start = time.perf_counter()
    compressor, fit_s = (None, 0.0) if candidate is None else fit_or_load(experiment, candidate, seed, final=(phase == "test"), work=work)
    part = "test" if phase == "test" else "val"
    rows = precision_rows(experiment, part, compressor, missing + (["float32"] if verify else []), rounds=rounds,
                          prebuilt=_FROZEN_INDEXES if method == "frozen" else None,
                          labels={"method": method, "variant": variant, "candidate": name, "seed": seed, "phase": phase, "fit_s": fit_s})
    if verify:
        stored = json.loads(check.read_text(encoding="utf-8"))["ndcg@10"]
        again = next(r for r in rows if r["precision"] == "float32")["ndcg@10"]
        if abs(stored - again) > 1e-6:
            raise SystemExit(f"{check}: float32 nDCG@10 {again:.6f} on a refit, {stored:.6f} stored; the recipe changed since this "
                             f"group was written. Use a new --results folder.")
        rows = [r for r in rows if r["precision"] != "float32"]
    for row in rows:
        row["setting"] = f"{name}/{row['precision']}"
        row.update(meta or {})
        atomic_write_json(folder / precision_file(row["precision"]), row)
    logger.info("%s %s s%d: %d precisions in %.0fs (best nDCG@10 %.4f)", phase, name, seed, len(rows), time.perf_counter() - start,
                max(r["ndcg@10"] for r in rows))


def run(args: argparse.Namespace) -> None:
    root = Path(args.results) / f"{args.data_name}-{args.model}"
    work = Path(args.work) / f"{args.data_name}-{args.model}"
    experiment = load_experiment(args.data, args.model, protocol=args.protocol, split_seed=2027)
    d = experiment.embeddings.dim
    dims = args.dims or sweep_dims(d)
    n_docs = len(experiment.embeddings.doc_ids)
    peers = [f"faiss:{f}" for kind, budgets in PEER_KINDS.items() for f in peer_factories(d, budgets, (kind,), n_docs)]
    meta = {"data": args.data_name, "model": args.model, "protocol": args.protocol}
    logger.info("%s/%s: %d docs, d=%d, dims %s, %d peers, methods %s", args.data_name, args.model, n_docs, d, dims, len(peers), args.methods)
    atomic_write_json(root / "run.json", {**meta, "machine": machine_info(), "command": " ".join(sys.argv), "dims": dims,
                                          "budgets": list(BUDGETS), "seeds": args.seeds, "methods": args.methods, "variants": args.variants,
                                          "quantisers": args.quantisers})
    phases = [p for p in ("val", "test") if p in args.phases]
    docs = np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32)
    cache_dir = faiss_cache_dir(work, docs)
    _FROZEN_INDEXES.update(load_faiss_cache(cache_dir))
    for precision in peers:  # one at a time, each kept on disk as soon as it is trained
        if precision not in _FROZEN_INDEXES and any(not (group_dir(root, ph, f"frozen-{d}", args.seeds[0]) / precision_file(precision)).is_file()
                                                    for ph in phases):
            start = time.perf_counter()
            _FROZEN_INDEXES[precision] = (QuantizedIndex.build(docs, precision), time.perf_counter() - start)
            save_faiss_cache(cache_dir, _FROZEN_INDEXES)
            logger.info("frozen %s trained in %.0fs", precision, _FROZEN_INDEXES[precision][1])
    # Unsupervised groups first (both phases), then each trained method, validation before test, so the
    # key comparisons fill in early; the FAISS indexes of the frozen corpus are trained once (kept in --work).
    for phase in phases:
        run_group(experiment, root, work, phase, "frozen", d, args.seeds[0], list(DEFAULT_PRECISIONS) + args.quantisers + peers,
                  rounds=args.rounds, meta=meta)
        for method in [m for m in args.methods if m not in TRAINED]:
            for dim in dims:
                extra = stacked_pq(dim) + args.quantisers if method in PROJECTIONS else []
                run_group(experiment, root, work, phase, method, dim, args.seeds[0], list(DEFAULT_PRECISIONS) + extra, rounds=args.rounds, meta=meta)
    trained = [(m, "default", dims) for m in args.methods if m == "dive"]
    trained += [("dive", v, [k for k in dims if k in (args.variant_dims or dims)]) for v in args.variants]
    trained += [(m, "default", dims) for m in args.methods if m in TRAINED and m != "dive"]
    for method, variant, method_dims in trained:
        for phase in phases:
            for seed in (args.seeds[:1] if phase == "val" else args.seeds):
                for dim in method_dims:
                    extra = stacked_pq(dim) + args.quantisers if variant == "default" else []
                    run_group(experiment, root, work, phase, method, dim, seed, list(DEFAULT_PRECISIONS) + extra, variant=variant,
                              rounds=args.rounds, meta=meta)


# -- report ----------------------------------------------------------------------------------
def load_rows(root: Path, phase: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted((root / phase).rglob("*.json"))]


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per setting: metric means over seeds, per-query means over seeds."""
    by_setting: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_setting[row["setting"]].append(row)
    out = []
    for setting, runs in sorted(by_setting.items()):
        first = runs[0]
        queries = sorted(first["per_query"])
        merged = {k: v for k, v in first.items() if k not in ("per_query", "seed")}
        merged["seeds"] = sorted(r["seed"] for r in runs)
        for key in ("ndcg@10", "recall@10", "recall@100", "latency_ms", "latency_vs_reference", "fit_s"):
            values = [r[key] for r in runs if r.get(key) is not None]
            merged[key] = statistics.fmean(values) if values else None
            if key in ("ndcg@10", "recall@10"):
                merged[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        merged["per_query"] = {q: statistics.fmean(r["per_query"][q] for r in runs) for q in queries}
        merged["family"] = family(first)
        merged["embedtune"] = first["method"] in TRAINED
        out.append(merged)
    return out


def family(row: dict[str, Any]) -> str:
    method, precision = row["method"], row["precision"]
    if method == "frozen" and precision.startswith("faiss:"):
        return "FAISS PQ/OPQ (frozen)"
    if method == "frozen" and precision in QUANTISERS:
        return "RaBitQ/TurboQuant/int4 (frozen)"
    name = FAMILY[method]
    if row.get("variant", "default") != "default":
        name += f" {row['variant']}"
    return name + (" + PQ" if precision.startswith("faiss:") else " + RaBitQ/TurboQuant/int4" if precision in QUANTISERS else "")


def rescored(rows: list[dict[str, Any]], ids: list[str] | None) -> list[dict[str, Any]]:
    """``rows`` with ``ndcg@10`` re-averaged over ``ids`` (None: unchanged)."""
    if ids is None:
        return rows
    return [{**r, "ndcg@10": statistics.fmean(r["per_query"][q] for q in ids)} for r in rows]


def budget_table(val: list[dict[str, Any]], test: list[dict[str, Any]], x: str = "ram_bytes") -> list[dict[str, Any]]:
    test_by = {r["setting"]: r for r in test}
    val = [r for r in val if r["setting"] in test_by]
    out = []
    for budget in BUDGETS:
        ours = best_within([r for r in val if r["embedtune"]], budget, x)
        peer = best_within([r for r in val if not r["embedtune"]], budget, x)
        oracle_ours = best_within([r for r in test if r["embedtune"]], budget, x)
        oracle_peer = best_within([r for r in test if not r["embedtune"]], budget, x)
        row: dict[str, Any] = {"budget": budget, "bytes": x}
        if ours is None or peer is None:
            row["note"] = "no setting of one side fits"
            out.append(row)
            continue
        a, b = test_by[ours["setting"]], test_by[peer["setting"]]
        queries = sorted(set(a["per_query"]) & set(b["per_query"]))
        test_result = paired_test(np.array([a["per_query"][q] for q in queries]), np.array([b["per_query"][q] for q in queries]))
        row.update({
            "embedtune": a["setting"], "embedtune_bytes": a[x], "embedtune_ndcg": a["ndcg@10"], "embedtune_std": a["ndcg@10_std"],
            "embedtune_seeds": len(a["seeds"]), "embedtune_val": ours["ndcg@10"],
            "peer": b["setting"], "peer_bytes": b[x], "peer_ndcg": b["ndcg@10"], "peer_val": peer["ndcg@10"],
            "difference": test_result.mean_difference, "ci_low": test_result.ci_low, "ci_high": test_result.ci_high,
            "p_value": test_result.p_value, "n_queries": test_result.n_queries,
            "oracle_embedtune": oracle_ours["setting"], "oracle_embedtune_ndcg": oracle_ours["ndcg@10"],
            "oracle_peer": oracle_peer["setting"], "oracle_peer_ndcg": oracle_peer["ndcg@10"],
        })
        out.append(row)
    return out


def test_subsets(data: str, protocol: str, test_ids: list[str]) -> tuple[dict[str, list[str]], str]:
    """The seen/unseen test queries, relative to the labels the test-phase fits used, and what "seen" means.

    ``beir-train`` fits on ``qrels/train.tsv`` (train and validation parts); the paper protocol fits
    on the train and validation parts of the query-disjoint split of ``qrels/test.tsv`` (seed 2027,
    as :func:`run` loads it), so a test query is seen when its positives were those queries' positives.
    """
    test_qrels = load_beir(data, "test").qrels
    if protocol == "beir-train":
        seen_docs, seen_from = training_positives(load_beir(data, "train").qrels), "a train-qrels query"
    else:
        split = query_disjoint_split(load_beir(data, "test"), seed=2027)
        seen_docs, seen_from = training_positives(test_qrels, split.train_val), "a train or validation query of the split"
    return query_subsets({q: test_qrels[q] for q in test_ids if q in test_qrels}, seen_docs), seen_from


def subset_budget_lines(budgets: list[dict[str, Any]], test: list[dict[str, Any]], groups: dict[str, list[str]],
                        seen_from: str = "a train-qrels query") -> list[str]:
    """The val-chosen settings of each budget re-scored on seen and unseen test queries, with a paired
    test on each subset and the best setting of each side on unseen queries at the budget (chosen on test: an upper
    bound, never a selection). A subset without queries prints "–"."""
    by = {r["setting"]: r for r in test}
    mean = lambda row, ids: f"{statistics.fmean(row['per_query'][q] for q in ids):.4f}" if ids else "–"  # noqa: E731

    def compared(a: dict[str, Any], b: dict[str, Any], ids: list[str]) -> tuple[str, dict[str, Any]]:
        if len(ids) < 2:
            return "–", {}
        result = paired_test(np.array([a["per_query"][q] for q in ids]), np.array([b["per_query"][q] for q in ids]))
        return f"{result.mean_difference:+.4f} ({result.p_value:.2g})", {"p_value": result.p_value, "difference": result.mean_difference}

    lines = [f"seen {len(groups['seen'])}, unseen {len(groups['unseen'])}, mixed {len(groups['mixed'])} test queries (seen: every "
             f"positive was a positive of {seen_from}; unseen: none was). Δ: embedtune − peer, paired permutation p on the subset.", "",
             "| budget | embedtune (val-chosen) | seen | unseen | peer (val-chosen) | seen | unseen | Δ seen (p) | Δ unseen (p) "
             "| verdict on unseen | best on unseen at ≤ budget: embedtune / peer |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    ids = groups["unseen"]
    for r in budgets:
        if "difference" not in r:
            continue
        a, b = by[r["embedtune"]], by[r["peer"]]
        seen_text, _ = compared(a, b, groups["seen"])
        unseen_text, unseen_row = compared(a, b, ids)
        fits = [row for row in test if row["ram_bytes"] <= r["budget"]]
        best = ""
        if ids:
            key = lambda row: statistics.fmean(row["per_query"][q] for q in ids)  # noqa: E731
            best_ours = max((row for row in fits if row["embedtune"]), key=key)
            best_peer = max((row for row in fits if not row["embedtune"]), key=key)
            best = f"{mean(best_ours, ids)} ({best_ours['setting']}) / {mean(best_peer, ids)} ({best_peer['setting']})"
        lines.append(f"| {r['budget']} | {a['setting']} | {mean(a, groups['seen'])} | {mean(a, ids)} | {b['setting']} "
                     f"| {mean(b, groups['seen'])} | {mean(b, ids)} | {seen_text} | {unseen_text} | {verdict(unseen_row)} | {best} |")
    return lines


def verdict(row: dict[str, Any]) -> str:
    if "difference" not in row:
        return "n/a"
    if row["p_value"] < 0.05:
        return "ahead" if row["difference"] > 0 else "**behind**"
    return "tied (p ≥ 0.05)"


def qat_table(test: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each quantisation-aware DIVE setting against the same DIVE trained in float, at the same precision."""
    by = {r["setting"]: r for r in test}
    out = []
    for row in test:
        if row["method"] != "dive" or row.get("variant", "default") == "default":
            continue
        base = by.get(f"dive-{row['dim']}/{row['precision']}")
        if base is None:
            continue
        queries = sorted(set(row["per_query"]) & set(base["per_query"]))
        result = paired_test(np.array([row["per_query"][q] for q in queries]), np.array([base["per_query"][q] for q in queries]))
        out.append({"setting": row["setting"], "bytes": row["ram_bytes"], "qat": row["ndcg@10"], "qat_std": row["ndcg@10_std"],
                    "float": base["ndcg@10"], "float_std": base["ndcg@10_std"], "seeds": len(row["seeds"]),
                    "difference": result.mean_difference, "ci_low": result.ci_low, "ci_high": result.ci_high, "p_value": result.p_value})
    return sorted(out, key=lambda r: (r["bytes"], r["setting"]))


#: The corpus size the cost plot bills (the largest of the bill's scales) and its column.
BILL_AT = scale_label(BILL_SCALES[-1])
COST = f"usd_month@{BILL_AT}"


def bill_lines(budgets: list[dict[str, Any]], test: list[dict[str, Any]], run_info: dict[str, Any]) -> list[str]:
    """The bill of each budget's two chosen settings (:func:`embedtune.index.bill.bill_table`), float32 first."""
    by_setting = {r["setting"]: r for r in test}
    dim = int(run_info.get("input_dim") or max(run_info["dims"]))
    rows = []
    for b in budgets:
        for side in ("embedtune", "peer"):
            if side in b:
                r = by_setting[b[side]]
                read = f"{r['disk_bytes'] - r['ram_bytes']:g} B" if r["disk_bytes"] > r["ram_bytes"] else "–"
                rows.append(BillLine(f"{b['budget']} B ({side})", f"`{r['setting']}`", r["ram_bytes"], r.get("fixed_bytes") or 0.0, read))
    return bill_table(rows, dim, disk_header="kept on disk per vector (float rows for rescoring)")


def budget_lines(budgets: list[dict[str, Any]]) -> list[str]:
    lines = ["| budget | embedtune (val-chosen) | B | nDCG@10 (test) | best peer (val-chosen) | B | nDCG@10 (test) | Δ [95 % CI] | p | verdict "
             "| best on test: embedtune / peer |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in budgets:
        if "difference" not in r:
            lines.append(f"| {r['budget']} | {r.get('note', '')} |||||||||")
            continue
        lines.append(f"| {r['budget']} | {r['embedtune']} | {r['embedtune_bytes']} | {r['embedtune_ndcg']:.4f} ± {r['embedtune_std']:.4f} "
                     f"| {r['peer']} | {r['peer_bytes']} | {r['peer_ndcg']:.4f} | {r['difference']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] "
                     f"| {r['p_value']:.4f} | {verdict(r)} | {r['oracle_embedtune_ndcg']:.4f} ({r['oracle_embedtune']}) / "
                     f"{r['oracle_peer_ndcg']:.4f} ({r['oracle_peer']}) |")
    return lines


def report(args: argparse.Namespace) -> None:
    root = Path(args.results) / f"{args.data_name}-{args.model}"
    run_info = json.loads((root / "run.json").read_text(encoding="utf-8"))
    full = max(run_info["dims"])
    # Truncation to the full width is the frozen model itself: report it once, as frozen.
    distinct = lambda rows: [r for r in rows if not (r["method"] == "truncate" and r["dim"] == full)]  # noqa: E731
    val, test = distinct(aggregate(load_rows(root, "val"))), distinct(aggregate(load_rows(root, "test")))
    if not test:
        raise SystemExit(f"{root}: no test results yet.")
    frontier = pareto_frontier(test)
    n_queries = test[0]["n_queries"]
    plot_frontier(test, root / "frontier.png", f"{args.data_name} / {args.model}: nDCG@10 on {n_queries} test queries vs bytes per vector "
                  f"(trained: mean of seeds)", group=lambda r: r["family"])
    plot_frontier(test, root / "frontier_disk.png", f"{args.data_name} / {args.model}: nDCG@10 on {n_queries} test queries vs bytes on disk "
                  f"(float vectors kept for rescoring count)", x="disk_bytes", group=lambda r: r["family"])
    dim = int(run_info.get("input_dim") or max(run_info["dims"]))
    billed = [{**r, COST: vector_bill(r["ram_bytes"], dim, r.get("fixed_bytes") or 0.0)[COST]} for r in test]
    plot_frontier(billed, root / "frontier_cost.png", f"{args.data_name} / {args.model}: nDCG@10 on {n_queries} test queries vs the RAM "
                  f"bill of {BILL_AT} vectors", x=COST, group=lambda r: r["family"],
                  x_label=f"dollars a month for {BILL_AT} vectors in RAM at ${DEFAULT_PRICE_PER_GB_MONTH:g} per GB-month (an assumption)")
    choose_on = None
    if run_info["protocol"] == "beir-train" and getattr(args, "choose_on", "unseen-val") == "unseen-val":
        # Choose on the validation queries whose positives no train-part query has: the others
        # reward a compressor that learned where the popular documents lie.
        train_data = load_beir(args.data, "train")
        split = train_qrels_split(train_data, load_beir(args.data, "test"), 0.2, 2027)
        choose_on = query_subsets({q: train_data.qrels[q] for q in split.val}, training_positives(train_data.qrels, split.train))["unseen"]
    budgets = budget_table(rescored(val, choose_on), test)
    budgets_disk = budget_table(rescored(val, choose_on), test, "disk_bytes")
    qat = qat_table(test)
    summary = {"run": run_info, "budgets": budgets, "budgets_disk": budgets_disk, "qat": qat,
               "frontier": [{k: v for k, v in r.items() if k != "per_query"} for r in frontier],
               "settings": [{k: v for k, v in r.items() if k != "per_query"} for r in test]}
    atomic_write_json(root / "summary.json", summary)
    lines = [f"# Quality per byte: {args.data_name} / {args.model}", "",
             f"Machine: {run_info['machine']['cpu']} ({run_info['machine']['cpus']} CPUs), {run_info['machine']['date']}. "
             f"Command: `{run_info['command']}`. Protocol {run_info['protocol']}; {n_queries} test queries; "
             f"{len(test)} settings on test, {len(val)} on validation.", "",
             "## Per budget (bytes per vector in RAM): chosen on validation, scored on test", "",
             (f"Chosen on the {len(choose_on)} validation queries whose positives no train-part query has." if choose_on is not None
              else "Chosen on every validation query."), ""]
    lines += budget_lines(budgets)
    lines += ["", "What each chosen setting costs at scale (RAM bytes, fixed tables included; price an assumption, as in "
              "`compress plan --price-per-gb-month`):", "", *bill_lines(budgets, test, run_info)]
    groups, seen_from = test_subsets(args.data, run_info["protocol"], sorted(test[0]["per_query"]))
    lines += ["", "## Per budget, on seen and unseen test queries", ""]
    lines += subset_budget_lines(budgets, test, groups, seen_from)
    lines += ["", "## Per budget of bytes on disk (float vectors kept for rescoring count): chosen on validation, scored on test", ""]
    lines += budget_lines(budgets_disk)
    lines += ["", "## Pareto frontier on test (bytes in RAM; disk bytes include float vectors kept for rescoring)", "",
              "| setting | family | RAM B | disk B | fixed B | nDCG@10 | Recall@10 | latency ms (batch) | × frozen f32 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in frontier:
        lines.append(f"| {r['setting']} | {r['family']} | {r['ram_bytes']} | {r['disk_bytes']} | {r['fixed_bytes']} | {r['ndcg@10']:.4f} "
                     f"| {r['recall@10']:.4f} | {r['latency_ms']:.2f} | {r['latency_vs_reference']:.2f} |")
    if qat:
        lines += ["", "## Quantisation-aware DIVE against the same DIVE trained in float (test, paired over queries)", "",
                  "| setting | B | QAT nDCG@10 | float nDCG@10 | Δ [95 % CI] | p | seeds |", "|---|---|---|---|---|---|---|"]
        for r in qat:
            lines.append(f"| {r['setting']} | {r['bytes']} | {r['qat']:.4f} ± {r['qat_std']:.4f} | {r['float']:.4f} ± {r['float_std']:.4f} "
                         f"| {r['difference']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] | {r['p_value']:.4f} | {r['seeds']} |")
    lines += ["", "## Every setting on test", "",
              "| setting | RAM B | disk B | nDCG@10 | ± | Recall@10 | latency ms | seeds |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(test, key=lambda r: (r["ram_bytes"], -r["ndcg@10"])):
        lines.append(f"| {r['setting']} | {r['ram_bytes']} | {r['disk_bytes']} | {r['ndcg@10']:.4f} | {r['ndcg@10_std']:.4f} | {r['recall@10']:.4f} "
                     f"| {r['latency_ms']:.2f} | {len(r['seeds'])} |")
    atomic_write(root / "REPORT.md", lambda tmp: tmp.write_text("\n".join(lines) + "\n", encoding="utf-8"))
    print("\n".join(lines[:8 + len(budgets)]))
    print(f"wrote {root / 'REPORT.md'}, {root / 'summary.json'}, {root / 'frontier.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="scifact", help="BEIR dataset name or folder")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--protocol", default=None, help="beir-train (default where qrels/train.tsv exists) or paper")
    parser.add_argument("--methods", nargs="+", default=["truncate", "pca", "dive", "mrl-adaptor"])
    parser.add_argument("--variants", nargs="*", default=[], help=f"DIVE variants: {sorted(VARIANTS)}")
    parser.add_argument("--variant-dims", nargs="*", type=int, default=None, help="dims of the variants (default: all)")
    parser.add_argument("--dims", nargs="*", type=int, default=None, help="default d, d/2, d/3, d/6, d/12")
    parser.add_argument("--seeds", nargs="+", type=int, default=[2027, 2028, 2029])
    parser.add_argument("--phases", nargs="+", default=["val", "test"])
    parser.add_argument("--quantisers", nargs="*", default=list(QUANTISERS), choices=list(QUANTISERS),
                        help="FAISS RaBitQ/TurboQuant/int4 codes: peers on frozen and PCA, precisions on trained outputs (none: leave out)")
    parser.add_argument("--rounds", type=int, default=5, help="timed search rounds per group")
    parser.add_argument("--results", default="benchmarks/results/frontier")
    parser.add_argument("--work", default="runs/frontier", help="fitted compressors (not committed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--choose-on", choices=["unseen-val", "all-val"], default="unseen-val",
                        help="validation queries that choose each budget's settings (beir-train): those whose positives no train-part query has, or all")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("faiss.loader", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.data_name = Path(args.data).name
    if args.protocol is None:
        try:
            load_beir(args.data, "train")
            args.protocol = "beir-train"
        except (FileNotFoundError, ValueError):
            args.protocol = "paper"
    if not args.report_only:
        set_threads(args.threads)
        set_progress(False)
        run(args)
    report(args)


if __name__ == "__main__":
    main()
