"""Paired tests across two protocol results folders (same split and queries), e.g. filtered vs unfiltered triplets.

Usage: .venv/bin/python benchmarks/cross_folder_significance.py
Prints, per dataset and k: best+robust (dive-robust) vs the selected preset (dive), the robust
variant vs PCA, and best+robust vs PCA, each a paired permutation test on per-query nDCG@10
averaged over seeds (10,000 resamples).
"""
import glob
import json
import statistics

import numpy as np

from embedtune.workflows.significance import paired_test
def runs(root, tag, ds, k):
    out = []
    for f in glob.glob(f"{root}/runs/{ds}/minilm/test/**/*.json", recursive=True):
        d = json.load(open(f))
        if tag in d["spec"]["studies"] and d["spec"]["dim"] == k and "per_query" in d: out.append(d)
    return out
def pq(rs): 
    qs = rs[0]["per_query"].keys(); return {q: statistics.fmean(r["per_query"][q]["ndcg@10"] for r in rs) for q in qs}
for ds in ["scifact", "arguana"]:
    for k in [64, 128]:
        a = runs("benchmarks/results/dive-robust", "variant:best+robust", ds, k)
        b = runs("benchmarks/results/dive", "preset_best:pca, m=0.4", ds, k)
        c = runs("benchmarks/results/dive-robust", "variant:robust", ds, k)
        p = runs("benchmarks/results/dive", "main", ds, k); pca = [r for r in p if r["spec"]["method"] == "pca"]
        A, B, C, P = pq(a), pq(b), pq(c), pq(pca)
        qs = sorted(A)
        t = paired_test(np.array([A[q] for q in qs]), np.array([B[q] for q in qs]), 10000)
        t2 = paired_test(np.array([C[q] for q in qs]), np.array([P[q] for q in qs]), 10000)
        t3 = paired_test(np.array([A[q] for q in qs]), np.array([P[q] for q in qs]), 10000)
        print(ds, k, f"best+robust {statistics.fmean(A.values()):.4f} vs best {statistics.fmean(B.values()):.4f}: d={t.mean_difference:+.4f} CI[{t.ci_low:+.4f},{t.ci_high:+.4f}] p={t.p_value:.4f} | robust vs PCA d={t2.mean_difference:+.4f} p={t2.p_value:.4f} | best+robust vs PCA d={t3.mean_difference:+.4f} p={t3.p_value:.4f}")
