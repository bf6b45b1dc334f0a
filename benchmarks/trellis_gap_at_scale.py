"""How far the trellis code is from the rate-distortion bound once the corpus is large, and why small corpora read farther.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trellis_gap_at_scale.py              # every corpus, 32 B, L = 10 and 12
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trellis_gap_at_scale.py --report     # tables from the rows written

The near-limit benchmark codes each half of a corpus with tables fitted on the other half, and
measures the MSE against the Gaussian bound for the coded half's own spectrum. On a corpus of a few
thousand vectors that reading has two costs that are not the codec's:

* **the fit's size**: the KLT, the bits and the scales come from 2,600 vectors or fewer, so the coded
  half's energy is spread over more axes than the fitted ones expect;
* **the bound's own bias**: the eigenvalues of a sample of n vectors in d dims are more spread than
  the source's (large ones larger, small ones smaller) when n is not much larger than d, and a more
  spread spectrum has a lower bound. The coded half's bound is below the source's.

So each corpus is measured three ways, at one budget and each register length ``L``:

1. **cross-fitted** — as the near-limit benchmark does (one seeded split; the bound of the coded half's spectrum);
2. **in-sample** — fitted on every vector and coding them (a plan fits its codec on the corpus it indexes; the bound
   of that corpus's spectrum);
3. **Gaussian at scale** — a Gaussian source with the corpus's mean and covariance: 50,000 draws fit the codec and
   5,000 others are coded, against the bound of the source's (known) spectrum. This is the codec's own distance from
   the bound, without either cost above: what a large corpus of that spectrum would read.

Rows go to ``benchmarks/results/trellis/at-scale.json`` (kept between runs: a cell written is not rerun) and the
tables to ``benchmarks/results/trellis/AT-SCALE.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.index.codecs import corpus_spectrum, distortion_report  # noqa: E402
from embedtune.index.codecs.rate_distortion import gap_db, gaussian_bound  # noqa: E402
from embedtune.index.codecs.trellis import KltTCQ, TrellisTransformIndex  # noqa: E402
from embedtune.io import atomic_write, atomic_write_json  # noqa: E402
from near_limit import VECTORS as NEAR_LIMIT_VECTORS  # noqa: E402

OUT = HERE / "results" / "trellis"
ROWS = OUT / "at-scale.json"
#: (corpus, model) -> the npz of its vectors (``document``): the near-limit benchmark's, those committed.
VECTORS = {pair: path for pair, path in NEAR_LIMIT_VECTORS.items() if path.is_file()}
CONDITIONS = ("cross-fitted", "in-sample", "gaussian-at-scale")
GAUSSIAN_FIT_ROWS = 50_000
GAUSSIAN_CODED_ROWS = 5_000


def gaussian_like(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean, the covariance's eigenvalues (descending) and eigenvectors of ``x``: a Gaussian source with its spectrum."""
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(x64, rowvar=False))
    order = np.argsort(values)[::-1]
    return mean, np.clip(values[order], 0.0, None), vectors[:, order]


def draw(mean: np.ndarray, values: np.ndarray, vectors: np.ndarray, rows: int, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).standard_normal((rows, len(values)))
    return np.ascontiguousarray((noise * np.sqrt(values)) @ vectors.T + mean, dtype=np.float32)


def measure(fit: np.ndarray, coded: np.ndarray, code_bytes: int, state_bits: int, eigenvalues: np.ndarray | None = None) -> dict[str, Any]:
    """Fit ``klt-tcq:code_bytes`` with an ``state_bits``-bit register on ``fit``, code ``coded``, and compare with the bound."""
    family = KltTCQ(code_bytes, state_bits=state_bits)
    start = time.perf_counter()
    index: TrellisTransformIndex = family.train(fit)
    fit_s = time.perf_counter() - start
    start = time.perf_counter()
    codes = index.sa_encode(coded)
    encode_s = time.perf_counter() - start
    report = distortion_report(coded, index.sa_decode(codes), 8 * code_bytes, eigenvalues=eigenvalues)
    return {"mse": report["mse"], "bound_mse": report["bound_mse"], "gap_db": report["gap_db"], "fit_s": fit_s,
            "encode_ms_per_vector": 1000 * encode_s / len(coded), "n_fit": len(fit), "n_coded": len(coded)}


def read_rows() -> dict[str, Any]:
    """The rows written so far (none before the first run)."""
    return json.loads(ROWS.read_text(encoding="utf-8")) if ROWS.is_file() else {}


def cell_key(data: str, model: str, code_bytes: int, state_bits: int, condition: str) -> str:
    return f"{data}-{model}/klt-tcq:{code_bytes}/L{state_bits}/{condition}"


def run(corpora: list[tuple[str, str]], code_bytes: int, state_bits: list[int], rows: dict[str, Any]) -> None:
    for data, model in corpora:
        x = np.ascontiguousarray(np.load(VECTORS[(data, model)], allow_pickle=False)["document"], dtype=np.float32)
        order = np.random.default_rng(0).permutation(len(x))
        fit_half, coded_half = x[np.sort(order[: len(x) // 2])], x[np.sort(order[len(x) // 2 :])]
        mean, values, vectors = gaussian_like(x)
        source_fit = draw(mean, values, vectors, GAUSSIAN_FIT_ROWS, seed=1)
        source_coded = draw(mean, values, vectors, GAUSSIAN_CODED_ROWS, seed=2)
        for bits in state_bits:
            for condition in CONDITIONS:
                key = cell_key(data, model, code_bytes, bits, condition)
                if key in rows:
                    continue
                if condition == "cross-fitted":
                    row = measure(fit_half, coded_half, code_bytes, bits)
                elif condition == "in-sample":
                    row = measure(x, x, code_bytes, bits, eigenvalues=corpus_spectrum(x))
                else:
                    row = measure(source_fit, source_coded, code_bytes, bits, eigenvalues=values)
                    # The coded draws' own sample spectrum, for comparison with how the corpora are read.
                    sample_bound = gaussian_bound(corpus_spectrum(source_coded), 8 * code_bytes)
                    row["gap_db_sample_bound"] = gap_db(row["mse"], sample_bound)
                row.update(data=data, model=model, dim=int(x.shape[1]), n_corpus=len(x), bytes=code_bytes, state_bits=bits,
                           condition=condition, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=machine_info().get("cpu"))
                rows[key] = row
                # Another run (another budget) may have written rows since this one read the file: keep them.
                atomic_write_json(ROWS, {**read_rows(), **rows})
                print(f"{key}: {row['gap_db']:.3f} dB ({row['encode_ms_per_vector']:.2f} ms a vector)", flush=True)


def report(rows: dict[str, Any]) -> str:
    budgets = sorted({r["bytes"] for r in rows.values()})
    order = list(VECTORS)
    corpora = sorted(dict.fromkeys((r["data"], r["model"], r["n_corpus"], r["dim"]) for r in rows.values()),
                     key=lambda c: order.index((c[0], c[1])) if (c[0], c[1]) in order else len(order))
    lines = ["# The trellis code's distance from the bound, and how the corpus's size reads it", "",
             "`klt-tcq:B` measured three ways (see `benchmarks/trellis_gap_at_scale.py`): **cross-fitted** (one half fits, the "
             "other is coded, against the bound of the coded half's spectrum, as the near-limit benchmark reads it); "
             "**in-sample** (fitted on every vector of the corpus and coding them, as a plan's index is); **Gaussian at "
             f"scale** (a Gaussian source with the corpus's mean and covariance, {GAUSSIAN_FIT_ROWS:,} draws fit, "
             f"{GAUSSIAN_CODED_ROWS:,} others coded, against the bound of the source's known spectrum: the codec's own "
             "distance, which a large corpus of that spectrum would read). In brackets under Gaussian: the same MSE "
             "against the bound of the coded draws' sample spectrum.", ""]
    for budget in budgets:
        registers = sorted({r["state_bits"] for r in rows.values() if r["bytes"] == budget})
        header = "| corpus (vectors, dims) | " + " | ".join(f"L = {L}: cross-fitted | in-sample | Gaussian at scale" for L in registers) + " |"
        lines += [f"## {budget} B", "", header, "|---|" + "---|---|---|" * len(registers)]
        for data, model, n, dim in corpora:
            cells = []
            for L in registers:
                for condition in CONDITIONS:
                    row = rows.get(cell_key(data, model, budget, L, condition))
                    if row is None:
                        cells.append("–")
                    elif condition == "gaussian-at-scale":
                        cells.append(f"{row['gap_db']:.2f} ({row['gap_db_sample_bound']:.2f})")
                    else:
                        cells.append(f"{row['gap_db']:.2f}")
            lines.append(f"| {data} {model} ({n:,}, {dim}) | " + " | ".join(cells) + " |")
        lines.append("")
        ms = {L: [r["encode_ms_per_vector"] for r in rows.values() if r["state_bits"] == L and r["bytes"] == budget and r["dim"] == 384]
              for L in registers}
        lines.append("Encoding, 384-d vectors, one thread (numpy Viterbi): "
                     + "; ".join(f"L = {L} {np.median(v):.2f} ms a vector" for L, v in ms.items() if v) + ".")
        lines.append("")
    dates = sorted(r["date"] for r in rows.values())
    machines = sorted({str(r["machine"]) for r in rows.values()})
    lines += [f"Machine: {', '.join(machines)}, one thread; rows written {dates[0]} to {dates[-1]}. Command: "
              "`python benchmarks/trellis_gap_at_scale.py` (then `--report`)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", default=[f"{d}-{m}" for d, m in VECTORS],
                        help=f"corpus-model pairs (default: all of {', '.join(f'{d}-{m}' for d, m in VECTORS)})")
    parser.add_argument("--bytes", type=int, default=32)
    parser.add_argument("--state-bits", type=int, nargs="+", default=[10, 12])
    parser.add_argument("--report", action="store_true", help="only write AT-SCALE.md from the rows written")
    args = parser.parse_args(argv)
    rows = read_rows()
    if not args.report:
        corpora = []
        for name in args.data:
            pair = tuple(name.rsplit("-", 1))
            if pair not in VECTORS:
                parser.error(f"--data {name}: no vectors; choose from {', '.join(f'{d}-{m}' for d, m in VECTORS)}")
            corpora.append(pair)
        OUT.mkdir(parents=True, exist_ok=True)
        run(corpora, args.bytes, args.state_bits, rows)
        rows = read_rows()
    if not rows:
        parser.error(f"no rows in {ROWS}: run without --report first")
    atomic_write(OUT / "AT-SCALE.md", lambda tmp: tmp.write_text(report(rows), encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
