"""How the trellis code's register length, and refitting its tables, move it towards the rate-distortion bound.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trellis_state_bits.py            # SciFact MiniLM, 32 B

One half of the corpus (seeded) fits ``klt-tcq:B`` with an ``L``-bit register; the other half is
coded and its MSE compared with the Gaussian bound for the whole corpus's spectrum. Then, for the
default register, the tables are refitted by Lloyd iterations on the fit half (each entry moved to
the mean of the values coded with it, shrunk towards the fixed Gaussian value by ``--prior`` rows),
and the other half coded again. Writes ``benchmarks/results/trellis/rows.json`` and ``REPORT.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.index.codecs import corpus_spectrum, distortion_report  # noqa: E402
from embedtune.index.codecs.trellis import STATE_BITS, KltTCQ, TrellisTransformIndex, viterbi_states  # noqa: E402
from embedtune.io import atomic_write, atomic_write_json  # noqa: E402
from near_limit import VECTORS  # noqa: E402

OUT = HERE / "results" / "trellis"


def vectors(data: str) -> np.ndarray:
    return np.ascontiguousarray(np.load(VECTORS[(data, "minilm")], allow_pickle=False)["document"], dtype=np.float32)


def lloyd(index: TrellisTransformIndex, fit: np.ndarray, prior: float) -> TrellisTransformIndex:
    """One Lloyd pass over the tables: each entry the shrunk mean of the (scaled) values the fit rows code with it."""
    rotated = ((fit - index.mean) @ index.axes).astype(np.float32)
    states = viterbi_states(rotated, index.scale, index.bits, index.codebook, index.state_bits)
    r, size = len(index.bits), 1 << index.state_bits
    flat = (states + (np.arange(r) << index.state_bits)[None, :]).ravel()
    target = (rotated / np.where(index.scale == 0, 1, index.scale)[None, :]).ravel()
    sums = np.bincount(flat, target, r * size).reshape(r, size)
    counts = np.bincount(flat, None, r * size).reshape(r, size)
    table = (sums + prior * index.codebook) / (counts + prior)
    return TrellisTransformIndex(index.mean, index.axes, index.bits, index.scale, table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="scifact")
    parser.add_argument("--bytes", type=int, default=32)
    parser.add_argument("--state-bits", type=int, nargs="+", default=[8, 10, 11, 12])
    parser.add_argument("--lloyd-passes", type=int, default=2)
    parser.add_argument("--prior", type=float, default=2.0)
    args = parser.parse_args(argv)
    x = vectors(args.data)
    order = np.random.default_rng(0).permutation(len(x))
    fit, coded = x[np.sort(order[: len(x) // 2])], x[np.sort(order[len(x) // 2 :])]
    spectrum = corpus_spectrum(x)
    bits = 8 * args.bytes

    def gap(index: TrellisTransformIndex) -> tuple[float, float]:
        start = time.perf_counter()
        codes = index.sa_encode(coded)
        per_row = (time.perf_counter() - start) / len(coded)
        return distortion_report(coded, index.sa_decode(codes), bits, eigenvalues=spectrum)["gap_db"], per_row

    rows = []
    for state_bits in args.state_bits:
        family = KltTCQ(args.bytes, state_bits=state_bits)
        start = time.perf_counter()
        index = family.train(fit)
        fit_s = time.perf_counter() - start
        gap_db, per_row = gap(index)
        rows.append({"setting": f"klt-tcq:{args.bytes}, L = {state_bits}", "state_bits": state_bits, "gap_db": gap_db,
                     "encode_ms_per_vector": 1000 * per_row, "fit_s": fit_s})
        print(f"L = {state_bits:2d}: {gap_db:.3f} dB above the bound, {1000 * per_row:.2f} ms a vector to encode", flush=True)
        if state_bits == STATE_BITS:
            refitted = index
            for step in range(1, args.lloyd_passes + 1):
                refitted = lloyd(refitted, fit, args.prior)
                gap_db, _ = gap(refitted)
                rows.append({"setting": f"klt-tcq:{args.bytes}, L = {state_bits}, {step} Lloyd pass(es), prior {args.prior:g}",
                             "state_bits": state_bits, "lloyd_passes": step, "gap_db": gap_db})
                print(f"L = {state_bits:2d}, {step} Lloyd pass(es): {gap_db:.3f} dB", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/trellis_state_bits.py " + " ".join(argv if argv is not None else sys.argv[1:])
    record = {"data": args.data, "bytes": args.bytes, "n_fit": len(fit), "n_coded": len(coded), "command": command.strip(),
              "machine": machine_info(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    atomic_write_json(OUT / "rows.json", record)
    lines = [f"# The trellis code's register, and refitting its tables ({args.data} MiniLM, {args.bytes} B)", "",
             f"{len(fit):,} documents fit `klt-tcq:{args.bytes}`, the other {len(coded):,} are coded; dB is their MSE above the "
             "Gaussian bound for the corpus's spectrum. Encoding time is numpy's Viterbi on one thread.", "",
             "| setting | dB above the bound | encode ms / vector |", "|---|---|---|"]
    for row in rows:
        ms = f"{row['encode_ms_per_vector']:.2f}" if "encode_ms_per_vector" in row else "–"
        lines.append(f"| {row['setting']} | {row['gap_db']:.3f} | {ms} |")
    lines += ["", f"Command: `{record['command']}`; machine: {record['machine'].get('cpu')}, {record['date']}."]
    atomic_write(OUT / "REPORT.md", lambda tmp: tmp.write_text("\n".join(lines) + "\n", encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
