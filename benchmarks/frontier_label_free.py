"""The label-free frontier: chosen without labels, scored with them afterwards.

    nice -n 10 .venv/bin/python benchmarks/frontier_label_free.py --data scifact --model minilm          # run (resumable)
    .venv/bin/python benchmarks/frontier_label_free.py --data scifact --model minilm --report-only       # REPORT.md + summary.json

What ``compress plan --label-free`` does, swept once and read at every budget. Two phases, one
JSON per (phase, setting) under ``RESULTS/<dataset>-<model>/``; a JSON that exists is skipped, so
a killed run resumes (fits are kept under ``--work``, not committed):

* ``val-agreement`` and ``val-pseudo-queries``: every unsupervised compressor (truncate, centred and
  uncentred PCA, DIVE's ``unsupervised`` preset at ``--dive-dims``) fitted on the corpus minus the
  held-out documents (:func:`embedtune.workflows.label_free.held_out_documents`, 10 %, at most
  1000), and the frozen vectors, at every precision, plus the FAISS peers, scored by each label-free
  objective (:func:`embedtune.workflows.label_free.label_free_validation`). No qrels are read.
* ``test``: the same settings refitted on every document, scored on the labelled test queries
  (SciFact ``beir-train``: the 300 test queries, with the seen/unseen split relative to
  ``qrels/train.tsv``; ArguAna: every judged query).

At each budget (bytes per vector in RAM) the report gives, per objective, the plan's pick (the
best objective among all settings), the pick among the label-free compressors and the pick among
the peers (frozen vectors at any precision, FAISS PQ/OPQ/fast-scan, RaBitQ, TurboQuant, SQ4), all
three chosen by the objective, then scored on test with paired permutation tests per subset; and
the best RaBitQ/TurboQuant setting of the frozen vectors that fits, against the best label-free
compressor setting, both best on test (an upper bound for each side, never a selection).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.bench.efficiency import machine_info
from embedtune.data.beir import load_beir
from embedtune.evaluate.subsets import query_subsets, training_positives
from embedtune.index.codecs import PRECISIONS, QuantizedIndex
from embedtune.io import atomic_write, atomic_write_json
from embedtune.runtime import set_progress, set_threads
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.label_free import LABEL_FREE_OBJECTIVES, OBJECTIVE_FIELDS, fit_label_free, label_free_validation
from embedtune.workflows.pareto import best_within
from embedtune.workflows.plan import (
    PROBE_ROWS,
    candidate_for,
    faiss_cache_dir,
    load_faiss_cache,
    peer_factories,
    precision_rows,
    save_faiss_cache,
    score_precisions,
    sweep_dims,
)
from embedtune.workflows.significance import paired_test

os.environ.setdefault("EMBEDTUNE_VECTORS_PATH", str(Path(__file__).resolve().parent / "data" / "vectors"))  # committed vectors (mpnet)

logger = logging.getLogger("frontier_label_free")

BUDGETS = (16, 32, 48, 64, 128, 384)
# 8-bit PQ trains for minutes per code on this shared CPU (PQ16: 279 s under today's load), so 8-bit PQ at
# 16 and 32 B and OPQ at 16 B; 4-bit fast-scan PQ (seconds) at every budget up to 64 B.
PEER_FACTORIES = {"pq": (16, 32), "opq": (16,), "pq-fs": (16, 32, 48, 64)}
ROTATION_PEERS = ("rabitq1", "rabitq1-rescore", "rabitq4", "turboquant1", "turboquant4")


def cell_file(root: Path, phase: str, setting: str) -> Path:
    candidate, precision = setting.split("/", 1)
    return root / phase / candidate / (precision.replace(":", "_").replace(",", "+") + ".json")


def run_group(root: Path, phase: str, name: str, rows_of, precisions: list[str], meta: dict[str, Any]) -> None:
    """Score one space at the missing precisions (``rows_of(missing)``) and write one JSON per precision."""
    missing = [p for p in precisions if not cell_file(root, phase, f"{name}/{p}").is_file()]
    if not missing:
        return
    start = time.perf_counter()
    rows = rows_of(missing)
    for row in rows:
        row.update(meta, setting=f"{name}/{row['precision']}", candidate_name=name, phase=phase)
        atomic_write_json(cell_file(root, phase, row["setting"]), row)
    logger.info("%s %s: %d precisions in %.0fs", phase, name, len(rows), time.perf_counter() - start)


def run(args: argparse.Namespace) -> None:
    root = Path(args.results) / f"{args.data_name}-{args.model}"
    work = Path(args.work) / f"{args.data_name}-{args.model}"
    experiment = load_experiment(args.data, args.model, protocol=args.protocol, split_seed=2027)
    d = experiment.embeddings.dim
    doc_ids = list(experiment.embeddings.doc_ids)
    docs = np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32)
    dims = args.dims or sweep_dims(d)
    factories = [f"faiss:{f}" for kind, budgets in PEER_FACTORIES.items() for f in peer_factories(d, budgets, (kind,), len(doc_ids))]
    precisions = list(PRECISIONS)
    meta = {"data": args.data_name, "model": args.model, "protocol": args.protocol}
    atomic_write_json(root / "run.json", {**meta, "machine": machine_info(), "command": " ".join(sys.argv), "dims": dims,
                                          "dive_dims": args.dive_dims, "budgets": list(BUDGETS), "seed": args.seed,
                                          "methods": args.methods, "factories": factories, "test_part": args.test_part})
    frozen_name = f"frozen-{d}"
    candidates = [candidate_for(m, k) for m in args.methods if m != "dive" for k in dims]
    candidates += [candidate_for("dive", k) for k in args.dive_dims] if "dive" in args.methods else []
    validations = {objective: label_free_validation(experiment, objective, seed=args.seed) for objective in args.objectives}
    held = next(iter(validations.values()))
    position = {doc_id: row for row, doc_id in enumerate(doc_ids)}
    fit_docs = docs[[position[doc] for doc in held.fit_doc_ids]]
    fit_part = f"held-out-{held.record['held_out_sha256'][:12]}"
    for objective, validation in validations.items():
        atomic_write_json(root / f"val-{objective}" / "validation.json", validation.record)
    per_query = {"agreement": "recall@10", "pseudo-queries": "ndcg@10"}

    def val_rows(objective: str, compressor, prebuilt=None):
        validation = validations[objective]

        def rows_of(missing: list[str]) -> list[dict[str, Any]]:
            rows = score_precisions(validation.queries, doc_ids, docs, compressor, missing, rounds=0, prebuilt=prebuilt,
                                    per_query_metric=per_query[objective])
            for row in rows:
                row["objective"] = row[OBJECTIVE_FIELDS[objective]]
            return rows
        return rows_of

    def test_rows(compressor, prebuilt=None):
        return lambda missing: precision_rows(experiment, args.test_part, compressor, missing, rounds=0, prebuilt=prebuilt)

    def frozen_groups(specs: list[str], prebuilt) -> None:
        for objective in validations:
            run_group(root, f"val-{objective}", frozen_name, val_rows(objective, None, prebuilt), specs, {**meta, "method": "frozen", "dim": d})
        run_group(root, "test", frozen_name, test_rows(None, prebuilt), specs, {**meta, "method": "frozen", "dim": d})

    def train_factories() -> dict:
        cache_dir = faiss_cache_dir(work, docs)
        probe = docs[:PROBE_ROWS]
        frozen_indexes = load_faiss_cache(cache_dir, probe)
        for name in factories:  # one at a time, each kept as soon as it is trained
            if name not in frozen_indexes:
                start = time.perf_counter()
                frozen_indexes[name] = (QuantizedIndex.build(docs, name), time.perf_counter() - start)
                save_faiss_cache(cache_dir, frozen_indexes, probe)
                logger.info("frozen %s trained in %.0fs", name, frozen_indexes[name][1])
        return frozen_indexes

    # The frozen vectors at every precision (RaBitQ, TurboQuant, SQ4 among them) first, then each quick compressor
    # (validation, then its refit on test), then DIVE, then the FAISS PQ/OPQ peers (8-bit ones train for minutes;
    # they may be trained into the same cache by another process meanwhile).
    frozen_groups(precisions, {})
    quick = [c for c in candidates if c.method != "dive"]
    for candidate in quick + [c for c in candidates if c.method == "dive"] + [None]:
        if candidate is None:
            frozen_groups(factories, train_factories())
            continue
        extra = {**meta, "method": candidate.method, "dim": candidate.dim}
        if any(not cell_file(root, f"val-{o}", f"{candidate.name}/{p}").is_file() for o in validations for p in precisions):
            compressor, fit_s = fit_label_free(candidate, held.fit_doc_ids, fit_docs, args.seed, work, fit_part)
            for objective in validations:
                run_group(root, f"val-{objective}", candidate.name, val_rows(objective, compressor), precisions, {**extra, "fit_s": fit_s})
        if any(not cell_file(root, "test", f"{candidate.name}/{p}").is_file() for p in precisions):
            compressor, fit_s = fit_label_free(candidate, doc_ids, docs, args.seed, work, "all")
            run_group(root, "test", candidate.name, test_rows(compressor), precisions, {**extra, "fit_s": fit_s})


# -- report ----------------------------------------------------------------------------------
def load_rows(root: Path, phase: str) -> dict[str, dict[str, Any]]:
    rows = {}
    for path in sorted((root / phase).rglob("*.json")):
        row = json.loads(path.read_text(encoding="utf-8"))
        if "setting" in row:
            rows[row["setting"]] = row
    return rows


def is_peer(row: dict[str, Any]) -> bool:
    return row["method"] == "frozen"


def is_rotation_peer(row: dict[str, Any]) -> bool:
    return is_peer(row) and row["precision"] in ROTATION_PEERS


def mean_on(row: dict[str, Any], ids: list[str]) -> float:
    return statistics.fmean(row["per_query"][q] for q in ids)


def compare(a: dict[str, Any], b: dict[str, Any], ids: list[str]) -> dict[str, Any]:
    result = paired_test(np.array([a["per_query"][q] for q in ids]), np.array([b["per_query"][q] for q in ids]))
    return {"a": mean_on(a, ids), "b": mean_on(b, ids), "difference": result.mean_difference, "ci_low": result.ci_low,
            "ci_high": result.ci_high, "p_value": result.p_value, "n_queries": result.n_queries}


def verdict(c: dict[str, Any]) -> str:
    if c["p_value"] < 0.05:
        return "ahead" if c["difference"] > 0 else "**behind**"
    return "tied"


def rotation_line(budget: int, ours: dict[str, Any] | None, theirs: dict[str, Any] | None, test: dict[str, dict[str, Any]],
                  groups: dict[str, list[str]]) -> tuple[str | None, dict[str, Any] | None]:
    """One budget's row of "a label-free setting against the frozen RaBitQ/TurboQuant", both chosen by the objective.

    Returns the table line (None when ``ours`` is None) and the per-subset comparison (None when either side is missing).
    """
    if ours is None:
        return None, None
    if theirs is None:
        return (f"| {budget} | {ours['setting']} ({ours['objective']:.4f}) | {mean_on(test[ours['setting']], groups['all']):.4f} "
                "| no RaBitQ/TurboQuant of the frozen vectors fits |" + " |" * (1 + len(groups))), None
    c = {name: compare(test[ours["setting"]], test[theirs["setting"]], ids) for name, ids in groups.items()}
    return (f"| {budget} | {ours['setting']} ({ours['objective']:.4f}) | {c['all']['a']:.4f} | {theirs['setting']} "
            f"({theirs['objective']:.4f}) | {c['all']['b']:.4f} | "
            + " | ".join(f"{c[g]['difference']:+.4f} ({c[g]['p_value']:.2g}) {verdict(c[g])}" for g in groups) + " |"), c


def report(args: argparse.Namespace) -> None:
    root = Path(args.results) / f"{args.data_name}-{args.model}"
    run_info = json.loads((root / "run.json").read_text(encoding="utf-8"))
    full = f"truncate-{run_info['dims'][0]}/"  # truncation to the full width is the frozen model itself: reported once, as frozen
    test = {k: v for k, v in load_rows(root, "test").items() if not k.startswith(full)}
    if not test:
        raise SystemExit(f"{root}: no test results yet.")
    n_test = next(iter(test.values()))["n_queries"]
    groups: dict[str, list[str]] = {"all": sorted(next(iter(test.values()))["per_query"])}
    if run_info["protocol"] == "beir-train":  # the seen/unseen subsets: relative to the train qrels
        test_qrels = load_beir(args.data, "test").qrels
        sub = query_subsets({q: test_qrels[q] for q in groups["all"]}, training_positives(load_beir(args.data, "train").qrels))
        groups.update(seen=sub["seen"], unseen=sub["unseen"])
    summary: dict[str, Any] = {"run": run_info, "n_test": n_test, "subsets": {k: len(v) for k, v in groups.items()}, "objectives": {}}
    lines = [f"# Label-free frontier: {args.data_name} / {args.model}", "",
             f"Machine: {run_info['machine']['cpu']} ({run_info['machine']['cpus']} CPUs, shared), {run_info['machine']['date']}. "
             f"Command: `{run_info['command']}`. Chosen without labels on held-out documents, scored on {n_test} labelled test "
             f"queries ({', '.join(f'{k} {len(v)}' for k, v in groups.items())}). {len(test)} settings on test.", ""]
    for objective in LABEL_FREE_OBJECTIVES:
        val = load_rows(root, f"val-{objective}")
        val = {s: r for s, r in val.items() if s in test}
        if not val:
            continue
        record = json.loads((root / f"val-{objective}" / "validation.json").read_text(encoding="utf-8"))
        reference = val[f"frozen-{run_info['dims'][0]}/float32"]["objective"]
        lines += [f"## Objective: {objective} ({record['metric']}; {record['n_queries']} {record['queries']}, "
                  f"compressors fitted on the other {record['fit_documents']} documents; frozen float32: {reference:.4f})", "",
                  "| budget | plan's pick (objective) | nDCG@10 " + " | ".join(groups) + " | best peer by the objective | nDCG@10 "
                  + " | ".join(groups) + " | Δ pick − peer (p) " + " | ".join(groups) + " |", "|---" * (4 + 3 * len(groups)) + "|"]
        budgets = []
        rotation_lines: list[str] = []
        dive_lines: list[str] = []
        for budget in BUDGETS:
            rows = list(val.values())
            pick = best_within(rows, budget, y="objective")
            peer = best_within([r for r in rows if is_peer(r)], budget, y="objective")
            ours = best_within([r for r in rows if not is_peer(r)], budget, y="objective")
            theirs = best_within([r for r in rows if is_rotation_peer(r)], budget, y="objective")
            if pick is None:
                lines.append(f"| {budget} | nothing fits |" + " |" * (2 + 3 * len(groups)))
                continue
            entry: dict[str, Any] = {"budget": budget, "pick": pick["setting"], "pick_objective": pick["objective"],
                                     "compressor_pick": ours["setting"] if ours else None}
            a = test[pick["setting"]]
            if peer is None:
                lines.append(f"| {budget} | {pick['setting']} ({pick['objective']:.4f}) | " + " | ".join(f"{mean_on(a, ids):.4f}" for ids in groups.values())
                             + " | no peer fits |" + " |" * (2 * len(groups)))
            else:
                b = test[peer["setting"]]
                cmp = {name: compare(a, b, ids) for name, ids in groups.items()}
                entry.update(peer=peer["setting"], peer_objective=peer["objective"], pick_vs_peer=cmp)
                same = pick["setting"] == peer["setting"]
                lines.append(f"| {budget} | {pick['setting']}{' (= peer)' if same else ''} ({pick['objective']:.4f}) | "
                             + " | ".join(f"{cmp[g]['a']:.4f}" for g in groups)
                             + f" | {peer['setting']} ({peer['objective']:.4f}) | " + " | ".join(f"{cmp[g]['b']:.4f}" for g in groups) + " | "
                             + " | ".join("same setting" if same else f"{cmp[g]['difference']:+.4f} ({cmp[g]['p_value']:.2g}) {verdict(cmp[g])}"
                                          for g in groups) + " |")
            dive = best_within([r for r in rows if r["method"] == "dive"], budget, y="objective")
            for side, key, out in ((ours, "compressor_vs_rotation", rotation_lines), (dive, "dive_vs_rotation", dive_lines)):
                line, c = rotation_line(budget, side, theirs, test, groups)
                if line:
                    out.append(line)
                if c:
                    entry.update(rotation_peer=theirs["setting"], **{key: c})
            budgets.append(entry)
        summary["objectives"][objective] = {"record": record, "reference": reference, "budgets": budgets}
        lines += ["", f"Label-free compressors (truncation below d, PCA, uncentred PCA, DIVE unsupervised; any precision) against "
                  f"RaBitQ/TurboQuant of the frozen vectors, each side chosen by {objective}, scored on test:", "",
                  "| budget | best compressor setting (objective) | nDCG@10 | best RaBitQ/TurboQuant (objective) | nDCG@10 | "
                  + " | ".join(f"Δ {g} (p)" for g in groups) + " |", "|---" * (5 + len(groups)) + "|"]
        lines += rotation_lines
        if dive_lines:
            lines += ["", f"Label-free DIVE alone (the `unsupervised` preset, any precision) against RaBitQ/TurboQuant of the frozen "
                      f"vectors, each side chosen by {objective}, scored on test:", "",
                      "| budget | best DIVE setting (objective) | nDCG@10 | best RaBitQ/TurboQuant (objective) | nDCG@10 | "
                      + " | ".join(f"Δ {g} (p)" for g in groups) + " |", "|---" * (5 + len(groups)) + "|"]
            lines += dive_lines
        lines.append("")
    # The two objectives against each other: what each picks, and how the picks compare on test.
    picks = {o: {e["budget"]: e["pick"] for e in summary["objectives"].get(o, {}).get("budgets", [])} for o in LABEL_FREE_OBJECTIVES}
    if all(picks.values()):
        lines += ["## The two objectives compared: each one's pick, scored on test (Δ: agreement's pick − pseudo-queries' pick)", "",
                  "| budget | agreement's pick | nDCG@10 | pseudo-queries' pick | nDCG@10 | best on test at ≤ budget | nDCG@10 | "
                  + " | ".join(f"Δ {g} (p)" for g in groups) + " |", "|---" * (7 + len(groups)) + "|"]
        versus = []
        for budget in BUDGETS:
            a_name, b_name = picks["agreement"].get(budget), picks["pseudo-queries"].get(budget)
            if a_name is None or b_name is None:
                continue
            best = best_within(list(test.values()), budget)
            c = {name: compare(test[a_name], test[b_name], ids) for name, ids in groups.items()}
            versus.append({"budget": budget, "agreement": a_name, "pseudo_queries": b_name, "oracle": best["setting"], "compare": c})
            lines.append(f"| {budget} | {a_name} | {c['all']['a']:.4f} | {b_name} | {c['all']['b']:.4f} | {best['setting']} | {best['ndcg@10']:.4f} | "
                         + " | ".join("same" if a_name == b_name else f"{c[g]['difference']:+.4f} ({c[g]['p_value']:.2g})" for g in groups) + " |")
        summary["objectives_compared"] = versus
        lines.append("")
    # The RaBitQ/TurboQuant question, on test (upper bounds of each side at the budget; no selection).
    lines += ["## Label-free compressors against RaBitQ / TurboQuant on the frozen vectors (best of each on test at ≤ budget)", "",
              "Both sides are the best setting on the test queries themselves: an upper bound for each, never a selection.", "",
              "| budget | best label-free compressor setting | nDCG@10 | best frozen RaBitQ/TurboQuant | nDCG@10 | "
              + " | ".join(f"Δ {g} (p)" for g in groups) + " |", "|---" * (5 + len(groups)) + "|"]
    rotation = []
    for budget in BUDGETS:
        rows = list(test.values())
        ours = best_within([r for r in rows if not is_peer(r)], budget)
        theirs = best_within([r for r in rows if is_rotation_peer(r)], budget)
        if ours is None or theirs is None:
            lines.append(f"| {budget} | {ours['setting'] if ours else '—'} | {ours['ndcg@10']:.4f} | none fits (RaBitQ 1-bit is "
                         f"{(run_info['dims'][0] // 8) + 8} B, TurboQuant 1-bit {run_info['dims'][0] // 8} B) |" + " |" * (1 + len(groups)) if ours else
                         f"| {budget} | none |" + " |" * (3 + len(groups)))
            continue
        cmp = {name: compare(ours, theirs, ids) for name, ids in groups.items()}
        rotation.append({"budget": budget, "compressor": ours["setting"], "rotation_peer": theirs["setting"], "compare": cmp})
        lines.append(f"| {budget} | {ours['setting']} | {cmp['all']['a']:.4f} | {theirs['setting']} | {cmp['all']['b']:.4f} "
                     "| " + " | ".join(f"{cmp[g]['difference']:+.4f} ({cmp[g]['p_value']:.2g}) {verdict(cmp[g])}" for g in groups) + " |")
    summary["rotation_peers"] = rotation
    lines += ["", "## Every setting on test", "", "| setting | RAM B | nDCG@10 | " + " | ".join(groups) + " | agreement | pseudo-queries |",
              "|---" * (5 + len(groups)) + "|"]
    val_by = {o: load_rows(root, f"val-{o}") for o in LABEL_FREE_OBJECTIVES}
    for row in sorted(test.values(), key=lambda r: (r["ram_bytes"], -r["ndcg@10"])):
        objs = [val_by[o].get(row["setting"], {}).get("objective") for o in LABEL_FREE_OBJECTIVES]
        lines.append(f"| {row['setting']} | {row['ram_bytes']} | {row['ndcg@10']:.4f} | " + " | ".join(f"{mean_on(row, ids):.4f}" for ids in groups.values())
                     + " | " + " | ".join("—" if v is None else f"{v:.4f}" for v in objs) + " |")
    atomic_write_json(root / "summary.json", summary)
    atomic_write(root / "REPORT.md", lambda tmp: tmp.write_text("\n".join(lines) + "\n", encoding="utf-8"))
    print("\n".join(line for line in lines if not line.startswith("| frozen") and not line.startswith("| pca") and
                    not line.startswith("| truncate") and not line.startswith("| dive")))
    print(f"wrote {root / 'REPORT.md'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="scifact", help="BEIR dataset name or folder")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--protocol", default=None, help="beir-train where qrels/train.tsv exists, else paper")
    parser.add_argument("--methods", nargs="+", default=["truncate", "pca", "pca-uncentred", "dive"])
    parser.add_argument("--dims", nargs="*", type=int, default=None, help="default d, d/2, d/3, d/6, d/12")
    parser.add_argument("--dive-dims", nargs="*", type=int, default=[128, 64], help="DIVE unsupervised (minutes a fit)")
    parser.add_argument("--objectives", nargs="+", default=list(LABEL_FREE_OBJECTIVES))
    parser.add_argument("--seed", type=int, default=2027)
    parser.add_argument("--results", default="benchmarks/results/frontier-label-free")
    parser.add_argument("--work", default="runs/label-free", help="fits and FAISS tables (not committed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report-only", action="store_true")
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
    args.test_part = "test" if args.protocol == "beir-train" else "all"
    if not args.report_only:
        set_threads(args.threads)
        set_progress(False)
        run(args)
    report(args)


if __name__ == "__main__":
    main()
