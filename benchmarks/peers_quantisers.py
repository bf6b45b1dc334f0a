"""Quantiser peers at their bytes: FAISS RaBitQ, TurboQuant and SQ4 against float32, int8 and sign bits.

One run, nothing trained on test queries: the frozen MiniLM vectors of SciFact and their
uncentred PCA-128 (fitted on the corpus), each stored at every precision, scored on all 300 test
queries of the ``beir-train`` protocol (split seed 2027) by :func:`embedtune.workflows.plan.precision_rows`,
the scorer ``compress plan`` uses. Bytes are per vector: in RAM (what search holds), on disk
(rescoring precisions also keep the float32 vectors there), and the fixed bytes that do not grow
with the corpus (int8/int4 ranges, RaBitQ's centroid, a rotation). Rescoring precisions rescore
exactly the top 100 candidates (the search fetches 100 rows: 99 kept after dropping a query's own
id, as BEIR does; nDCG@10 needs only the first 10).

    python benchmarks/peers_quantisers.py [--data ../shared/data/beir/scifact] [--model minilm] [--pca-dim 128]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import sys
from pathlib import Path

import faiss

from embedtune.compress import get_compressor_class
from embedtune.workflows import load_experiment
from embedtune.workflows.experiment import training_data
from embedtune.workflows.plan import precision_rows

ROOT = Path(__file__).resolve().parents[1]
PEERS = [
    ("float32", "float32"),
    ("binary", "sign binary (Hamming)"),
    ("binary-rescore", "sign binary + float rescore of the top 100"),
    ("binary-asym", "sign binary, top 100 rescored as float query · ±1"),
    ("rabitq1", "RaBitQ 1-bit"),
    ("rabitq1-rescore", "RaBitQ 1-bit + float rescore of the top 100"),
    ("turboquant1", "TurboQuant 1-bit"),
    ("rabitq4", "RaBitQ 4-bit"),
    ("turboquant4", "TurboQuant 4-bit"),
    ("int4", "SQ4 (int4)"),
    ("int8", "int8 (SQ8, corpus ranges)"),
    # TurboQuant as its paper defines it: a random rotation first (FAISS's SQtqmse applies none).
    ("faiss:RR,SQtqmse1", "TurboQuant 1-bit, random rotation first (RR)"),
    ("faiss:RR,SQtqmse4", "TurboQuant 4-bit, random rotation first (RR)"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/beir/scifact")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--pca-dim", type=int, default=128)
    parser.add_argument("--split-seed", type=int, default=2027)
    args = parser.parse_args()
    experiment = load_experiment(str(args.data), args.model, protocol="beir-train", split_seed=args.split_seed)
    pca = get_compressor_class("pca-uncentred")
    compressor = pca(pca.config_class(dim=args.pca_dim)).fit(training_data(experiment, "train+val"))
    print(f"# Quantiser peers: {experiment.dataset.name}, {args.model}, beir-train test queries (split seed {args.split_seed})")
    print(f"# {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC}; faiss-cpu {faiss.__version__}; Python {platform.python_version()}; "
          f"{platform.machine()}, {os.cpu_count()} CPUs; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    for label, space in ((f"frozen {args.model} ({experiment.embeddings.dim}-d)", None),
                         (f"uncentred PCA-{args.pca_dim} of it (fitted on the corpus)", compressor)):
        rows = {r["precision"]: r for r in precision_rows(experiment, "test", space, [p for p, _ in PEERS], top_k=99, rounds=0,
                                                          time_reference=False)}
        reference = rows["float32"]["ndcg@10"]
        print(f"\n### {label}, {rows['float32']['n_queries']} test queries\n")
        print("| peer | precision | B in RAM | B on disk | fixed B | nDCG@10 | Δ vs float32 | Recall@10 |\n|---|---|---|---|---|---|---|---|")
        for name, title in PEERS:
            r = rows[name]
            print(f"| {title} | `{name}` | {r['ram_bytes']} | {r['disk_bytes']} | {r['fixed_bytes']} | {r['ndcg@10']:.4f} | "
                  f"{r['ndcg@10'] - reference:+.4f} | {r['recall@10']:.4f} |")


if __name__ == "__main__":
    main()
