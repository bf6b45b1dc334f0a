"""CSR as a learned peer at equal bytes: sentence-transformers' sparse autoencoder on frozen vectors.

One run, nothing trained on queries: CSR (``SparseAutoEncoder`` with CSR's reconstruction terms,
label-free, :mod:`embedtune.compress.csr`) is fitted on the frozen MiniLM vectors of the SciFact
corpus at ``k`` active of ``m = 4 × 384`` latents, and its k-sparse codes are stored as ``k``
(uint16 index, fp16 value) pairs: ``4k`` bytes per vector. It is scored against uncentred PCA
(fitted on the same corpus) at the same bytes, at int8, fp16, sign bits and TurboQuant/RaBitQ of
its output, and against RaBitQ/TurboQuant of the frozen vectors, on all 300 test queries of the
``beir-train`` protocol (split seed 2027), by :func:`embedtune.workflows.plan.precision_rows`, the
scorer ``compress plan`` uses. Search over the sparse codes is exact: the dot product of the
densified k-sparse vectors, the documents' values stored at fp16 (FAISS ``SQfp16``), the query's
kept at float32, as for every other precision. Each peer is paired with CSR at its budget
(:func:`embedtune.workflows.significance.paired_test`, per-query nDCG@10).

    python benchmarks/csr_peer.py [--data ../shared/data/beir/scifact] [--model minilm] [--active 8 16]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import torch

from embedtune.compress import get_compressor_class
from embedtune.compress.csr import sparse_code_bytes
from embedtune.evaluate.metrics import evaluate_run
from embedtune.evaluate.search import run_from_topk
from embedtune.index.codecs import QuantizedIndex
from embedtune.workflows import load_experiment
from embedtune.workflows.experiment import training_data
from embedtune.workflows.plan import precision_rows
from embedtune.workflows.significance import paired_test

ROOT = Path(__file__).resolve().parents[1]
# Peers at (about) each CSR budget 4k B: uncentred PCA at dim and precision with exactly those bytes, and the
# 1-bit quantisers of the frozen vectors, whose smallest codes (48 B, 56 B) sit between 32 and 64 B.
PCA_PEERS = {
    32: [(32, "int8"), (16, "float16"), (256, "binary"), (256, "turboquant1"), (192, "rabitq1")],
    64: [(64, "int8"), (32, "float16"), (128, "turboquant4"), (128, "int4")],
}
FROZEN_PEERS = ["float32", "turboquant1", "rabitq1", "binary", "turboquant4", "rabitq4"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/beir/scifact")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--active", type=int, nargs="+", default=[8, 16], help="CSR's k per budget (4k bytes each)")
    parser.add_argument("--latent-multiple", type=int, default=4, help="m = this × d latents")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=2027)
    parser.add_argument("--split-seed", type=int, default=2027)
    parser.add_argument("--raw-dot", action="store_true", help="also score the unnormalised codes (s-t's dot product of raw latents)")
    parser.add_argument("--json", type=Path, help="also write every row (per-query scores included) here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    experiment = load_experiment(str(args.data), args.model, protocol="beir-train", split_seed=args.split_seed)
    d = experiment.embeddings.dim
    corpus = training_data(experiment, "train+val")  # unsupervised fits read its documents only: the whole corpus
    score = dict(rounds=0, time_reference=False)
    rows = {}
    for row in precision_rows(experiment, "test", None, FROZEN_PEERS, **score, labels={"method": "frozen"}):
        rows[f"frozen-{d}/{row['precision']}"] = row
    csr = get_compressor_class("csr")
    fits = {}
    for active in args.active:
        config = csr.config_class(dim=args.latent_multiple * d, active=active, epochs=args.epochs, learning_rate=args.learning_rate,
                                  seed=args.seed, progress=False, device="cpu")
        start = time.perf_counter()
        compressor = csr(config).fit(corpus)
        fit_s = time.perf_counter() - start
        codes = compressor.transform(experiment.embeddings.doc_embeddings)
        nonzeros = (codes != 0).sum(axis=1)
        fits[active] = {"fit_s": fit_s, **compressor.fit_details(), "rows_with_k_nonzeros": float((nonzeros == active).mean()),
                        "final_terms": compressor.history_[-1]}
        for row in precision_rows(experiment, "test", compressor, ["float16"], **score, labels={"method": "csr"}):
            row["ram_bytes"] = row["disk_bytes"] = sparse_code_bytes(active, config.dim, 2)
            rows[f"csr-k{active}-of-{config.dim}/sparse uint16+fp16"] = row
        if args.raw_dot:
            rows[f"csr-k{active}-of-{config.dim}, raw latents (s-t's dot)/sparse uint16+fp16"] = raw_dot_row(experiment, compressor)
        budget = compressor.code_bytes
        pca = get_compressor_class("pca-uncentred")
        for dim in sorted({dim for dim, _ in PCA_PEERS.get(budget, [])}):
            fitted = pca(pca.config_class(dim=dim)).fit(corpus)
            precisions = [p for k, p in PCA_PEERS[budget] if k == dim]
            for row in precision_rows(experiment, "test", fitted, precisions, **score, labels={"method": "pca-uncentred"}):
                rows[f"pca-uncentred-{dim}/{row['precision']}"] = row

    print(f"# CSR learned peer: {experiment.dataset.name}, {args.model} ({d}-d), beir-train test queries (split seed {args.split_seed})")
    print(f"# machine: {platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"Python {platform.python_version()}, torch {torch.__version__}, faiss {faiss.__version__}; {_dt.date.today()}")
    print(f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    for active, info in fits.items():
        terms = ", ".join(f"{k} {v:.4f}" for k, v in info["final_terms"].items() if k not in ("stage", "epoch"))
        print(f"# csr k={active}: fit {info['fit_s']:.0f}s, {info['dead_latents']} of {info['latent_dim']} latents dead, "
              f"{info['rows_with_k_nonzeros']:.4f} of corpus rows with exactly k nonzeros; last epoch: {terms}")
    print()
    print("| setting | B in RAM | nDCG@10 | Recall@10 | queries | Δ CSR at its budget − row (p) [95 % CI] |")
    print("|---|---|---|---|---|---|")
    csr_by_bytes = {row["ram_bytes"]: (name, row) for name, row in rows.items() if row["method"] == "csr" and "raw latents" not in name}
    for name, row in sorted(rows.items(), key=lambda item: (item[1]["ram_bytes"], -item[1]["ndcg@10"])):
        delta = ""
        # The CSR budget this row is compared with: its own bytes, or the next CSR budget above (48/56 B peers vs 64 B).
        match = min((b for b in csr_by_bytes if b >= row["ram_bytes"]), default=None) if row["method"] != "csr" else None
        if "raw latents" in name:
            match = row["ram_bytes"]
        if match is not None and row["ram_bytes"] <= 2 * match:
            csr_name, csr_row = csr_by_bytes[match]
            ids = sorted(csr_row["per_query"])
            test = paired_test(np.array([csr_row["per_query"][q] for q in ids]), np.array([row["per_query"][q] for q in ids]))
            delta = f"{csr_name.split('/')[0]}: {test.mean_difference:+.4f} ({test.p_value:.2g}) [{test.ci_low:+.4f}, {test.ci_high:+.4f}]"
        print(f"| {name} | {row['ram_bytes']} | {row['ndcg@10']:.4f} | {row['recall@10']:.4f} | {row['n_queries']} | {delta} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"fits": fits, "rows": rows}, indent=1, sort_keys=True, default=str))


def raw_dot_row(experiment, compressor) -> dict:
    """The codes before embedtune's unit-norm output (s-t's SparseEncoder scores raw latents by dot product), docs at fp16."""
    ids = experiment.part_ids("test")
    qrels = experiment.qrels_for(ids)
    ids = [qid for qid in ids if qrels.get(qid)]
    xq = compressor._transform(compressor.normalize_input(np.ascontiguousarray(experiment.embeddings.queries(ids), dtype=np.float32)))
    xb = compressor._transform(compressor.normalize_input(np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32)))
    D, I = QuantizedIndex.build(xb, "float16").search(xq, 101)
    metrics = evaluate_run(qrels, run_from_topk(ids, D, I, experiment.embeddings.doc_ids, 100, True), ("ndcg@10", "recall@10"))
    code_bytes = compressor.code_bytes
    return {"method": "csr", "ram_bytes": code_bytes, "disk_bytes": code_bytes, "ndcg@10": metrics["ndcg@10"], "recall@10": metrics["recall@10"],
            "n_queries": metrics.n_queries, "per_query": {q: v["ndcg@10"] for q, v in metrics.per_query.items()}}


if __name__ == "__main__":
    main()
