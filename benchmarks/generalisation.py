"""Generalise, don't memorise: every supervised method on all, seen and unseen queries.

Two protocols, one JSON per cell under ``--results`` (finished cells are skipped, so a stopped
run resumes where it stopped):

- ``beir-train``: fit on SciFact's ``qrels/train.tsv`` (train+val), score all 300 test queries,
  split into ``seen`` (every positive was a training positive) and ``unseen`` (none was);
- ``new-documents``: 20 % of the corpus (hashed) is withheld from fitting, selection, mining and
  PCA; scored are the test queries whose positives are all withheld, over the whole corpus.
  SciFact uses the beir-train split; ArguAna (test qrels only) the paper's 60/20/20 split.

Methods: frozen, both PCA variants, the default DIVE (``robust``), the default with the paper's
geometry weight (``dive@geometry-10``, the default before γ = 100 was chosen on selection
queries), DIVE ``static-corpus`` (the earlier default, selected on a random half of the training
queries), and the supervised baselines with their default presets. Trained methods run ``--seeds``.

Usage::

    python benchmarks/generalisation.py --models minilm --datasets scifact --protocols beir-train
    python benchmarks/generalisation.py --report            # markdown tables with paired tests
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("EMBEDTUNE_VECTORS_PATH", str(Path(__file__).resolve().parent / "data" / "vectors"))  # committed vectors (mpnet)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from embedtune import __version__  # noqa: E402
from embedtune.compress import get_compressor_class  # noqa: E402
from embedtune.evaluate.subsets import query_subsets, training_positives  # noqa: E402
from embedtune.data.beir import load_beir  # noqa: E402
from embedtune.io import atomic_write_bytes, atomic_write_json  # noqa: E402
from embedtune.workflows import load_experiment  # noqa: E402
from embedtune.workflows.fit_and_score import fit_and_evaluate  # noqa: E402
from embedtune.workflows.new_documents import score_new_documents, withhold_new_documents  # noqa: E402
from embedtune.workflows.pseudo_queries import build_pseudo_queries  # noqa: E402
from embedtune.workflows.significance import align_by_query, paired_test  # noqa: E402
from embedtune.workflows.subset_report import per_query_means  # noqa: E402
from embedtune.workflows.train_compressor import resolve_preset  # noqa: E402
from embedtune.workflows.triplets import shared_triplets  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = {"scifact": ROOT.parent / "shared/data/beir/scifact", "arguana": ROOT.parent / "shared/data/beir/arguana"}
MODEL_DIM = {"minilm": 384, "mpnet": 768}
#: (label, method, preset, settings over the preset's); the preset None is the method's default.
METHODS = (
    ("frozen", "frozen", None, {}), ("pca", "pca", None, {}), ("pca-uncentred", "pca-uncentred", None, {}),
    ("dive", "dive", None, {}), ("dive@geometry-10", "dive", None, {"geometry_weight": 10.0}),
    ("dive@static-corpus", "dive", "static-corpus", {}),
    # The default plus one training-only pseudo-query per document (its title), weight 1 (chosen on selection queries).
    ("dive@pseudo-title", "dive", None, {"pseudo_queries": "title", "pseudo_query_weight": 1.0}),
    ("mrl-adaptor", "mrl-adaptor", None, {}), ("search-adaptor", "search-adaptor", None, {}), ("smec", "smec", None, {}),
)
SEEDS = (2027, 2028, 2029)
SPLIT_SEED = 2027


def machine() -> str:
    cpu = platform.processor() or "cpu"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def cell_path(results: Path, dataset: str, model: str, protocol: str, dim: int, label: str, seed: int) -> Path:
    return results / f"{dataset}-{model}" / protocol / f"k{dim}" / f"{label}+seed{seed}.json"


def run(args: argparse.Namespace) -> None:
    for dataset in args.datasets:
        for model in args.models:
            for protocol in args.protocols:
                run_block(args, dataset, model, protocol)


def run_block(args: argparse.Namespace, dataset: str, model: str, protocol: str) -> None:
    split_protocol = "beir-train" if dataset == "scifact" else "paper"
    labels = [row for row in METHODS if row[0] in args.methods]
    dims = [MODEL_DIM[model] // fraction for fraction in args.dim_fractions]
    todo = [(dim, row, seed) for dim in dims for row in labels
            for seed in (args.seeds if get_compressor_class(row[1]).seed_dependent else args.seeds[:1])
            if not cell_path(args.results, dataset, model, protocol, dim, row[0], seed).is_file()]
    if not todo:
        return
    experiment = load_experiment(DATA[dataset], model, protocol=split_protocol, split_seed=SPLIT_SEED)
    view = withhold_new_documents(experiment, 0.2) if protocol == "new-documents" else None
    fit_experiment = view.fit if view is not None else experiment
    triplets: dict[Any, np.ndarray] = {}
    pseudo_sets: dict[Any, Any] = {}
    for dim, (label, method, preset_name, extra_settings), seed in todo:
        preset = resolve_preset(method, preset_name)
        cls = get_compressor_class(method)
        mined = None
        if cls.supervised:
            key = preset.mining
            if key not in triplets:
                triplets[key] = shared_triplets(fit_experiment, "train+val", preset.mining, SPLIT_SEED)
            mined = triplets[key]
        # "pseudo_queries" is not a config field: it names the training-only pseudo-queries to build.
        overrides = {**preset.settings, **{k: v for k, v in extra_settings.items() if k != "pseudo_queries"}}
        if "progress" in cls.config_class.__dataclass_fields__:
            overrides["progress"] = False
        pseudo = None
        if "pseudo_queries" in extra_settings:
            source = extra_settings["pseudo_queries"]
            if (source, preset.mining) not in pseudo_sets:
                pseudo_sets[source, preset.mining] = build_pseudo_queries(fit_experiment, source, preset.mining, SPLIT_SEED)
            pseudo = pseudo_sets[source, preset.mining]
        start = time.perf_counter()
        result = fit_and_evaluate(fit_experiment, method, dim, seed, final=True, triplets=mined, overrides=overrides,
                                  pseudo_queries=pseudo)
        record: dict[str, Any] = {
            "dataset": dataset, "model": model, "protocol": protocol, "split": split_protocol, "dim": dim, "label": label,
            "method": method, "preset": preset.name, "settings": extra_settings, "seed": seed, "fit_seconds": result.fit_seconds,
            "selected_epoch": getattr(result.compressor, "selected_epoch_", None), "details": result.details,
            "per_query": {q: {m: v[m] for m in ("ndcg@10", "recall@10")} for q, v in result.metrics.per_query.items()},
        }
        if view is not None:
            scored = score_new_documents(view, result.compressor)
            record["new_documents"] = view.describe()
            record["per_query_new_documents"] = {q: {m: v[m] for m in ("ndcg@10", "recall@10")} for q, v in scored.per_query.items()}
        record.update({"seconds": time.perf_counter() - start, "machine": machine(), "embedtune": __version__,
                       "date": dt.date.today().isoformat(), "command": " ".join(sys.argv)})
        path = cell_path(args.results, dataset, model, protocol, dim, label, seed)
        atomic_write_json(path, record)
        print(f"{dataset}/{model}/{protocol}/k{dim} {label} seed {seed}: nDCG@10 {result.metrics['ndcg@10']:.4f}"
              + (f", new documents {scored.aggregate['ndcg@10']:.4f}" if view is not None else "")
              + f" (epoch {record['selected_epoch']}, {record['fit_seconds']:.0f}s)", flush=True)


def _mean_per_query(records: list[dict[str, Any]], key: str) -> dict[str, dict[str, float]]:
    return per_query_means([record[key] for record in records])


def _guarantee(scores: Mapping[str, Mapping[str, Mapping[str, float]]], ids: list[str], what: str) -> str:
    """The default's guarantee on ``ids``: dive against the stronger PCA variant there, with the paired test and a verdict."""
    variants = [name for name in ("pca", "pca-uncentred") if name in scores]
    if not variants or not ids:
        return ""
    stronger = max(variants, key=lambda name: np.mean([scores[name][q]["ndcg@10"] for q in ids]))
    test = paired_test(np.array([scores["dive"][q]["ndcg@10"] for q in ids]), np.array([scores[stronger][q]["ndcg@10"] for q in ids]))
    verdict = "tied (p ≥ 0.05)" if test.p_value >= 0.05 else "above" if test.mean_difference > 0 else "**below**"
    return (f"\nGuarantee on {what}: dive − the stronger PCA variant there ({stronger}) = {test.mean_difference:+.4f} "
            f"(p {test.p_value:.2g}, 95 % CI [{test.ci_low:+.4f}, {test.ci_high:+.4f}], {len(ids)} queries): {verdict}.")


def _fmt(test: Mapping[str, Any] | None) -> str:
    return "" if not test else f"{test['mean_difference']:+.4f} ({test['p_value']:.2g})"


def report(args: argparse.Namespace) -> None:
    """Print the tables and write them to ``RESULTS/REPORT.md``."""
    lines: list[str] = ["# Seen and unseen", "",
                        "Built by `python benchmarks/generalisation.py --report` from the cell JSONs beside this file."]

    def emit(*parts: Any) -> None:
        text = " ".join(str(p) for p in parts)
        lines.extend(text.split("\n"))
        print(text)

    _report(args, emit)
    atomic_write_bytes(args.results / "REPORT.md", ("\n".join(lines) + "\n").encode("utf-8"))


def _report(args: argparse.Namespace, emit: Any) -> None:
    for block in sorted(p for p in args.results.glob("*/*/k*") if p.is_dir()):
        dataset, model = block.parents[1].name.split("-", 1)
        protocol = block.parent.name
        by_label: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(block.glob("*.json")):
            record = json.loads(path.read_text())
            by_label.setdefault(record["label"], []).append(record)
        order = [row[0] for row in METHODS if row[0] in by_label]
        if "dive" not in by_label:
            continue
        emit(f"\n#### {dataset} / {model}, {protocol}, k = {block.name[1:]}\n")
        if protocol == "new-documents":
            key = "per_query_new_documents"
            scores = {label: _mean_per_query(by_label[label], key) for label in order}
            info = by_label["dive"][0]["new_documents"]
            emit(f"{info['n_withheld_documents']} of {info['n_documents']} documents withheld; {info['n_queries']} test queries "
                  "whose positives are all withheld, searching the whole corpus.\n")
            emit("| method | seeds | nDCG@10 | Recall@10 | dive − method (p) |\n|---|---|---|---|---|")
            for label in order:
                s = scores[label]
                test = None
                if label != "dive":
                    a, b = align_by_query({q: v["ndcg@10"] for q, v in scores["dive"].items()}, {q: v["ndcg@10"] for q, v in s.items()})
                    test = paired_test(a, b).to_dict()
                emit(f"| {label} | {len(by_label[label])} | {np.mean([v['ndcg@10'] for v in s.values()]):.4f} | "
                      f"{np.mean([v['recall@10'] for v in s.values()]):.4f} | {_fmt(test)} |")
            emit(_guarantee(scores, sorted(scores["dive"]), "new-document queries"))
            continue
        path = DATA[dataset]
        train_qrels = {**load_beir(path, "train").qrels} if dataset == "scifact" else None
        test_qrels = load_beir(path, "test").qrels
        seen = training_positives(train_qrels) if train_qrels is not None else set()
        scores = {label: _mean_per_query(by_label[label], "per_query") for label in order}
        groups = query_subsets({q: test_qrels[q] for q in scores["dive"]}, seen)
        groups["all"] = sorted(scores["dive"])
        emit(f"all {len(groups['all'])}, seen {len(groups['seen'])}, unseen {len(groups['unseen'])}, mixed {len(groups['mixed'])} "
              "queries; nDCG@10 (Recall@10), mean over seeds; Δ = dive − method, paired permutation p on the subset.\n")
        emit("| method | seeds | epochs | all | seen | unseen | Δ all (p) | Δ seen (p) | Δ unseen (p) |\n|---|---|---|---|---|---|---|---|---|")
        for label in order:
            s = scores[label]
            cells, deltas = [], []
            for subset in ("all", "seen", "unseen"):
                ids = groups[subset]
                cells.append(f"{np.mean([s[q]['ndcg@10'] for q in ids]):.4f} ({np.mean([s[q]['recall@10'] for q in ids]):.3f})")
                if label != "dive":
                    deltas.append(_fmt(paired_test(np.array([scores['dive'][q]['ndcg@10'] for q in ids]),
                                                   np.array([s[q]['ndcg@10'] for q in ids])).to_dict()))
                else:
                    deltas.append("")
            epochs = "/".join(str(r["selected_epoch"]) for r in by_label[label] if r["selected_epoch"] is not None)
            emit(f"| {label} | {len(by_label[label])} | {epochs} | " + " | ".join(cells) + " | " + " | ".join(deltas) + " |")
        emit(_guarantee(scores, groups["unseen"], "unseen queries"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["minilm"], choices=sorted(MODEL_DIM))
    parser.add_argument("--datasets", nargs="+", default=["scifact"], choices=sorted(DATA))
    parser.add_argument("--protocols", nargs="+", default=["beir-train"], choices=["beir-train", "new-documents"])
    parser.add_argument("--methods", nargs="+", default=[row[0] for row in METHODS], choices=[row[0] for row in METHODS])
    parser.add_argument("--dim-fractions", nargs="+", type=int, default=[6, 3], help="k = d / fraction")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks/results/generalisation")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true", help="print the tables from the finished cells")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.report:
        report(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
