"""Paired tests of the DIVE "best" variant against every method on the beir-train protocol.

Usage: .venv/bin/python benchmarks/beir_train_significance.py [results_dir]
Per-query nDCG@10 averaged over seeds; paired permutation p and bootstrap 95 % CI (10,000 resamples).
"""
import glob
import json
import statistics
import sys
from collections import defaultdict

import numpy as np

from embedtune.workflows.significance import paired_test

root = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/dive-beir-train"
groups = defaultdict(list)
for path in glob.glob(f"{root}/runs/**/*.json", recursive=True):
    record = json.load(open(path))
    if "per_query" not in record:
        continue
    spec = record["spec"]
    for tag in spec["studies"]:
        label = tag.split(":", 1)[1] if tag.startswith("variant:") else spec["method"] if tag == "main" else None
        if label:
            groups[(spec["backbone"], spec["dataset"], spec["dim"], label)].append(record)


def per_query(runs):
    return {q: statistics.fmean(r["per_query"][q]["ndcg@10"] for r in runs) for q in runs[0]["per_query"]}


for (backbone, dataset, dim, label), runs in sorted(groups.items()):
    if label != "best":
        continue
    best = per_query(runs)
    for (b, d, k, other), other_runs in sorted(groups.items()):
        if (b, d, k) != (backbone, dataset, dim) or other == "best":
            continue
        ref = per_query(other_runs)
        queries = sorted(set(best) & set(ref))
        test = paired_test(np.array([best[q] for q in queries]), np.array([ref[q] for q in queries]), 10_000)
        print(f"{backbone} {dataset} k={dim}: best {statistics.fmean(best.values()):.4f} vs {other} {statistics.fmean(ref.values()):.4f} "
              f"({len(other_runs)} seeds): Δ {test.mean_difference:+.4f} [{test.ci_low:+.4f}, {test.ci_high:+.4f}] p={test.p_value:.4f}")
