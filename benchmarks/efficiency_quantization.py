"""Quantisation stacking: DIVE at 128 dims + int8 / binary, held-out nDCG@10 on SciFact (MiniLM).

    EMBEDTUNE_CACHE=/tmp/etcache python benchmarks/efficiency_quantization.py --out benchmarks/results/efficiency/quantization.json

Fits DIVE (k=128, seed 2027, heads=auto) on train+val with the shared triplets, exactly as
``embedtune compress train --final`` does, then scores the held-out test queries for every
quantisation of the frozen and the DIVE vectors. ``--method pca`` runs the same table on PCA.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from embedtune.bench.efficiency import QUANT_COLUMNS, format_table, machine_info, quantization_table
from embedtune.workflows.fit_and_score import fit_and_evaluate
from embedtune.workflows.triplets import shared_triplets
from embedtune.workflows.experiment import load_experiment
from embedtune.io import atomic_write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="scifact")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--method", default="dive")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=2027)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    experiment = load_experiment(data=args.data, model=args.model)
    start = time.perf_counter()
    overrides = {"heads": "auto"} if args.method == "dive" else {}
    triplets = shared_triplets(experiment, "train+val")
    run = fit_and_evaluate(experiment, args.method, args.dim, seed=args.seed, final=True, triplets=triplets, overrides=overrides)
    fit_seconds = time.perf_counter() - start
    rows = quantization_table(experiment, run.compressor, part="test")
    result = {
        "machine": machine_info(),
        "data": args.data,
        "model": args.model,
        "method": args.method,
        "dim": args.dim,
        "seed": args.seed,
        "fit": run.row(),
        "fit_and_eval_seconds": fit_seconds,
        "rows": rows,
    }
    if args.out:
        atomic_write_json(args.out, result)
    print(format_table(rows, QUANT_COLUMNS + ["disk_bytes_per_vector"]))
    print(json.dumps(run.row()))


if __name__ == "__main__":
    main()
