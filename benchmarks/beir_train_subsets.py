"""Re-score the committed `beir-train` protocol runs (benchmarks/results/dive-beir-train) on seen and unseen queries.

These runs used the paper recipes and the `best` DIVE settings, selected before
positive-disjoint selection existed. Nothing is refitted: each run's per-query nDCG@10 (seed means)
is split into the test queries whose positives were all train-qrels positives (seen) and those with
none among them (unseen), with paired tests against the `best` DIVE on each subset.

    python benchmarks/beir_train_subsets.py [--results benchmarks/results/dive-beir-train/runs/scifact]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from embedtune.data.beir import load_beir
from embedtune.evaluate.subsets import query_subsets, training_positives
from embedtune.workflows.significance import paired_test

ROOT = Path(__file__).resolve().parents[1]
LABELS = {"heads=auto,init=pca,margin=0.4,max_heads=4": "dive (best)", "heads=auto,init=pca,max_heads=4": "dive (pca-init)",
          "heads=auto,max_heads=4": "dive (paper)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks/results/dive-beir-train/runs/scifact")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/beir/scifact")
    args = parser.parse_args()
    seen = training_positives(load_beir(args.data, "train").qrels)
    test_qrels = load_beir(args.data, "test").qrels
    for model_dir in sorted(p for p in args.results.iterdir() if p.is_dir()):
        cells: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for path in sorted((model_dir / "test").rglob("k*-s*.json")):
            record = json.loads(path.read_text())
            method, variant = path.parts[-3], path.parts[-2]
            label = LABELS.get(variant, method) if method == "dive" else method
            cells[int(path.stem.split("-")[0][1:])][label].append(record["per_query"])
        for k, by_label in sorted(cells.items()):
            means = {label: {q: statistics.fmean(run[q]["ndcg@10"] for run in runs) for q in runs[0]} for label, runs in by_label.items()}
            groups = query_subsets({q: test_qrels[q] for q in next(iter(means.values()))}, seen)
            groups["all"] = sorted(next(iter(means.values())))
            print(f"\n#### {model_dir.name}, k = {k} (committed runs; seen {len(groups['seen'])}, unseen {len(groups['unseen'])})\n")
            print("| method | seeds | all | seen | unseen | Δ unseen vs dive (best) (p) |\n|---|---|---|---|---|---|")
            for label, scores in means.items():
                cells_text = [f"{np.mean([scores[q] for q in groups[s]]):.4f}" for s in ("all", "seen", "unseen")]
                delta = ""
                if label != "dive (best)" and "dive (best)" in means:
                    t = paired_test(np.array([means["dive (best)"][q] for q in groups["unseen"]]), np.array([scores[q] for q in groups["unseen"]]))
                    delta = f"{t.mean_difference:+.4f} ({t.p_value:.2g})"
                print(f"| {label} | {len(by_label[label])} | " + " | ".join(cells_text) + f" | {delta} |")


if __name__ == "__main__":
    main()
