"""A query-side map with the documents fixed: does learning only the queries' side generalise to unseen queries?

    .venv/bin/python benchmarks/query_side_map.py          # SciFact, MiniLM: prints the table, writes the rows

The documents stay the corpus's centred PCA-k projection (what a label-free index already holds); only
a k×k map ``q ↦ q (I + A)`` of the PCA-projected query is learned, with InfoNCE (τ 0.05) over every
document on SciFact's training pairs and an L2 penalty ``λ ||A||²`` that shrinks it towards the
identity (the PCA start). A query map cannot move documents, so the question is whether it still
learns which documents are popular. No selection: a fixed 30 epochs, Adam 1e-3, batch 64, seed 0,
every λ reported.

Test queries are split as in the generalisation study: **seen** (every positive was a training
positive) and **unseen** (none was); Δ and p are paired against PCA on the same queries
(:func:`embedtune.workflows.significance.paired_test`). Rows:
``benchmarks/results/query-side-map/scifact-minilm.json``.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import near_limit  # noqa: E402
from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.evaluate.metrics import evaluate_run  # noqa: E402
from embedtune.evaluate.search import run_from_topk  # noqa: E402
from embedtune.io import atomic_write_bytes, atomic_write_json  # noqa: E402
from embedtune.runtime import set_threads  # noqa: E402
from embedtune.workflows.significance import paired_test  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "query-side-map" / "scifact-minilm.json"
DIMS = (64, 128)
PENALTIES = (1.0, 0.1, 0.01)
EPOCHS, BATCH, LR, TAU = 30, 64, 1e-3, 0.05


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8") as handle:
        next(handle)
        for line in handle:
            qid, did, score = line.rstrip("\n").split("\t")
            if int(score) > 0:
                qrels.setdefault(qid, {})[did] = int(score)
    return qrels


def per_query_ndcg(queries: np.ndarray, query_ids: list[str], docs: np.ndarray, doc_ids: list[str],
                   qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    scores = queries @ docs.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :near_limit.FETCH]
    run = run_from_topk(query_ids, np.take_along_axis(scores, top, 1), top, doc_ids, 100, True)
    return {q: v["ndcg@10"] for q, v in evaluate_run(qrels, run, ("ndcg@10",)).per_query.items()}


def main() -> int:
    set_threads(1)
    torch.manual_seed(0)
    arrays = np.load(near_limit.VECTORS[("scifact", "minilm")], allow_pickle=False)
    docs = arrays["document"].astype(np.float64)
    doc_ids = [str(x) for x in arrays["document_ids"]]
    all_queries, query_ids = arrays["query"].astype(np.float64), [str(x) for x in arrays["query_ids"]]
    row_of_query, row_of_doc = {q: i for i, q in enumerate(query_ids)}, {d: i for i, d in enumerate(doc_ids)}
    test = read_qrels(near_limit.BEIR / "scifact" / "qrels" / "test.tsv")
    train = read_qrels(near_limit.BEIR / "scifact" / "qrels" / "train.tsv")
    test_ids = [q for q in test if q in row_of_query]
    trained_positives = {d for q in train for d in train[q]}
    subsets = {"all": test_ids, "seen": [q for q in test_ids if set(test[q]) <= trained_positives],
               "unseen": [q for q in test_ids if not set(test[q]) & trained_positives]}
    centred = docs - docs.mean(axis=0)
    eigenvalues, axes = np.linalg.eigh(centred.T @ centred / len(docs))
    axes = axes[:, np.argsort(-eigenvalues)]
    pairs = [(row_of_query[q], row_of_doc[d]) for q in train if q in row_of_query for d in train[q] if d in row_of_doc]
    test_queries = all_queries[[row_of_query[q] for q in test_ids]]
    rows: dict[str, dict] = {}
    for k in DIMS:
        projection = axes[:, :k]
        doc_codes = (centred @ projection).astype(np.float32)
        doc_tensor = torch.from_numpy(doc_codes)
        train_queries = torch.tensor(all_queries[[p[0] for p in pairs]] @ projection, dtype=torch.float32)
        positives = torch.tensor([p[1] for p in pairs])
        base = per_query_ndcg((test_queries @ projection).astype(np.float32), test_ids, doc_codes, doc_ids, test)
        rows[f"pca-{k}"] = {"k": k, "penalty": None, "per_query": base}
        for penalty in PENALTIES:
            offset = torch.zeros(k, k, requires_grad=True)
            optimiser = torch.optim.Adam([offset], lr=LR)
            for _ in range(EPOCHS):
                order = torch.randperm(len(pairs))
                for start in range(0, len(pairs), BATCH):
                    batch = order[start : start + BATCH]
                    logits = train_queries[batch] @ (torch.eye(k) + offset) @ doc_tensor.T / TAU
                    loss = torch.nn.functional.cross_entropy(logits, positives[batch]) + penalty * (offset ** 2).sum()
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
            query_map = (np.eye(k) + offset.detach().numpy().astype(np.float64))
            mapped = per_query_ndcg((test_queries @ projection @ query_map).astype(np.float32), test_ids, doc_codes, doc_ids, test)
            rows[f"pca-{k} + query map, penalty {penalty}"] = {"k": k, "penalty": penalty, "per_query": mapped}
    lines = ["| setting | all | seen | unseen | Δ unseen vs PCA (p) | Δ seen vs PCA (p) |", "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        base = rows[f"pca-{row['k']}"]["per_query"]
        means = {s: float(np.mean([row["per_query"][q] for q in ids])) for s, ids in subsets.items()}
        row["means"] = means
        deltas = []
        for subset in ("unseen", "seen"):
            if row["penalty"] is None:
                deltas.append("–")
                continue
            ids = subsets[subset]
            test_ = paired_test(np.array([row["per_query"][q] for q in ids]), np.array([base[q] for q in ids]))
            row[f"delta_{subset}"] = test_.to_dict()
            deltas.append(f"{test_.mean_difference:+.4f} (p {test_.p_value:.3f})")
        lines.append(f"| {name} | {means['all']:.4f} | {means['seen']:.4f} | {means['unseen']:.4f} | {deltas[0]} | {deltas[1]} |")
    print("\n".join(lines))
    atomic_write_json(OUT, {"command": ".venv/bin/python benchmarks/query_side_map.py", "machine": machine_info(),
                            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                            "counts": {s: len(ids) for s, ids in subsets.items()}, "table": lines, "rows": rows})
    counts = ", ".join(f"{len(ids)} {s}" for s, ids in subsets.items())
    report = ["# A query-side map with the documents fixed (SciFact, MiniLM)", "",
              f"Written by `.venv/bin/python benchmarks/query_side_map.py` on {machine_info().get('cpu', '')}, one thread, "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; protocol in the script's docstring. "
              f"nDCG@10 on the test queries ({counts}).", "", *lines, ""]
    atomic_write_bytes(OUT.with_name("REPORT.md"), "\n".join(report).encode())
    print(OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
