"""Coding for the score's error: weight the transform coder by the distribution of real (unlabelled) queries.

    .venv/bin/python benchmarks/query_weighted_coding.py --data scifact --model minilm     # rows (resumable)
    .venv/bin/python benchmarks/query_weighted_coding.py --report                          # REPORT.md from the rows

A transform coder (``klt-pq:B``) spends its bits where the *documents* vary most, so it minimises the
vectors' squared error. Retrieval pays for the error of the *scores* ``q · x``: an error ``e`` on a
document costs ``E[(q · e)^2] = e^T Σ_q e`` over queries with second moment ``Σ_q``. Coding

    y = U^T Σ_q^{1/2} x,          z = U^T Σ_q^{-1/2} q         (so z · y = q · x),

with ``U`` the eigenvectors of ``Σ_q^{1/2} Σ_x Σ_q^{1/2}``, makes the code's squared error in ``y`` the
expected score error, and the coder's allocation (its KLT and eigenvalue grouping) becomes allocation
for the score (Gersho & Gray, ch. 8, weighted MSE). ``Σ_q`` is estimated from a query log without any
labels, shrunk towards a multiple of the identity with weight ``1 − α`` (``α = 0``: the plain coder);
``docs`` uses the documents' own second moment in place of a log (no queries at all).

The query log: SciFact's training queries (their texts' vectors only, never their labels); a collection
with test queries only gives a hashed half of them as the log and scores the other half, every setting
on the same scored queries. The codec's tables are cross-fitted as in ``benchmarks/near_limit.py``
(each half of the corpus is encoded by tables fitted on the other half), so shares here compare with
each other, side by side, not with a codec fitted on every document. Δ and p: paired against the
plain coder at the same bytes (:func:`embedtune.workflows.significance.paired_test`).

Rows: ``benchmarks/results/query-weighted/<data>-<model>.json`` (one file per corpus, rewritten as
each setting finishes, so a killed run resumes).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import near_limit  # noqa: E402
from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.index.codecs import QuantizedIndex, Precision  # noqa: E402
from embedtune.io import atomic_write_bytes, atomic_write_json  # noqa: E402
from embedtune.runtime import set_threads  # noqa: E402
from embedtune.workflows.significance import paired_test  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "query-weighted"
BUDGETS = (16, 32, 48)
FAMILY = "klt-pq"
#: Σ_q's weight against the identity: 0 is the plain coder; "docs" uses the documents' second moment.
WEIGHTINGS: tuple[tuple[str, float], ...] = (("none", 0.0), ("log", 0.05), ("log", 0.2), ("log", 0.5), ("docs", 0.2))


def _sqrt_and_inverse(s: np.ndarray, floor: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    w, v = np.linalg.eigh(s)
    w = np.maximum(w, floor * w.max())
    return (v * np.sqrt(w)) @ v.T, (v / np.sqrt(w)) @ v.T


def query_log(data: str, ds: dict[str, Any]) -> tuple[np.ndarray, str]:
    """The unlabelled query log's vectors, and a line saying where they came from; ``ds`` keeps only the scored queries."""
    arrays = np.load(near_limit.VECTORS[(data, ds["model"])], allow_pickle=False)
    ids = [str(x) for x in arrays["query_ids"]]
    train = near_limit.BEIR / data / "qrels" / "train.tsv"
    if train.is_file():
        with open(train, encoding="utf-8") as handle:
            next(handle)
            log_ids = {line.split("\t", 1)[0] for line in handle}
        rows = [i for i, q in enumerate(ids) if q in log_ids and q not in ds["qrels"]]
        return np.ascontiguousarray(arrays["query"][rows], dtype=np.float32), f"{len(rows)} training queries (texts only)"
    in_log = [int(hashlib.sha256(q.encode()).hexdigest(), 16) % 2 == 0 for q in ds["query_ids"]]
    log = ds["queries"][np.array(in_log)]
    keep = np.array([not x for x in in_log])
    ds["queries"] = np.ascontiguousarray(ds["queries"][keep])
    ds["query_ids"] = [q for q, k in zip(ds["query_ids"], keep) if k]
    ds["qrels"] = {q: ds["qrels"][q] for q in ds["query_ids"]}  # a log query unscored, not scored as zero
    return np.ascontiguousarray(log), f"a hashed half of the test queries ({len(log)}); the other {len(ds['query_ids'])} are scored"


def weighted_setting(ds: dict[str, Any], codec: str, second_moment: np.ndarray | None, alpha: float) -> near_limit.Searcher:
    """``codec`` on ``y = U^T S^{1/2} x`` (``S`` = α Σ_q + (1 − α) tr(Σ_q)/d · I, fitted on the other half), queries ``z``."""
    docs = ds["docs"]

    def build_half(rows: np.ndarray, fit_rows: np.ndarray):
        fit = docs[fit_rows].astype(np.float64)
        if second_moment is None:
            transform = inverse = np.eye(docs.shape[1])
        else:
            moment = fit.T @ fit / len(fit) if isinstance(second_moment, str) else second_moment
            s = alpha * moment + (1 - alpha) * np.trace(moment) / len(moment) * np.eye(len(moment))
            root, inv_root = _sqrt_and_inverse(s)
            centred = fit - fit.mean(axis=0)
            _, u = np.linalg.eigh(root @ (centred.T @ centred / len(fit)) @ root)
            transform, inverse = root @ u, inv_root @ u  # documents x @ transform, queries q @ inverse
        t32, i32 = transform.astype(np.float32), inverse.astype(np.float32)
        yb = np.ascontiguousarray(docs[rows] @ t32)
        index = QuantizedIndex.build(yb, Precision(codec), train=np.ascontiguousarray(docs[fit_rows] @ t32))
        rec = index.reconstruct(yb)
        back = np.linalg.inv(transform).astype(np.float32)
        return (index, lambda q, k: index.search(np.ascontiguousarray(q @ i32), k), None if rec is None else rec @ back,
                index.ram_bytes(), index.fixed_bytes())

    return near_limit.cross_fitted(ds, build_half)


FLOAT_DIMS = (32, 64, 128)


def float_map_rows(ds: dict[str, Any], sigma_q: np.ndarray, alpha: float) -> dict[str, dict[str, Any]]:
    """Rank-``k`` float maps (no quantiser), fitted on every document: centred PCA against the query-shaped map.

    The query-shaped map is the rank-``k`` ``M = B A`` closest to the identity in expected squared score error
    over queries with second moment ``S`` (the α-shrunk log) and centred documents: the best rank-``k``
    approximation of ``S^{1/2} Σ_x^{1/2}`` (Eckart–Young), so documents map to ``V_k^T Σ_x^{-1/2} x`` and queries
    to ``Σ_k U_k^T S^{-1/2} q``. With ``S ∝ I`` it is centred PCA.
    """
    docs = ds["docs"].astype(np.float64)
    centred = docs - docs.mean(axis=0)
    sigma_x = centred.T @ centred / len(docs)
    eigenvalues, axes = np.linalg.eigh(sigma_x)
    axes = axes[:, ::-1]
    s = alpha * sigma_q + (1 - alpha) * np.trace(sigma_q) / len(sigma_q) * np.eye(len(sigma_q))
    s_root, s_inv = _sqrt_and_inverse(s)
    x_root, x_inv = _sqrt_and_inverse(sigma_x)
    u, sv, vt = np.linalg.svd(s_root @ x_root)
    rows: dict[str, dict[str, Any]] = {}
    for k in FLOAT_DIMS:
        maps = {f"pca-{k}": (axes[:, :k], axes[:, :k]),
                f"query-shaped-{k} alpha={alpha}": ((vt[:k] @ x_inv).T, ((u[:, :k] * sv[:k]).T @ s_inv).T)}
        for name, (doc_map, query_map) in maps.items():
            xb = np.ascontiguousarray(docs @ doc_map, dtype=np.float32)
            qmap = query_map.astype(np.float32)

            def exact(q: np.ndarray, n: int, xb=xb, qmap=qmap) -> tuple[np.ndarray, np.ndarray]:
                scores = (q @ qmap) @ xb.T
                top = np.argsort(-scores, axis=1, kind="stable")[:, :n]
                return np.take_along_axis(scores, top, 1), top

            row = near_limit.score(ds, near_limit.Searcher(exact, 4 * k, 0, 0.0), 8 * 4 * k)
            row.update(budget=4 * k, weighting="float-map", alpha=alpha if "query" in name else 0.0, dims=k)
            rows[name] = row
    return rows


def run(data: str, model: str) -> Path:
    set_threads(1)
    ds = near_limit.load(data, model)
    ds["model"] = model
    log, log_note = query_log(data, ds)
    sigma_q = log.astype(np.float64).T @ log.astype(np.float64) / len(log)
    out = RESULTS / f"{data}-{model}.json"
    done: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    rows = done.get("rows", {})
    if "float32" not in rows:
        def exact(q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            scores = q @ ds["docs"].T
            top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            return np.take_along_axis(scores, top, 1), top
        rows["float32"] = near_limit.score(ds, near_limit.Searcher(exact, 4 * ds["docs"].shape[1], 0, 0.0, ds["docs"]), 8 * 4 * ds["docs"].shape[1])

    def save() -> None:
        atomic_write_json(out, {"data": data, "model": model, "query_log": log_note, "n_scored_queries": len(ds["query_ids"]),
                                "n_documents": len(ds["docs"]), "machine": machine_info(),
                                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                "command": f".venv/bin/python benchmarks/query_weighted_coding.py --data {data} --model {model}",
                                "rows": rows})

    if f"pca-{FLOAT_DIMS[0]}" not in rows:
        rows.update(float_map_rows(ds, sigma_q, 0.5))
        save()
    for budget in BUDGETS:
        for kind, alpha in WEIGHTINGS:
            name = f"{FAMILY}:{budget} weight={kind}" + (f" alpha={alpha}" if kind != "none" else "")
            if name in rows:
                continue
            moment = None if kind == "none" else ("docs" if kind == "docs" else sigma_q)
            start = time.perf_counter()
            searcher = weighted_setting(ds, f"{FAMILY}:{budget}", moment, alpha)  # type: ignore[arg-type]
            row = near_limit.score(ds, searcher, 8 * budget)
            row.update(budget=budget, weighting=kind, alpha=alpha, fit_s=time.perf_counter() - start)
            rows[name] = row
            print(f"{data}-{model} {name}: nDCG@10 {row['ndcg@10']:.4f} ({row['ndcg@10'] / rows['float32']['ndcg@10']:.1%}), "
                  f"gap {row['gap_db']:.2f} dB, score error {row['score_error']:.2e}", flush=True)
            save()
    return out


def report() -> str:
    lines = ["# Coding for the score's error: transform coders weighted by a query log", "",
             "Generated by `.venv/bin/python benchmarks/query_weighted_coding.py --report` from the rows beside it;",
             "method and protocol in the script's docstring. Share: nDCG@10 over float32's on the same scored queries;",
             "Δ and p: paired against the plain coder (`none`) at the same bytes. dB: the decoded documents' MSE above",
             "the Gaussian bound (the weighted coders trade vector error for score error, so their dB can rise while",
             "retrieval improves). Codec tables cross-fitted on corpus halves.", ""]
    for path in sorted(RESULTS.glob("*.json")):
        run_ = json.loads(path.read_text())
        rows = run_["rows"]
        ref = rows["float32"]
        lines += [f"## {run_['data']}-{run_['model']}", "",
                  f"{run_['n_documents']:,} documents; query log: {run_['query_log']}; {run_['n_scored_queries']} scored queries; "
                  f"float32 nDCG@10 {ref['ndcg@10']:.4f}. Command `{run_['command']}`; {run_['date']}; "
                  f"{run_['machine'].get('cpu', '')}, one thread.", "",
                  "| bytes | weighting | share | Δ vs plain (p) | dB to bound | score error |", "|---|---|---|---|---|---|"]
        for budget in BUDGETS:
            plain = rows.get(f"{FAMILY}:{budget} weight=none")
            for name, row in sorted(rows.items(), key=lambda item: (item[1].get("weighting") != "none", item[0])):
                if name == "float32" or row.get("budget") != budget or row.get("weighting") == "float-map":
                    continue
                label = row["weighting"] + (f", α {row['alpha']}" if row["weighting"] != "none" else "")
                delta = "–"
                if plain is not None and row is not plain:
                    ids = sorted(plain["per_query"])
                    test = paired_test(np.array([row["per_query"][q] for q in ids]), np.array([plain["per_query"][q] for q in ids]))
                    delta = f"{test.mean_difference:+.4f} (p {test.p_value:.3f})"
                lines.append(f"| {budget} B | {label} | {row['ndcg@10'] / ref['ndcg@10']:.1%} | {delta} | {row['gap_db']:.2f} | "
                             f"{row['score_error']:.2e} |")
        lines += ["", "Rank-k float maps (float32 codes, 4k bytes), fitted on every document: centred PCA against the "
                  "query-shaped map (the log's second moment, α 0.5):", "",
                  "| k | PCA share | query-shaped share | Δ (p) |", "|---|---|---|---|"]
        for k in FLOAT_DIMS:
            pca, shaped = rows.get(f"pca-{k}"), next((r for n, r in rows.items() if n.startswith(f"query-shaped-{k} ")), None)
            if pca is None or shaped is None:
                continue
            ids = sorted(pca["per_query"])
            test = paired_test(np.array([shaped["per_query"][q] for q in ids]), np.array([pca["per_query"][q] for q in ids]))
            lines.append(f"| {k} | {pca['ndcg@10'] / ref['ndcg@10']:.1%} | {shaped['ndcg@10'] / ref['ndcg@10']:.1%} | "
                         f"{test.mean_difference:+.4f} (p {test.p_value:.3f}) |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=sorted({d for d, _ in near_limit.VECTORS}))
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--report", action="store_true", help="write REPORT.md from the rows, measuring nothing")
    args = parser.parse_args(argv)
    if args.report:
        atomic_write_bytes(RESULTS / "REPORT.md", (report() + "\n").encode())
        print(RESULTS / "REPORT.md")
        return 0
    if not args.data:
        parser.error("give --data (or --report)")
    print(run(args.data, args.model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
