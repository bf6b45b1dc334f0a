"""Label-free DIVE against PCA on every judged collection: is unsupervised DIVE ever worth its fit?

For each collection, k and seed: DIVE's ``unsupervised`` preset as ``compress fit --unsupervised``
runs it on given vectors (its defaults: at most 50 corpus passes, patience 5, a seeded sample of at most 4,096
training documents, start and epoch selected on held-out documents' rank KL to the frozen space),
beside centred and uncentred PCA fitted on the same documents. No query and no label fits or
selects anything, so every judged query is one whose positives training never saw: "all" is
"unseen" here.

``dive@pq-anchors`` (``--methods``) is the same preset with ``pseudo_query_weight=1``: each
training document's pseudo-query (its title; NPL, which has none, its first 12 words; never a
pseudo-query that is the whole document) is an anchor too, distilling how the frozen space ranks
the training documents for that query-like text. Still no query and no label.

``dive@guarded`` is ``dive@pq-anchors`` with ``training_guard='pseudo-queries'``: the held-out
documents' pseudo-queries must retrieve their own documents significantly better (one-sided
paired sign-flip test, p < 0.05) with the trained adapter than with the PCA start, or the fit
keeps the start; and the other start replaces the selected one only where they prefer it by the
same test. It is the preset ``unsupervised-guarded``, which ``compress fit --unsupervised`` runs
from a corpus's text. Still no query and no label.

Scored: nDCG@10 on every judged test query. The comparison is with the **stronger PCA variant
on the test queries** (chosen after the fact, which favours PCA), paired over queries with DIVE's
per-query nDCG@10 averaged over the seeds (:func:`embedtune.workflows.significance.paired_test`).

One JSON per (collection, k, method, seed) under ``--out``; finished cells are skipped, so a
stopped run resumes. ``--report`` writes ``REPORT.md`` from the cells.

Usage::

    python benchmarks/label_free_dive.py                                   # scifact arguana npl cacm med, k = 64 128, 3 seeds
    python benchmarks/label_free_dive.py --datasets med --dims 64 --seeds 2027
    python benchmarks/label_free_dive.py --model mpnet --datasets scifact arguana --methods dive dive@guarded   # k = 128 256
    python benchmarks/label_free_dive.py --report
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from embedtune import __version__  # noqa: E402
from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.compress import get_compressor_class  # noqa: E402
from embedtune.compress.base import TrainingData  # noqa: E402
from embedtune.compress.dive import DIVECompressor, DIVEConfig  # noqa: E402
from embedtune.data.beir import load_beir  # noqa: E402
from embedtune.evaluate.retrieval import evaluate_embeddings  # noqa: E402
from embedtune.io import atomic_write_bytes, atomic_write_json  # noqa: E402
from embedtune.workflows.significance import align_by_query, paired_test  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "label-free-dive"
DATASETS = ("scifact", "arguana", "npl", "cacm", "med")
#: The collections with committed mpnet vectors (``--model mpnet``); their cells are under ``<collection>-mpnet/``.
MPNET_DATASETS = ("scifact", "arguana")
MODELS = ("minilm", "mpnet")
SEEDS = (2027, 2028, 2029)
METHODS = ("dive", "dive@pq-anchors", "dive@guarded")
#: Each setting's DIVE preset and settings on top of it.
PRESET_OF: dict[str, tuple[str, dict[str, Any]]] = {"dive": ("unsupervised", {}),
                                                    "dive@pq-anchors": ("unsupervised", {"pseudo_query_weight": 1.0}),
                                                    "dive@guarded": ("unsupervised-guarded", {})}
#: What each setting adds to, for the report's last column.
TWIN = {"dive@pq-anchors": "dive", "dive@guarded": "dive@pq-anchors"}
#: Where each collection's pseudo-queries come from: NPL's documents have neither a title nor a sentence end.
PSEUDO_SOURCE = {"npl": "first-words"}


def vectors_path(name: str, model: str = "minilm") -> Path:
    committed = ROOT / "benchmarks" / "data" / "vectors" / f"{name}-{model}-vectors.npz"
    return committed if committed.is_file() else ROOT / "src" / "embedtune" / "datasets" / f"{name}-{model}-vectors.npz"


def folder_name(name: str, model: str) -> str:
    """Where a collection's cells go: ``<collection>`` for MiniLM, ``<collection>-<model>`` for another model."""
    return name if model == "minilm" else f"{name}-{model}"


def load(name: str, data_root: Path, model: str = "minilm") -> dict[str, Any]:
    """The committed vectors of ``name`` by ``model`` and its judged test queries."""
    data = load_beir(data_root / name, "test")
    with np.load(vectors_path(name, model), allow_pickle=False) as bundle:
        doc_ids = [str(i) for i in bundle["document_ids"]]
        docs = np.ascontiguousarray(bundle["document"], dtype=np.float32)
        all_ids = [str(i) for i in bundle["query_ids"]]
        all_queries = np.ascontiguousarray(bundle["query"], dtype=np.float32)
    judged = [i for i, q in enumerate(all_ids) if any(rel > 0 for rel in data.qrels.get(q, {}).values())]
    return {"name": name, "qrels": data.qrels, "doc_ids": doc_ids, "docs": docs,
            "query_ids": [all_ids[i] for i in judged], "queries": all_queries[judged],
            "vectors": str(vectors_path(name, model).relative_to(ROOT))}


def score(ds: dict[str, Any], transform) -> tuple[float, dict[str, float]]:
    metrics = evaluate_embeddings(ds["query_ids"], transform(ds["queries"]), ds["doc_ids"], transform(ds["docs"]), ds["qrels"])
    return float(metrics.aggregate["ndcg@10"]), {q: round(float(v["ndcg@10"]), 6) for q, v in metrics.per_query.items()}


def cell_file(out: Path, name: str, dim: int, method: str, seed: int) -> Path:
    return out / name / f"k{dim}-{method}-s{seed}.json"


def training_pseudo_queries(name: str, data_root: Path, model: str = "minilm"):
    """Every document's pseudo-query (:data:`PSEUDO_SOURCE`, else its title), encoded by ``model`` as a query; cached."""
    from embedtune.workflows import load_experiment
    from embedtune.workflows.pseudo_queries import build_pseudo_queries

    os.environ.setdefault("EMBEDTUNE_VECTORS_PATH", str(ROOT / "benchmarks" / "data" / "vectors"))
    experiment = load_experiment(data_root / name, model, split_seed=None)
    return build_pseudo_queries(experiment, PSEUDO_SOURCE.get(name, "title"), mine=False, skip_whole_documents=True)


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    command = " ".join(["python", *sys.argv])
    # Read when the run starts: the code it imported, even if the branch moves on while it runs.
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or None
    base = {"command": command, "git_commit": commit, "embedtune_version": __version__, "machine": machine_info()}
    if args.model != "minilm" and set(args.datasets) - set(MPNET_DATASETS):
        raise SystemExit(f"--model {args.model}: vectors are committed for {', '.join(MPNET_DATASETS)} only.")
    for collection in args.datasets:
        ds = load(collection, Path(args.data_root), args.model)
        name = folder_name(collection, args.model)
        frozen_path = cell_file(out, name, ds["docs"].shape[1], "frozen", 0)
        if not frozen_path.is_file():
            value, per_query = score(ds, lambda x: x)
            atomic_write_json(frozen_path, {**base, "dataset": collection, "model": args.model, "dim": ds["docs"].shape[1], "method": "frozen", "seed": None,
                                            "n_docs": len(ds["docs"]), "n_queries": len(ds["query_ids"]), "vectors": ds["vectors"],
                                            "ndcg@10": value, "per_query": per_query})
        pseudo = None
        for dim in args.dims:
            for seed in args.seeds:
                for method in ("pca", "pca-uncentred", *args.methods):
                    path = cell_file(out, name, dim, method, seed)
                    if path.is_file() or (method in ("pca", "pca-uncentred") and seed != args.seeds[0]):  # PCA is fitted once per k
                        continue
                    start = time.perf_counter()
                    if method in METHODS:
                        data = TrainingData.corpus_only(ds["docs"], ds["doc_ids"])
                        preset, settings = PRESET_OF[method]
                        if method in ("dive@pq-anchors", "dive@guarded"):
                            pseudo = pseudo if pseudo is not None else training_pseudo_queries(collection, Path(args.data_root), args.model)
                            data.pseudo_queries = pseudo
                        start = time.perf_counter()  # the fit alone (the pseudo-queries are encoded once per collection)
                        compressor = DIVECompressor(DIVEConfig.preset(preset, dim=dim, seed=seed, progress=False, device="cpu",
                                                                      **settings))
                        compressor.fit_unsupervised(data)
                    else:
                        cls = get_compressor_class(method)
                        compressor = cls(cls.config_class(dim=dim, seed=seed)).fit_unsupervised(ds["docs"])
                    fit_s = time.perf_counter() - start
                    value, per_query = score(ds, compressor.transform)
                    row: dict[str, Any] = {**base, "dataset": collection, "model": args.model, "dim": dim, "method": method, "seed": seed, "ndcg@10": value,
                                           "per_query": per_query, "fit_s": round(fit_s, 1),
                                           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
                    if method in METHODS:
                        if method in ("dive@pq-anchors", "dive@guarded"):
                            row.update(pseudo_queries={"source": pseudo.source, "n": len(pseudo.ids)})  # type: ignore[union-attr]
                        if compressor.training_guard_ is not None:
                            row["training_guard"] = compressor.training_guard_
                        row.update(start=compressor.fit_details().get("start"), selected_epoch=compressor.selected_epoch_,
                                   epochs_run=len(compressor.history_) - 1, config=compressor.config.to_dict())
                    atomic_write_json(path, row)
                    print(f"{name} k={dim} {method} seed {seed}: nDCG@10 {value:.4f} ({fit_s:.0f}s"
                          + (f", {row['start']}, epoch {row['selected_epoch']} of {row['epochs_run']})" if method in METHODS else ")"), flush=True)


def _mean_per_query(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {q: float(np.mean([r["per_query"][q] for r in rows])) for q in rows[0]["per_query"]}


#: Per-query scores are stored to 6 decimals and averaged over seeds: a smaller mean difference is a tie (0).
_TIE = 1e-9


def _untied(test):
    """``test`` with a mean difference below :data:`_TIE` set to 0, so a fit that is the stronger PCA reads +0.0000."""
    return dataclasses.replace(test, mean_difference=0.0) if abs(test.mean_difference) < _TIE else test


def _guard_note(row: dict[str, Any]) -> str:
    """`` (epoch E not kept)`` where the training guard fell back on a PCA start the selection had trained past."""
    guard = row.get("training_guard")
    if not guard or guard["kept"] != "start" or not guard["selected_epoch"]:
        return ""
    return f" (epoch {guard['selected_epoch']} not kept)"


def report(out: Path) -> str:
    lines = ["# Label-free DIVE against PCA on every judged collection", "",
             (__doc__ or "").split("\n\n", 1)[1].split("\n\nOne JSON")[0].strip(), "",
             "| collection (judged queries) | k | frozen | PCA centred | PCA uncentred | setting | label-free DIVE, mean over seeds (start, epoch per seed) "
             "| DIVE − stronger PCA (p) | DIVE − frozen (p) | − the setting it adds to (p) |", "|---|---|---|---|---|---|---|---|---|---|"]
    cells: dict[str, list[tuple[float, float, int]]] = {}
    commands, dates, machines, fit_seconds = set(), [], set(), []
    for name in (*DATASETS, *(folder_name(d, "mpnet") for d in MPNET_DATASETS)):
        folder = out / name
        if not folder.is_dir():
            continue
        rows = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
        frozen = next(r for r in rows if r["method"] == "frozen")
        for row in rows:
            commands.add(row["command"])
            machines.add(f"{row['machine'].get('cpu', '?')}")
            if row.get("date"):
                dates.append(row["date"])
            if row["method"] in METHODS:
                fit_seconds.append(row["fit_s"])
        for dim in sorted({r["dim"] for r in rows if r["method"] != "frozen"}):
            at = [r for r in rows if r["dim"] == dim]
            pca = {m: next((r for r in at if r["method"] == m), None) for m in ("pca", "pca-uncentred")}
            if None in pca.values():
                continue
            stronger = max(pca.values(), key=lambda r: r["ndcg@10"])
            for method in METHODS:
                dive = sorted((r for r in at if r["method"] == method), key=lambda r: r["seed"])
                if not dive:
                    continue
                ours = _mean_per_query(dive)
                versus_pca = _untied(paired_test(*align_by_query(ours, stronger["per_query"])))
                versus_frozen = paired_test(*align_by_query(ours, frozen["per_query"]))
                kept = "; ".join(f"{(r['start'] or '?').split()[0]} {r['selected_epoch']}" + _guard_note(r) for r in dive)
                # Each setting against the one it adds to: the guard against the unguarded fit of the same anchors.
                twin = sorted((r for r in at if r["method"] == TWIN.get(method, "dive")), key=lambda r: r["seed"])
                mean = float(np.mean([r["ndcg@10"] for r in dive]))
                lines.append(f"| {name} ({frozen['n_queries']}) | {dim} | {frozen['ndcg@10']:.4f} | {pca['pca']['ndcg@10']:.4f} | "
                             f"{pca['pca-uncentred']['ndcg@10']:.4f} | `{method}` | {mean:.4f} ({kept}) | "
                             f"{versus_pca.mean_difference:+.4f} ({versus_pca.p_value:.3f}) | {versus_frozen.mean_difference:+.4f} ({versus_frozen.p_value:.3f}) |"
                             + (" {:+.4f} ({:.3f}) |".format(*(lambda t: (t.mean_difference, t.p_value))(
                                 paired_test(*align_by_query(ours, _mean_per_query(twin))))) if method != "dive" and twin else " |"))
                cells.setdefault(method, []).append((versus_pca.mean_difference, versus_pca.p_value, len(dive)))
    lines.append("")
    for method, found in cells.items():
        above = sum(1 for d, p, _ in found if d > 0 and p < 0.05)
        below = sum(1 for d, p, _ in found if d < 0 and p < 0.05)
        at_least = sum(1 for d, _, _ in found if d >= -_TIE)
        lines.append(f"`{method}`, over {len(found)} cells: at or above the stronger PCA variant in {at_least}, significantly above it "
                     f"in {above} and significantly below it in {below} (p < 0.05). Seeds per cell: {sorted({n for _, _, n in found})}.")
    lines += ["", f"DIVE fits took {min(fit_seconds, default=0):.0f}–{max(fit_seconds, default=0):.0f} s each on one thread.", "",
              f"Machine: {', '.join(sorted(machines))}, one torch thread; cells written {min(dates, default='?')} to {max(dates, default='?')}. "
              "Commands:", "", "```bash", *sorted(commands), "python benchmarks/label_free_dive.py --report", "```", ""]
    text = "\n".join(lines)
    atomic_write_bytes(out / "REPORT.md", text.encode("utf-8"))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--model", default="minilm", choices=list(MODELS),
                        help="whose committed vectors (mpnet: SciFact and ArguAna; its pseudo-queries are encoded by mpnet)")
    parser.add_argument("--dims", nargs="+", type=int, default=None, help="k (default: the model's d / 6 and d / 3, 64 128 for MiniLM, "
                        "128 256 for mpnet)")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--methods", nargs="+", default=["dive"], choices=list(METHODS), help="which label-free DIVE settings to fit")
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "beir"))
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--report", action="store_true", help="write REPORT.md from the finished cells and print it")
    args = parser.parse_args()
    if args.report:
        print(report(Path(args.out)))
        return
    if args.dims is None:
        args.dims = [64, 128] if args.model == "minilm" else [128, 256]
    torch.set_num_threads(args.threads)
    run(args)
    print(report(Path(args.out)))


if __name__ == "__main__":
    main()
