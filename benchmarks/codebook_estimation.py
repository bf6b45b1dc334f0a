"""How much of a KLT product quantiser's distance from the Gaussian bound is codebook estimation, on small corpora.

The near-limit codecs fit their codebooks on the corpus (at most 65,536 rows) and are measured cross-fitted: tables
fitted on one half of the documents code the other half, as new documents would be. On corpora of 1k-11k documents
that leaves 500-5,700 rows to train 256-entry codebooks, and the codecs sit one to three decibels above the Gaussian
rate-distortion bound at 32 B (``benchmarks/results/near-limit/REPORT.md``). This benchmark separates two causes:

* **in-sample** error (the tables code the rows they were fitted on) against **held-out** error (the other half);
* codebooks trained on the rows (**data**) against codebooks trained on 65,536 rows drawn from the Gaussian with the
  KLT's eigenvalues (**gaussian**): no estimation error beyond the eigenvalues, at the price of ignoring any
  structure the Gaussian lacks.

A third shape tries groups of unequal size (**variable**): consecutive KLT axes, each group holding an equal share of
the reverse water-filling rate at the budget (a strong axis shares its 8 bits with few others, weak axes share them
with many), each group coded by its own 256-entry k-means on the rows.

Data and Gaussian tables use the same KLT (fitted on the fitting half), the same axes (the first ``r``) and the same grouping of axes
into sub-quantisers (:func:`~embedtune.index.codecs.transform.eigenvalue_allocation`), with FAISS's
``ProductQuantizer`` (8-bit: ``B`` sub-quantisers; 4-bit: ``2B``). Error is ``||x - x̂||²`` per document on the
unit vectors, and dB is measured against :func:`~embedtune.index.codecs.rate_distortion.gaussian_bound` at ``8B`` bits
for the whole corpus's spectrum, as in ``benchmarks/near_limit.py``. No queries and no labels are read.

    python benchmarks/codebook_estimation.py --out benchmarks/results/codebook-estimation
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import time
from pathlib import Path

import faiss
import numpy as np

from embedtune.index.codecs.rate_distortion import corpus_spectrum, gap_db, gaussian_bound, water_level
from embedtune.index.codecs.transform import eigenvalue_allocation, fit_klt
from embedtune.io import atomic_write_bytes, atomic_write_json

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORPORA = {
    "scifact-minilm": ROOT / "src/embedtune/datasets/scifact-minilm-vectors.npz",
    "arguana-minilm": HERE / "data/vectors/arguana-minilm-vectors.npz",
    "npl-minilm": HERE / "data/vectors/npl-minilm-vectors.npz",
    "cacm-minilm": HERE / "data/vectors/cacm-minilm-vectors.npz",
    "med-minilm": HERE / "data/vectors/med-minilm-vectors.npz",
    "scifact-mpnet": HERE / "data/vectors/scifact-mpnet-vectors.npz",
}
#: Rows of the Gaussian the model codebooks are trained on (the near-limit codecs' fit-sample cap).
GAUSSIAN_ROWS = 65_536


def machine() -> str:
    """The CPU and its core count (:func:`embedtune.bench.efficiency.machine_info`)."""
    from embedtune.bench.efficiency import machine_info

    info = machine_info()
    return f"{info['cpu']}, {os.cpu_count()} CPUs"


def error(x: np.ndarray, decoded: np.ndarray) -> float:
    """Mean ``||x - x̂||²`` per row, in float64."""
    return float(((np.asarray(x, np.float64) - decoded) ** 2).sum(axis=1).mean())


def measure(fit: np.ndarray, other: np.ndarray, eigenvalues: np.ndarray, axes: np.ndarray, budget: int, nbits: int,
            axes_kept: int, seed: int) -> dict[str, float]:
    """In-sample and held-out error of data-trained and Gaussian-trained KLT-PQ tables (KLT of the fitting half)."""
    mean = fit.mean(axis=0)
    groups = 8 * budget // nbits
    order = eigenvalue_allocation(eigenvalues, axes_kept, groups)
    chosen = axes[:, order]
    variances = np.clip(eigenvalues[order], 0.0, None)
    y_fit = np.ascontiguousarray((fit - mean) @ chosen, dtype=np.float32)
    y_other = np.ascontiguousarray((other - mean) @ chosen, dtype=np.float32)
    gaussian = (np.random.default_rng(seed + 1).standard_normal((GAUSSIAN_ROWS, axes_kept)) * np.sqrt(variances)).astype(np.float32)
    row: dict[str, float] = {}
    for kind, training in (("data", y_fit), ("gaussian", gaussian)):
        quantiser = faiss.ProductQuantizer(axes_kept, groups, nbits)
        quantiser.cp.seed = seed
        start = time.perf_counter()
        quantiser.train(np.ascontiguousarray(training))
        row[f"{kind}_fit_s"] = time.perf_counter() - start
        for part, x, y in (("in_sample", fit, y_fit), ("held_out", other, y_other)):
            row[f"{kind}_{part}"] = error(x, quantiser.decode(quantiser.compute_codes(y)) @ chosen.T + mean)
    return row


def split(docs: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The fitting half and the other half (seeded)."""
    order = np.random.default_rng(seed).permutation(len(docs))
    return docs[np.sort(order[: len(docs) // 2])], docs[np.sort(order[len(docs) // 2:])]


def variable_groups(eigenvalues: np.ndarray, bits: float, groups: int) -> list[np.ndarray]:
    """Consecutive axes in ``groups`` groups of equal reverse water-filling rate at ``bits`` (axes with no rate left out)."""
    rate = np.maximum(0.0, 0.5 * np.log2(np.maximum(eigenvalues, 1e-30) / water_level(eigenvalues, bits)))
    active = int((rate > 0).sum())
    cumulative = np.cumsum(rate[:active])
    # Group j ends where the running rate passes (j + 1) / groups of the total; each group keeps at least one axis.
    ends = np.searchsorted(cumulative, cumulative[-1] * np.arange(1, groups + 1) / groups - 1e-9) + 1
    ends = np.maximum(ends, np.arange(1, groups + 1))
    ends[-1] = max(active, groups)
    ends = np.minimum(np.maximum.accumulate(ends), max(active, groups))
    starts = np.concatenate(([0], ends[:-1]))
    return [np.arange(a, b) for a, b in zip(starts, ends) if b > a]


def variable_error(fit: np.ndarray, other: np.ndarray, eigenvalues: np.ndarray, axes: np.ndarray, budget: int,
                   seed: int) -> tuple[float, int]:
    """Held-out error of 8-bit k-means tables on :func:`variable_groups`, and the number of axes they code."""
    mean = fit.mean(axis=0)
    groups = variable_groups(eigenvalues, 8 * budget, budget)
    kept = int(groups[-1][-1]) + 1
    chosen = axes[:, :kept]
    y_fit = np.ascontiguousarray((fit - mean) @ chosen, dtype=np.float32)
    y_other = np.ascontiguousarray((other - mean) @ chosen, dtype=np.float32)
    decoded = np.zeros(y_other.shape, dtype=np.float64)
    for group in groups:
        kmeans = faiss.Kmeans(len(group), 256, niter=25, seed=seed + 1, verbose=False)
        kmeans.train(np.ascontiguousarray(y_fit[:, group]))
        _, nearest = kmeans.index.search(np.ascontiguousarray(y_other[:, group]), 1)
        decoded[:, group] = kmeans.centroids[nearest[:, 0]]
    return error(other, decoded @ chosen.T + mean), kept


def report(data: dict) -> str:
    lines = ["# How much of the distance from the bound is codebook estimation", "",
             f"Command: `{data['command']}`", "",
             f"Machine: {data['machine']}; faiss {data['faiss']}; date {data['date']}. One thread.", "",
             "KLT then a product quantiser on the first `r` axes; tables fitted on one half of the documents (seeded), error "
             "measured on that half (in-sample) and on the other half (held-out). **data**: tables trained on the rows; "
             f"**gaussian**: tables trained on {GAUSSIAN_ROWS:,} rows of the Gaussian with the KLT's eigenvalues. "
             "dB: error above the Gaussian rate-distortion bound at 8B bits for the corpus's spectrum (negative: below it).",
             "", "| corpus | docs | B | bits | r | bound | data in-sample dB | data held-out dB | gaussian held-out dB | gaussian − data (dB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        lines.append(f"| {row['corpus']} | {row['docs']:,} | {row['budget']} | {row['nbits']} | {row['axes_kept']} | {row['bound']:.4f} | "
                     f"{row['db']['data_in_sample']:+.2f} | {row['db']['data_held_out']:+.2f} | {row['db']['gaussian_held_out']:+.2f} | "
                     f"{row['db']['gaussian_held_out'] - row['db']['data_held_out']:+.2f} |")
    best = {}
    for row in data["rows"]:
        key = (row["corpus"], row["budget"])
        for kind in ("data", "gaussian"):
            value = row["db"][f"{kind}_held_out"]
            if value < best.get((key, kind), (np.inf,))[0]:
                best[(key, kind)] = (value, row["nbits"], row["axes_kept"])
    variable = {(v["corpus"], v["budget"]): v for v in data.get("variable", [])}
    lines += ["", "Best held-out setting per corpus and budget (over bits and r), and 8-bit tables on groups of unequal size "
              "(**variable**: consecutive axes, equal shares of the water-filling rate):", "",
              "| corpus | B | data: dB (bits, r) | gaussian: dB (bits, r) | gaussian − data (dB) | variable: dB (r) | variable − data (dB) |",
              "|---|---|---|---|---|---|---|"]
    for corpus, budget in sorted({(r["corpus"], r["budget"]) for r in data["rows"]}, key=lambda k: (list(CORPORA).index(k[0]), k[1])):
        d, g = best[((corpus, budget), "data")], best[((corpus, budget), "gaussian")]
        v = variable.get((corpus, budget))
        shape = f"{v['db']:+.2f} ({v['axes_kept']}) | {v['db'] - d[0]:+.2f}" if v else "– | –"
        lines.append(f"| {corpus} | {budget} | {d[0]:+.2f} ({d[1]}, {d[2]}) | {g[0]:+.2f} ({g[1]}, {g[2]}) | {g[0] - d[0]:+.2f} | {shape} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 48])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "results/codebook-estimation"))
    parser.add_argument("--report-only", action="store_true", help="rewrite REPORT.md from --out/rows.json")
    args = parser.parse_args()
    faiss.omp_set_num_threads(1)
    out = Path(args.out)
    if args.report_only:
        atomic_write_bytes(out / "REPORT.md", report(json.loads((out / "rows.json").read_text())).encode())
        return
    data = {"command": " ".join(["python benchmarks/codebook_estimation.py", *(
                f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()
                if k != "report_only" and v != parser.get_default(k))]),
            "machine": machine(), "faiss": faiss.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "rows": [], "variable": []}
    for corpus in args.corpora:
        path = CORPORA[corpus]
        if not path.is_file():
            print(f"{corpus}: {path} not found, skipped")
            continue
        docs = np.ascontiguousarray(np.load(path, allow_pickle=False)["document"], dtype=np.float32)
        spectrum = corpus_spectrum(docs)
        fit, other = split(docs, args.seed)
        eigenvalues, axes = fit_klt(fit)
        for budget in args.budgets:
            bound = gaussian_bound(spectrum, 8 * budget)
            variable, kept = variable_error(fit, other, eigenvalues, axes, budget, args.seed)
            data["variable"].append({"corpus": corpus, "budget": budget, "axes_kept": kept, "held_out": variable,
                                     "db": gap_db(variable, bound)})
            print(f"{corpus} B={budget} variable groups on {kept} axes: {gap_db(variable, bound):+.2f} dB held-out", flush=True)
            for nbits in (8, 4):
                groups = 8 * budget // nbits
                for per_group in (2, 4, 6):
                    axes_kept = groups * per_group // (2 if nbits == 4 else 1)
                    if axes_kept > docs.shape[1] or axes_kept % groups:
                        continue
                    row = measure(fit, other, eigenvalues, axes, budget, nbits, axes_kept, args.seed)
                    db = {k: gap_db(v, bound) for k, v in row.items() if not k.endswith("_fit_s")}
                    data["rows"].append({"corpus": corpus, "docs": len(docs), "budget": budget, "nbits": nbits, "axes_kept": axes_kept,
                                         "bound": bound, "errors": row, "db": db})
                    print(f"{corpus} B={budget} {nbits}-bit r={axes_kept}: data {db['data_in_sample']:+.2f} / {db['data_held_out']:+.2f} dB, "
                          f"gaussian {db['gaussian_held_out']:+.2f} dB held-out", flush=True)
        atomic_write_json(out / "rows.json", data)  # after each corpus: an interrupted run keeps what it measured
    atomic_write_json(out / "rows.json", data)
    atomic_write_bytes(out / "REPORT.md", report(data).encode())


if __name__ == "__main__":
    main()
