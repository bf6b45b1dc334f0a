"""Unsupervised DIVE's selection signal: agreement with the frozen space (rank KL) or pseudo-queries.

For each collection and k, nDCG@10 on every judged test query of: the frozen float32 vectors,
centred PCA, uncentred PCA, and unsupervised DIVE selected on the held-out documents' rank KL to
the frozen space (``selection_signal='rank-kl'``, the default) or on their pseudo-queries
(``selection_signal='pseudo-queries'``: each held-out document's title or first sentence,
encoded by MiniLM as a query, retrieving that document). No query or label is used to fit or
select anything. Each row says which PCA start and which epoch DIVE kept, and the selection
scores of both starts.

Document and query vectors are the committed MiniLM ones (``benchmarks/data/vectors``); the
pseudo-queries are encoded here from ``corpus.jsonl`` with the same model and query recipe
(checked first: re-encoding a few real queries must reproduce their committed vectors).
A document whose pseudo-query would be its whole text (a title-only document, or a text without
a title or a sentence end) gets none; a collection where no held-out document has one is
reported as such and DIVE is not fitted on that signal.

Usage::

    python benchmarks/unsupervised_selection.py                       # npl cacm med, k = 64 128, one seed, at most 20 epochs
    python benchmarks/unsupervised_selection.py --datasets med --dims 64 --epochs 3   # a quick look
    python benchmarks/unsupervised_selection.py --datasets npl --source first-words --signals pseudo-queries \
        --rows rows-npl-first-words.json                               # NPL has neither titles nor sentence ends

Writes ``--out/--rows`` (one row per dataset, k and method, with per-query nDCG@10) and prints
the markdown table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from embedtune import __version__  # noqa: E402
from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.compress import get_compressor_class  # noqa: E402
from embedtune.compress.base import PseudoQueries, TrainingData  # noqa: E402
from embedtune.compress.dive import DIVECompressor, DIVEConfig  # noqa: E402
from embedtune.data.beir import load_beir  # noqa: E402
from embedtune.data.pseudo_queries import PSEUDO_QUERY_SOURCES, pseudo_query_texts  # noqa: E402
from embedtune.encoders.sentence_transformer import SentenceEncoder  # noqa: E402
from embedtune.evaluate.retrieval import evaluate_embeddings  # noqa: E402
from embedtune.io import atomic_write_json  # noqa: E402
from embedtune.workflows.significance import align_by_query, paired_test  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIGNALS = ("rank-kl", "pseudo-queries")


def load_vectors(name: str) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    with np.load(ROOT / "benchmarks" / "data" / "vectors" / f"{name}-minilm-vectors.npz", allow_pickle=False) as bundle:
        return ([str(i) for i in bundle["document_ids"]], np.ascontiguousarray(bundle["document"], dtype=np.float32),
                [str(i) for i in bundle["query_ids"]], np.ascontiguousarray(bundle["query"], dtype=np.float32))


def score(query_ids: list[str], queries: np.ndarray, doc_ids: list[str], docs: np.ndarray, qrels: dict) -> tuple[float, dict[str, float]]:
    metrics = evaluate_embeddings(query_ids, queries, doc_ids, docs, qrels)
    return float(metrics.aggregate["ndcg@10"]), {q: float(v["ndcg@10"]) for q, v in metrics.per_query.items()}


def dive_config(dim: int, seed: int, signal: str, args: argparse.Namespace) -> DIVEConfig:
    """The ``unsupervised`` preset, capped so that a fit takes about a minute on one CPU thread."""
    return DIVEConfig.preset("unsupervised", dim=dim, seed=seed, epochs=args.epochs, patience=args.patience,
                             max_train_docs=args.max_train_docs, selection_signal=signal, progress=False, device="cpu")


def run_dataset(name: str, args: argparse.Namespace, encoder: SentenceEncoder, command: str) -> list[dict[str, Any]]:
    data = load_beir(Path(args.data_root) / name, "test")
    doc_ids, docs, all_query_ids, all_queries = load_vectors(name)
    judged = [i for i, q in enumerate(all_query_ids) if any(rel > 0 for rel in data.qrels.get(q, {}).values())]
    query_ids, queries = [all_query_ids[i] for i in judged], all_queries[judged]
    # The pseudo-queries must be encoded as the committed queries were: re-encode a few and compare.
    probe = [all_query_ids[i] for i in judged[:4]]
    drift = float(np.abs(encoder.encode([data.queries[q] for q in probe], "query") - queries[:4]).max())
    if drift > 1e-4:
        raise SystemExit(f"{name}: re-encoded queries differ from the committed vectors by {drift:.2e}; the encoder recipe differs.")
    base = {"dataset": name, "n_docs": len(docs), "n_queries": len(query_ids), "seed": args.seed, "command": command,
            "embedtune_version": __version__}
    rows: list[dict[str, Any]] = []
    frozen, per_query = score(query_ids, queries, doc_ids, docs, data.qrels)
    rows.append({**base, "dim": docs.shape[1], "method": "frozen", "ndcg@10": frozen, "per_query_ndcg@10": per_query})
    print(f"{name}: frozen {frozen:.4f} ({len(query_ids)} judged queries, {len(docs)} documents)", flush=True)
    for dim in args.dims:
        for method in ("pca", "pca-uncentred"):
            cls = get_compressor_class(method)
            compressor = cls(cls.config_class(dim=dim, seed=args.seed)).fit_unsupervised(docs)
            value, per_query = score(query_ids, compressor.transform(queries), doc_ids, compressor.transform(docs), data.qrels)
            rows.append({**base, "dim": dim, "method": method, "ndcg@10": value, "per_query_ndcg@10": per_query})
            print(f"{name} k={dim}: {method} {value:.4f}", flush=True)
        for signal in args.signals:
            compressor = DIVECompressor(dive_config(dim, args.seed, signal, args))
            train = TrainingData.corpus_only(docs, doc_ids)
            row: dict[str, Any] = {**base, "dim": dim, "method": f"dive ({signal})", "selection_signal": signal}
            start = time.perf_counter()
            if signal == "pseudo-queries":
                held = [doc_ids[r] for r in compressor.selection_documents(len(docs))]
                ids, _, texts = pseudo_query_texts(data.corpus, held, args.source, skip_whole_documents=True)
                row.update({"pseudo_query_source": args.source, "held_out_documents": len(held), "pseudo_queries": len(ids)})
                if not ids:
                    row["ndcg@10"] = None
                    row["note"] = (f"none of the {len(held)} held-out documents has a {args.source} pseudo-query shorter than "
                                   "the document itself; not fitted")
                    rows.append(row)
                    print(f"{name} k={dim}: dive ({signal}) not applicable: {row['note']}", flush=True)
                    continue
                train = TrainingData(train.query_ids, train.query_embeddings, train.doc_ids, train.doc_embeddings, {},
                                     pseudo_queries=PseudoQueries(ids, encoder.encode(texts, "query"), np.zeros((0, 3)), args.source))
            compressor.fit_unsupervised(train)
            fit_seconds = time.perf_counter() - start
            value, per_query = score(query_ids, compressor.transform(queries), doc_ids, compressor.transform(docs), data.qrels)
            start_row = compressor.history_[0]
            row.update({"ndcg@10": value, "per_query_ndcg@10": per_query, "start": compressor.fit_details().get("start"),
                        "selected_epoch": compressor.selected_epoch_, "epochs_run": len(compressor.history_) - 1,
                        "start_scores": {key: value for key, value in start_row.items() if key.endswith("_start")},
                        "fit_seconds": round(fit_seconds, 1), "config": compressor.config.to_dict()})
            rows.append(row)
            print(f"{name} k={dim}: dive ({signal}) {value:.4f}, {row['start']} start, epoch {row['selected_epoch']} "
                  f"of {row['epochs_run']} ({fit_seconds:.0f}s)", flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """One line per dataset and k: every method's nDCG@10, what each DIVE kept, pseudo-queries minus rank KL (p)."""
    lines = ["| collection (judged queries) | k | frozen | PCA centred | PCA uncentred | DIVE, rank-KL selection | "
             "DIVE, pseudo-query selection | pseudo − rank-KL (p) |", "|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        frozen = next(r for r in mine if r["method"] == "frozen")
        for dim in sorted({r["dim"] for r in mine if r["method"] != "frozen"}):
            cell = {r["method"]: r for r in mine if r["dim"] == dim}

            def dive(signal: str) -> str:
                r = cell.get(f"dive ({signal})")
                if r is None or r["ndcg@10"] is None:
                    return "n/a" + (f" ({r['pseudo_queries']} of {r['held_out_documents']} held-out documents have a pseudo-query)" if r else "")
                extra = f", {r['pseudo_queries']} pseudo-queries" if signal == "pseudo-queries" else ""
                return f"{r['ndcg@10']:.4f} ({r['start'].split()[0]}, epoch {r['selected_epoch']}{extra})"

            a, b = cell.get("dive (pseudo-queries)"), cell.get("dive (rank-kl)")
            diff = "–"
            if a and b and a["ndcg@10"] is not None and b["ndcg@10"] is not None:
                test = paired_test(*align_by_query(a["per_query_ndcg@10"], b["per_query_ndcg@10"]))
                diff = f"{test.mean_difference:+.4f} ({test.p_value:.2g})"
            lines.append(f"| {name} ({frozen['n_queries']}) | {dim} | {frozen['ndcg@10']:.4f} | {cell['pca']['ndcg@10']:.4f} | "
                         f"{cell['pca-uncentred']['ndcg@10']:.4f} | {dive('rank-kl')} | {dive('pseudo-queries')} | {diff} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["npl", "cacm", "med"])
    parser.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seed", type=int, default=2027)
    parser.add_argument("--epochs", type=int, default=20, help="cap on DIVE's corpus passes (the preset's: 50)")
    parser.add_argument("--patience", type=int, default=5, help="stop after this many epochs without improvement (as the preset)")
    parser.add_argument("--max-train-docs", type=int, default=4000, help="DIVE trains on a seeded sample of this many documents")
    parser.add_argument("--source", default="title", choices=list(PSEUDO_QUERY_SOURCES), help="pseudo-query text")
    parser.add_argument("--signals", nargs="+", default=list(SIGNALS), choices=list(SIGNALS), help="DIVE's selection signals to fit")
    parser.add_argument("--rows", default="rows.json", help="file name of the rows under --out")
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "beir"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "unsupervised-selection"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--table", action="store_true", help="print the table of --out/rows.json and stop")
    args = parser.parse_args()
    out = Path(args.out)
    if args.table:
        print(table(json.loads((out / args.rows).read_text())["rows"]))
        return
    torch.set_num_threads(args.threads)
    command = " ".join(["python", *sys.argv])
    started = dt.datetime.now(dt.timezone.utc)
    # Read when the run starts: the code it imported, even if the branch moves on while it runs.
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or None
    encoder = SentenceEncoder("minilm", normalize=True, show_progress=False)
    rows = [row for name in args.datasets for row in run_dataset(name, args, encoder, command)]
    finished = dt.datetime.now(dt.timezone.utc)
    atomic_write_json(out / args.rows, {"command": command, "machine": machine_info(), "git_commit": commit, "started": started.isoformat(timespec="seconds"),
                                          "finished": finished.isoformat(timespec="seconds"), "rows": rows})
    print(table(rows))


if __name__ == "__main__":
    main()
