"""Pair two ``compress train`` results files on the same queries: main method minus main method,
on all test queries and on the seen / unseen subsets of the first file.

    .venv/bin/python benchmarks/paired_results.py A/results.json B/results.json

Both files must score the same queries with the same split (e.g. DIVE-128 fitted on vectors of
two encoding backends). Prints A, B and A − B with the paired sign-flip p of
:func:`embedtune.workflows.significance.paired_test`, per subset.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from embedtune.workflows.significance import paired_test


def _per_query(path: Path) -> tuple[dict[str, float], dict[str, list[str]], str]:
    results = json.loads(path.read_text())
    if "per_query" not in results:
        raise SystemExit(f"{path}: no field 'per_query'. Fix: pass the results.json a `compress train` run wrote.")
    scores = {qid: values["ndcg_at_10"] for qid, values in results["per_query"].items()}
    if not np.isfinite(list(scores.values())).all():
        raise SystemExit(f"{path}: field 'per_query' holds a non-finite ndcg_at_10. Fix: rerun the `compress train` that wrote it.")
    return scores, results.get("subsets", {}).get("query_ids", {}), results.get("subsets", {}).get("main", "main method")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    args = parser.parse_args()
    first, subsets, method = _per_query(args.first)
    second, _, _ = _per_query(args.second)
    if sorted(first) != sorted(second):
        raise SystemExit(f"{args.first} and {args.second} scored other queries: they cannot be paired.")
    print(f"{method} nDCG@10, A = {args.first}, B = {args.second}")
    print("| subset | queries | A | B | A − B | paired p | 95 % CI |")
    print("|---|---|---|---|---|---|---|")
    for name, qids in {"all": sorted(first), **{k: sorted(v) for k, v in subsets.items()}}.items():
        a, b = np.array([first[q] for q in qids]), np.array([second[q] for q in qids])
        test = paired_test(a, b)
        print(f"| {name} | {len(qids)} | {a.mean():.4f} | {b.mean():.4f} | {test.mean_difference:+.4f} | {test.p_value:.3g} | "
              f"[{test.ci_low:+.4f}, {test.ci_high:+.4f}] |")


if __name__ == "__main__":
    main()
