"""PCA fitted on a sample of the corpus against PCA fitted on every row: nDCG@10 retention on real vectors.

Reads committed vectors (``benchmarks/data/vectors/<dataset>-minilm-vectors.npz``) and the dataset's
qrels; fits ``pca`` at ``--dim`` on every document and on samples of ``--samples`` rows (drawn with
the seed, as ``compress fit --fit-sample N`` does); prints nDCG@10 retention (compressed over
uncompressed, every judged query, exact cosine search) and the share of the corpus variance the
sample's axes capture, over the share the full fit's capture.

    python benchmarks/pca_fit_sample.py --dataset arguana --data ../shared/data/beir/arguana
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from embedtune.compress import make_compressor
from embedtune.evaluate.retrieval import evaluate_embeddings

VECTORS = Path(__file__).resolve().parent / "data" / "vectors"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="arguana")
    parser.add_argument("--data", required=True, help="BEIR folder of the dataset (for qrels/test.tsv)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--samples", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--seeds", type=int, nargs="+", default=[2027, 1, 2])
    args = parser.parse_args()
    z = np.load(VECTORS / f"{args.dataset}-minilm-vectors.npz")
    docs, queries = z["document"].astype(np.float32), z["query"].astype(np.float32)
    doc_ids, query_ids = [str(i) for i in z["document_ids"]], [str(i) for i in z["query_ids"]]
    qrels: dict[str, dict[str, int]] = {}
    with open(Path(args.data) / "qrels" / "test.tsv", encoding="utf-8") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    judged = [i for i, qid in enumerate(query_ids) if qid in qrels]
    ids, q = [query_ids[i] for i in judged], queries[judged]

    def ndcg(qv: np.ndarray, dv: np.ndarray) -> float:
        return evaluate_embeddings(ids, qv, doc_ids, dv, qrels, similarity="cosine")["ndcg@10"]

    base = ndcg(q, docs)
    print(f"{args.dataset}: {len(docs)} documents x {docs.shape[1]}-d, {len(ids)} judged queries; uncompressed nDCG@10 {base:.4f}")
    full = make_compressor("pca", dim=args.dim, fit_sample=0).fit_unsupervised(docs)
    full_ret = ndcg(full.transform(q), full.transform(docs)) / base
    centred = docs.astype(np.float64) - docs.mean(axis=0, dtype=np.float64)
    scatter = centred.T @ centred

    def captured(components: np.ndarray) -> float:
        w = components.astype(np.float64)
        return float(np.trace(w @ scatter @ w.T))

    full_var = captured(full.components_)
    print(f"pca-{args.dim} on every row ({len(docs)}): retention {full_ret:.4f}")
    for m in args.samples:
        for seed in args.seeds:
            start = time.perf_counter()
            pca = make_compressor("pca", dim=args.dim, fit_sample=m, seed=seed).fit_unsupervised(docs)
            seconds = time.perf_counter() - start
            ret = ndcg(pca.transform(q), pca.transform(docs)) / base
            print(f"pca-{args.dim} on {m} rows (seed {seed}): retention {ret:.4f} ({ret - full_ret:+.4f}); "
                  f"corpus variance captured {captured(pca.components_) / full_var:.4f} of the full fit's; fit {seconds:.2f}s")


if __name__ == "__main__":
    main()
