"""Unsupervised compression study: every method fitted on corpus embeddings only.

No query is used in training, so every method is scored on **all** test queries of each
dataset. Cells: SciFact and ArguAna x MiniLM (384-d) and mpnet (768-d) x k = d/6 and d/3.
Methods: frozen, truncate, pca (centred), pca-uncentred, autoencoder, the unsupervised
Matryoshka-Adaptor and unsupervised DIVE, each through ``fit_unsupervised`` with its
``unsupervised_preset`` (the config defaults otherwise); trained methods run 3 seeds.

One JSON per (dataset, model, k, method, seed) under ``--results``; finished ones are skipped, so
the script resumes where it stopped. ``--report`` prints the markdown table: nDCG@10 mean ± std
over seeds, and paired tests (sign-flip permutation, bootstrap CI; embedtune.workflows.significance)
of each method's seed-averaged per-query nDCG@10 against PCA (centred and uncentred) and of DIVE
against the unsupervised Matryoshka-Adaptor.

Usage::

    nice -n 10 python benchmarks/unsupervised_study.py --models minilm            # run (resumable)
    python benchmarks/unsupervised_study.py --report                               # the table
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from embedtune import __version__  # noqa: E402
from embedtune.compress import get_compressor_class  # noqa: E402
from embedtune.data.beir import load_beir  # noqa: E402
from embedtune.encoders.dataset import embed_dataset  # noqa: E402
from embedtune.encoders.sentence_transformer import SentenceEncoder  # noqa: E402
from embedtune.evaluate.retrieval import evaluate_embeddings  # noqa: E402
from embedtune.io import atomic_write_json  # noqa: E402
from embedtune.workflows.significance import align_by_query, paired_test  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("frozen", "truncate", "pca", "pca-uncentred", "autoencoder", "mrl-adaptor", "dive")
SEEDS = (2027, 2028, 2029)
DIM_FRACTIONS = (6, 3)  # k = d/6 and d/3


def machine() -> str:
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()} ({cpu}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()})"


def build(method: str, dim: int, seed: int):
    """The method at ``dim`` with its unsupervised preset (if any) and CPU, quiet settings."""
    cls = get_compressor_class(method)
    preset = cls.get_preset(cls.unsupervised_preset) if cls.unsupervised_preset else None
    known = {f.name for f in dataclasses.fields(cls.config_class)}
    values = dict(preset.settings) if preset is not None else {}
    values.update({"dim": dim, "seed": seed})
    values.update({name: value for name, value in {"progress": False, "device": "cpu"}.items() if name in known})
    return cls(cls.config_class(**values)), (preset.name if preset is not None else "defaults")


def result_path(results: Path, dataset: str, model: str, dim: int, method: str, seed: int) -> Path:
    return results / f"{dataset}-{model}-k{dim}" / f"{method}-seed{seed}.json"


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    results = Path(args.results)
    command = " ".join([Path(sys.executable).name, *sys.argv])
    for dataset in args.datasets:
        for model in args.models:
            data = load_beir(Path(args.data_root) / dataset, "test")
            encoder = SentenceEncoder(model, normalize=True, show_progress=False)
            embeddings = embed_dataset(encoder, data)
            query_ids = [q for q in embeddings.query_ids if data.qrels.get(q)]
            queries = embeddings.queries(query_ids)
            docs = embeddings.doc_embeddings
            d = docs.shape[1]
            for fraction in args.dim_fractions:
                dim = d // fraction
                for method in args.methods:
                    seeds = SEEDS[: args.n_seeds] if get_compressor_class(method).seed_dependent else SEEDS[:1]
                    for seed in seeds:
                        path = result_path(results, dataset, model, dim, method, seed)
                        if path.is_file():
                            continue
                        compressor, preset = build(method, dim, seed)
                        start = time.perf_counter()
                        compressor.fit_unsupervised(docs)
                        fit_seconds = time.perf_counter() - start
                        metrics = evaluate_embeddings(query_ids, compressor.transform(queries), embeddings.doc_ids,
                                                      compressor.transform(docs), data.qrels)
                        record = {
                            "dataset": dataset, "model": model, "input_dim": d, "dim": dim, "method": method, "seed": seed,
                            "preset": preset, "config": compressor.config.to_dict(), "fit_details": compressor.fit_details(),
                            "selected_epoch": getattr(compressor, "selected_epoch_", None),
                            "n_docs": len(docs), "n_queries": metrics.n_queries, "metrics": metrics.aggregate,
                            "per_query_ndcg@10": {q: v["ndcg@10"] for q, v in metrics.per_query.items()},
                            "fit_seconds": round(fit_seconds, 2), "machine": machine(), "command": command,
                            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "embedtune_version": __version__,
                        }
                        atomic_write_json(path, record)
                        print(f"{dataset} {model} k={dim} {method} seed={seed}: nDCG@10 {metrics.aggregate['ndcg@10']:.4f} "
                              f"({fit_seconds:.0f}s, {preset})", flush=True)


def load_records(results: Path) -> dict[tuple[str, str, int], dict[str, list[dict]]]:
    cells: dict[tuple[str, str, int], dict[str, list[dict]]] = {}
    for path in sorted(results.glob("*/*.json")):
        record = json.loads(path.read_text())
        cells.setdefault((record["dataset"], record["model"], record["dim"]), {}).setdefault(record["method"], []).append(record)
    return cells


def seed_mean(records: list[dict]) -> dict[str, float]:
    """Per-query nDCG@10 averaged over the seeds that ran."""
    queries = sorted(set.intersection(*(set(r["per_query_ndcg@10"]) for r in records)))
    return {q: float(np.mean([r["per_query_ndcg@10"][q] for r in records])) for q in queries}


def compare(a: list[dict], b: list[dict]) -> str:
    test = paired_test(*align_by_query(seed_mean(a), seed_mean(b)))
    return f"{test.mean_difference:+.4f} (p {test.p_value:.3g})"


def summary(cells: dict[tuple[str, str, int], dict[str, list[dict]]], keys: list[tuple[str, str, int]]) -> list[str]:
    """One row per cell: every method's mean nDCG@10, then DIVE against the stronger PCA variant and the MRL-Adaptor."""
    shown = [m for m in METHODS if any(m in cells[key] for key in keys)]
    lines = ["| cell (test queries) | " + " | ".join(shown) + " | DIVE − pca (p) | DIVE − stronger PCA (p) | DIVE − MRL-Adaptor (p) |",
             "|---|" + "---|" * (len(shown) + 3)]
    for key in keys:
        runs = cells[key]
        n_queries = sorted({r["n_queries"] for rs in runs.values() for r in rs})
        means = {m: float(np.mean([r["metrics"]["ndcg@10"] for r in runs[m]])) for m in shown if m in runs}
        row = [f"{key[0]} · {key[1]} · k={key[2]} ({', '.join(map(str, n_queries))})"]
        best = max(v for m, v in means.items() if m != "frozen")
        row += [(f"**{means[m]:.4f}**" if means[m] == best and m != "frozen" else f"{means[m]:.4f}") if m in means else "–" for m in shown]
        pcas = [m for m in ("pca", "pca-uncentred") if m in runs]
        row.append(compare(runs["dive"], runs["pca"]) if "dive" in runs and "pca" in runs else "–")
        if "dive" in runs and pcas:
            stronger = max(pcas, key=lambda m: means[m])
            row.append(f"{compare(runs['dive'], runs[stronger])} vs {stronger}")
        else:
            row.append("–")
        row.append(compare(runs["dive"], runs["mrl-adaptor"]) if "dive" in runs and "mrl-adaptor" in runs else "–")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def report(args: argparse.Namespace) -> str:
    cells = load_records(Path(args.results))
    order = {name: i for i, name in enumerate(("scifact", "arguana"))}
    models = {name: i for i, name in enumerate(("minilm", "mpnet"))}
    keys = sorted(cells, key=lambda c: (models.get(c[1], 9), order.get(c[0], 9), c[2]))
    lines = summary(cells, keys) + [""]
    for key in keys:
        dataset, model, dim = key
        runs = cells[key]
        n_queries = {r["n_queries"] for rs in runs.values() for r in rs}
        lines += [f"**{dataset} · {model} · k={dim}** ({', '.join(map(str, sorted(n_queries)))} test queries, all of them)", "",
                  "| method | nDCG@10 (mean ± std over seeds) | seeds | selected epoch | vs PCA | vs PCA-uncentred | vs MRL-Adaptor (unsup.) |",
                  "|---|---|---|---|---|---|---|"]
        for method in METHODS:
            if method not in runs:
                continue
            rs = runs[method]
            scores = [r["metrics"]["ndcg@10"] for r in rs]
            spread = f"{np.mean(scores):.4f} ± {np.std(scores):.4f}" if len(rs) > 1 else f"{scores[0]:.4f}"
            epochs = [r["selected_epoch"] for r in rs if r.get("selected_epoch") is not None]
            starts = sorted({r["fit_details"].get("start", "") for r in rs} - {""})
            selected = ", ".join(map(str, epochs)) + (f" ({'; '.join(starts)} start)" if starts else "") if epochs else "–"
            cmp = [compare(rs, runs[base]) if base in runs and base != method else "–" for base in ("pca", "pca-uncentred")]
            mrl = compare(rs, runs["mrl-adaptor"]) if method == "dive" and "mrl-adaptor" in runs else "–"
            lines.append(f"| {method} | {spread} | {len(rs)} | {selected} | {cmp[0]} | {cmp[1]} | {mrl} |")
        lines.append("")
    meta = next((r for rs in (v for c in cells.values() for v in c.values()) for r in rs), None)
    if meta is not None:
        lines.append(f"Machine: {meta['machine']}. embedtune {meta['embedtune_version']}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["scifact", "arguana"])
    parser.add_argument("--models", nargs="+", default=["minilm", "mpnet"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--dim-fractions", nargs="+", type=int, default=list(DIM_FRACTIONS),
                        help="k = d / fraction for each; two processes can split the cells of one encode (e.g. 6 and 3)")
    parser.add_argument("--n-seeds", type=int, default=3, help="seeds of the seed-dependent methods (2027, 2028, 2029)")
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data" / "beir"))
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "unsupervised"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--report", action="store_true", help="print the markdown table of what has run")
    args = parser.parse_args()
    if args.report:
        print(report(args))
    else:
        run(args)


if __name__ == "__main__":
    main()
