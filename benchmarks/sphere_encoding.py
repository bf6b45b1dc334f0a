"""Encoding for the sphere: does choosing each document's code by its decoded *direction* beat the nearest code?

The ``-sphere`` families (:mod:`embedtune.index.codecs.sphere`) rank a code by ``q · x̂ / ‖x̂‖``: the decoded
vector's length is thrown away, so only the angle between a document and its decoded vector matters. Their
encoders still choose the code nearest the document (least squared error, or klt-apq's anisotropic loss), which
also spends effort on the length. Two ways to spend it on the angle instead, measured here:

* **gain search** (``--gains``): encode ``c · x`` for several gains ``c`` and keep, per document, the code whose
  decoded vector has the largest cosine with ``x`` (shape-gain coding's search, with the gain not stored). At
  ``c = 1`` alone it is the family's own encoder. Same bytes, same tables, same scan.
* **other codes ranked by direction**: any precision that decodes, ranked as the ``-sphere`` families rank, e.g.
  ``klt-rq:B`` (FAISS's 8-bit residual quantiser on the KLT axes, 0.2-0.7 dB from the Gaussian bound at 16 B in the
  near-limit benchmark, where ``klt-pq4`` is 1.3-1.5) or ``faiss:OPQ64,PQ64x4fs`` (a learned rotation in front of
  4-bit PQ, where ``klt-pq4`` puts the KLT and eigenvalue allocation) or ``faiss:LSQ32x4fs`` (4-bit additive
  codebooks FAISS fast-scans). Give them in ``--codecs``; ``--gains 1`` ranks without the search. The report sets
  each against ``klt-pq4-sphere`` and ``klt-tcq-sphere`` at the same bytes.
* **row alone** (``--row-alone``): whether a codec gives a row the code it gets alone (an index built block by block
  holds the codes a plan scored only then), and how fast it encodes.

Protocol (as ``benchmarks/near_limit.py``): the corpus is cut in two seeded halves and each half is encoded by
tables fitted on the other; every document's decoded vector is scaled to norm 1, and each query ranks every
document by its inner product with those (the served ``-sphere`` search re-ranks the codes' own top 100, which gave
the same nDCG@10 in the near-limit benchmark). Scored: nDCG@10 on every judged test query as a share of the
float32 vectors', agreement (recall@10 of the float32 top-10 with held-out documents as queries), the mean angular
error ``1 − cos(x, x̂)`` and its change in dB, and a paired test of the gain search against the family's own codes.
No label chooses anything.

    OMP_NUM_THREADS=1 python benchmarks/sphere_encoding.py --data scifact --codecs klt-pq4-sphere:16 klt-tcq-sphere:32
    python benchmarks/sphere_encoding.py --report            # REPORT.md from the rows

One JSON per (corpus, codec) under ``benchmarks/results/sphere-encoding/<data>-minilm/``; a row that exists is skipped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from near_limit import halves, load  # noqa: E402

from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.compress.base import l2_normalize  # noqa: E402
from embedtune.evaluate.metrics import evaluate_run  # noqa: E402
from embedtune.evaluate.search import run_from_topk  # noqa: E402
from embedtune.evaluate.streamed_top_k import exact_top_k  # noqa: E402
from embedtune.index.codecs import Precision, QuantizedIndex, distortion_report  # noqa: E402
from embedtune.io import atomic_write_bytes, atomic_write_json  # noqa: E402
from embedtune.runtime import set_threads  # noqa: E402
from embedtune.workflows.significance import paired_test  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "sphere-encoding"
#: Gains tried by the search: ±25 % around the document, ten steps (1 among them).
GAINS = tuple(float(g) for g in np.round(np.linspace(0.8, 1.25, 10), 3))


def row_file(name: str) -> str:
    """A precision's row file name: ``klt-pq4-sphere_16.json``, ``faiss_OPQ64_PQ64x4fs.json``."""
    return f"{name.replace(':', '_').replace(',', '_')}.json"


def decoded_halves(ds: dict[str, Any], name: str, gains: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """``(own, searched, chosen gains, fit seconds)``: every document decoded by tables fitted on the other half, from
    the family's own code and from the gain search's."""
    docs = ds["docs"]
    own, searched = np.zeros_like(docs), np.zeros_like(docs)
    chosen = np.ones(len(docs))
    fit_s = 0.0
    a, b = halves(len(docs))
    for rows, fit_rows in ((a, b), (b, a)):
        start = time.perf_counter()
        index = QuantizedIndex.build(docs[rows], Precision(name), train=docs[fit_rows])
        fit_s += time.perf_counter() - start
        x = docs[rows]
        own[rows] = index.reconstruct(x)
        best = np.full(len(x), -np.inf)
        for gain in gains:
            decoded = index.reconstruct(np.float32(gain) * x)
            cosine = np.einsum("nd,nd->n", l2_normalize(decoded), x) / np.linalg.norm(x, axis=1)
            better = cosine > best
            best[better], chosen[rows[better]] = cosine[better], gain
            searched[rows[better]] = decoded[better]
    return own, searched, chosen, fit_s


def ranked(ds: dict[str, Any], decoded: np.ndarray) -> dict[str, Any]:
    """nDCG@10 per test query, agreement and the angular error of documents ranked by their decoded direction."""
    unit = l2_normalize(decoded)
    scores = ds["queries"] @ unit.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :100]
    metrics = evaluate_run(ds["qrels"], run_from_topk(ds["query_ids"], np.take_along_axis(scores, top, 1), top, ds["doc_ids"], 100, True),
                           ("ndcg@10",))
    held = ds["held_rows"]
    found = exact_top_k(ds["docs"][held], unit, 10, exclude=held)  # a query document never finds itself
    agreement = float(np.mean([len(set(row) & set(truth)) / 10 for row, truth in zip(found, ds["agreement_truth"])]))
    angle = float(np.mean(1.0 - np.einsum("nd,nd->n", unit, l2_normalize(ds["docs"]))))
    return {"ndcg@10": float(metrics["ndcg@10"]), "per_query": {q: round(v["ndcg@10"], 6) for q, v in metrics.per_query.items()},
            "agreement": agreement, "angular_error": angle}


def run(data: str, codecs: list[str], gains: tuple[float, ...]) -> None:
    ds = load(data, "minilm")
    folder = OUT / f"{data}-minilm"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or None
    float32 = ranked(ds, ds["docs"])["ndcg@10"]
    for name in codecs:
        path = folder / row_file(name)
        if path.is_file():
            continue
        own, searched, chosen, fit_s = decoded_halves(ds, name, gains)
        a, b = ranked(ds, own), ranked(ds, searched)
        bits = 8 * Precision(name).ram_bytes(ds["docs"].shape[1])  # every byte in RAM; nothing is read from disk
        for side, decoded in ((a, own), (b, searched)):  # the decoded vectors' MSE above the Gaussian bound at these bits
            side["gap_db"] = distortion_report(ds["docs"], decoded, bits, eigenvalues=ds["spectrum"])["gap_db"]
        queries = sorted(a["per_query"])
        test = paired_test(np.array([b["per_query"][q] for q in queries]), np.array([a["per_query"][q] for q in queries]))
        values, counts = np.unique(chosen, return_counts=True)
        row = {"data": data, "model": "minilm", "codec": name, "ram_bytes": bits // 8, "gains": list(gains), "float32_ndcg@10": float32,
               "own": a, "gain_search": b, "delta": test.mean_difference, "p": test.p_value,
               "angular_gain_db": 10 * np.log10(a["angular_error"] / b["angular_error"]),
               "chosen_gains": {f"{v:g}": int(c) for v, c in zip(values, counts)}, "fit_s": round(fit_s, 1),
               "n_docs": len(ds["docs"]), "n_queries": len(queries), "vectors": ds["vectors"],
               "command": " ".join(["python", *sys.argv]), "git_commit": commit, "machine": machine_info(),
               "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        atomic_write_json(path, row)
        print(f"{data} {name}: share {a['ndcg@10'] / float32:.1%} -> {b['ndcg@10'] / float32:.1%} (p {test.p_value:.3f}); "
              f"agreement {a['agreement']:.4f} -> {b['agreement']:.4f}; angular error {row['angular_gain_db']:+.2f} dB; {fit_s:.0f} s",
              flush=True)


def report() -> str:
    rows = [json.loads(p.read_text()) for p in sorted(OUT.glob("*/*.json"))]
    if not rows:
        raise SystemExit(f"no rows under {OUT}; run the benchmark first.")
    machines = sorted({r["machine"].get("cpu", "?") for r in rows})
    dates = sorted(r["date"] for r in rows)
    lines = ["# Encoding for the sphere: a gain search, and other codes ranked by direction", "",
             f"Written by `python benchmarks/sphere_encoding.py --report` from the rows beside it (measured {dates[0]} to "
             f"{dates[-1]} on {', '.join(machines)}, one thread); protocol in the script's docstring. all-MiniLM-L6-v2; each "
             "half of the corpus coded by tables fitted on the other; every document ranked by its decoded direction. "
             "Share: nDCG@10 over the float32 vectors' on the same test queries. Δ and p: the gain search against the "
             "family's own codes, paired over the test queries. RAM B: bytes per vector held in RAM (nothing is read from disk per "
             "query). dB to the bound: the decoded vectors' MSE above the Gaussian rate-distortion bound at those bytes for the "
             "corpus's spectrum (the gain search trades squared error for direction, so its dB may rise). Angular error gain: "
             "the drop of the mean angular error 1 − cos(x, x̂), in dB.", "",
             "| corpus | codec | RAM B / vector | share, own codes | share, gain search | Δ (p) | agreement, own → searched | "
             "dB to the bound, own → searched | angular error gain | gain chosen for most documents | fit s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        own = f"| {r['data']} | `{r['codec']}` | {r['ram_bytes']} | {r['own']['ndcg@10'] / r['float32_ndcg@10']:.1%}"
        if len(r["gains"]) == 1:  # ranked by direction, no search (``--gains 1``)
            lines.append(f"{own} | – | – | {r['own']['agreement']:.4f} | {r['own']['gap_db']:.2f} | – | – | {r['fit_s']:.0f} |")
            continue
        top = max(r["chosen_gains"].items(), key=lambda item: item[1])
        lines.append(f"{own} | {r['gain_search']['ndcg@10'] / r['float32_ndcg@10']:.1%} | {r['delta']:+.4f} ({r['p']:.3f}) | "
                     f"{r['own']['agreement']:.4f} → {r['gain_search']['agreement']:.4f} | "
                     f"{r['own']['gap_db']:.2f} → {r['gain_search']['gap_db']:.2f} | {r['angular_gain_db']:+.2f} dB | "
                     f"{top[0]} ({top[1] / r['n_docs']:.0%}) | {r['fit_s']:.0f} |")
    checks = [json.loads(p.read_text()) for p in sorted(OUT.glob("*/row-alone/*.json"))]
    lines += ["", *side_by_side(rows), *row_alone_table(checks), "",
              "Commands: " + "; ".join(sorted({f"`{r['command']}`" for r in rows + checks})) + "."]
    return "\n".join(lines) + "\n"


#: Rows whose codes :func:`row_alone` compares, encoded in one call and one at a time.
ROW_ALONE_ROWS = 400


def row_alone(data: str, name: str) -> None:
    """Fit ``name`` on one half of the corpus; encode :data:`ROW_ALONE_ROWS` rows of the other in one call and one row at a
    time: how many get another code alone, and rows per second each way (one thread)."""
    ds = load(data, "minilm")
    path = OUT / f"{data}-minilm" / "row-alone" / row_file(name)
    a, b = halves(len(ds["docs"]))
    index = QuantizedIndex.build(ds["docs"][b[:10]], Precision(name), train=ds["docs"][b])
    x = np.ascontiguousarray(ds["docs"][a[:ROW_ALONE_ROWS]])
    encode = index.precision.precision_codec.encode
    start = time.perf_counter()
    together = encode(x, trained_index=index.backend)
    together_s = time.perf_counter() - start
    start = time.perf_counter()
    alone = np.concatenate([encode(x[i : i + 1], trained_index=index.backend) for i in range(len(x))])
    alone_s = time.perf_counter() - start
    row = {"data": data, "model": "minilm", "codec": name, "rows": len(x),
           "rows_with_another_code_alone": int((alone != together).any(axis=1).sum()),
           "rows_per_s_in_one_call": round(len(x) / together_s, 1), "rows_per_s_one_at_a_time": round(len(x) / alone_s, 1),
           "command": " ".join(["python", *sys.argv]), "machine": machine_info(),
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    atomic_write_json(path, row)
    print(f"{data} {name}: {row['rows_with_another_code_alone']} of {len(x)} rows coded otherwise alone; "
          f"{row['rows_per_s_in_one_call']:.0f} rows/s in one call, {row['rows_per_s_one_at_a_time']:.0f} one at a time", flush=True)


def row_alone_table(rows: list[dict[str, Any]]) -> list[str]:
    """The ``--row-alone`` rows as a table (nothing where there are none)."""
    if not rows:
        return []
    lines = [f"Whether a code depends on the rows encoded with it (`--row-alone`): tables fitted on one half, {ROW_ALONE_ROWS} "
             "rows of the other encoded in one call and then one at a time, one thread.", "",
             "| corpus | codec | rows coded otherwise alone | rows/s, one call | rows/s, one at a time | measured |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['data']} | `{r['codec']}` | {r['rows_with_another_code_alone']} of {r['rows']} | {r['rows_per_s_in_one_call']:,.0f} | "
              f"{r['rows_per_s_one_at_a_time']:,.0f} | {r['date']}, {r['machine'].get('cpu', '?')} |" for r in rows]
    return ["", *lines]


#: The codes every other one is compared with, at the same bytes: the default FAISS-served family and the trellis code.
REFERENCES = ("klt-pq4-sphere", "klt-tcq-sphere")


def side_by_side(rows: list[dict[str, Any]]) -> list[str]:
    """Every code that is not a reference, ranked by direction with its own codes, against each reference at the same bytes
    on the same corpus: agreement, and nDCG@10 paired over the test queries."""
    by_cell = {(r["data"], r["ram_bytes"], r["codec"].split(":")[0]): r for r in rows}
    lines = ["Each other code against the references at the same bytes, all ranked by direction with their own codes "
             f"({', '.join(f'`{name}`' for name in REFERENCES)}): agreement, and nDCG@10 − the reference's, paired over the "
             "test queries.", "",
             "| corpus | RAM B / vector | codec | agreement | share | dB to the bound | "
             + " | ".join(f"`{name}`: agreement, share | Δ − `{name}` (p)" for name in REFERENCES) + " |",
             "|---|---|---|---|---|---|" + "---|---|" * len(REFERENCES)]
    for r in rows:
        if r["codec"].split(":")[0] in REFERENCES:
            continue
        cells = []
        for name in REFERENCES:
            ref = by_cell.get((r["data"], r["ram_bytes"], name))
            if ref is None:
                cells.append("– | –")
                continue
            queries = sorted(set(r["own"]["per_query"]) & set(ref["own"]["per_query"]))
            test = paired_test(np.array([r["own"]["per_query"][q] for q in queries]),
                               np.array([ref["own"]["per_query"][q] for q in queries]))
            cells.append(f"{ref['own']['agreement']:.4f}, {ref['own']['ndcg@10'] / ref['float32_ndcg@10']:.1%} | "
                         f"{test.mean_difference:+.4f} ({test.p_value:.3f})")
        lines.append(f"| {r['data']} | {r['ram_bytes']} | `{r['codec']}` | {r['own']['agreement']:.4f} | "
                     f"{r['own']['ndcg@10'] / r['float32_ndcg@10']:.1%} | {r['own']['gap_db']:.2f} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=("scifact", "arguana", "npl", "cacm", "med"))
    parser.add_argument("--codecs", nargs="+", default=["klt-pq4-sphere:16", "klt-pq4-sphere:32", "klt-apq-sphere:16",
                                                        "klt-apq-sphere:32", "klt-tcq-sphere:16", "klt-tcq-sphere:32"])
    parser.add_argument("--gains", nargs="+", type=float, default=list(GAINS))
    parser.add_argument("--report", action="store_true", help="write REPORT.md from the rows and stop")
    parser.add_argument("--row-alone", action="store_true",
                        help="instead: whether each codec gives a row the code it gets alone, and its encoding speed")
    args = parser.parse_args(argv)
    if args.report:
        atomic_write_bytes(OUT / "REPORT.md", report().encode("utf-8"))
        print(OUT / "REPORT.md")
        return 0
    if args.data is None:
        parser.error("--data is required unless --report")
    set_threads(1)
    if args.row_alone:
        for name in args.codecs:
            row_alone(args.data, name)
        return 0
    run(args.data, args.codecs, tuple(args.gains))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
