"""What FAISS's OPQ rotation costs on wide vectors, by its iterations: train time and held-out MSE of ``OPQm,PQm``.

    .venv/bin/python benchmarks/opq_iterations.py --dim 1536 --rows 10000 --budget 32 --iterations 10 50 --out R.json

The rows (seeded) are clustered Gaussians on a decaying spectrum around a mean direction, unit length, like an API
model's embeddings; ``--vectors`` takes an ``.npy`` instead. The first 90 % train ``OPQ{budget},PQ{budget}`` (inner
product, polysemous training off, as a plan's peer) with the rotation's ``niter`` set to each ``--iterations``, on one
thread; the other 10 % are encoded and decoded for the MSE. ``PQ{budget}`` without a rotation is the reference. Prints
one line per setting and, with ``--out``, writes them as JSON with the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from embedtune.bench.efficiency import machine_info
from embedtune.index.codecs.faiss_codes import without_polysemous_training
from embedtune.runtime import native_chatter_filtered, set_threads


def clustered_rows(rows: int, dim: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
    spectrum = np.geomspace(1.0, 0.02, dim)
    centres = rng.standard_normal((50, dim)) * spectrum
    x = centres[rng.integers(0, 50, rows)] + 0.5 * rng.standard_normal((rows, dim)) * spectrum
    x = x @ basis.T + 0.8 * basis[:, 0]
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    import faiss

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=1536)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--iterations", nargs="+", type=int, default=[10, 50])
    parser.add_argument("--vectors", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    set_threads(1)
    x = np.ascontiguousarray(np.load(args.vectors), dtype=np.float32) if args.vectors else clustered_rows(args.rows, args.dim)
    split = int(0.9 * len(x))
    fit, held = x[:split], x[split:]
    results = []

    def measure(factory: str, niter: int | None) -> None:
        index = without_polysemous_training(faiss.index_factory(x.shape[1], factory, faiss.METRIC_INNER_PRODUCT))
        if niter is not None:
            faiss.downcast_VectorTransform(index.chain.at(0)).niter = niter
        start = time.perf_counter()
        with native_chatter_filtered():
            index.train(fit)
        train_s = time.perf_counter() - start
        mse = float(((held - index.sa_decode(index.sa_encode(held))) ** 2).sum(axis=1).mean())
        results.append({"factory": factory, "opq_iterations": niter, "train_s": round(train_s, 1), "held_out_mse": round(mse, 5)})
        print(f"{factory:18s} OPQ iterations {niter if niter is not None else '-':>3}: train {train_s:7.1f} s, held-out MSE {mse:.5f}", flush=True)

    measure(f"PQ{args.budget}", None)
    for niter in args.iterations:
        measure(f"OPQ{args.budget},PQ{args.budget}", niter)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "machine": machine_info(), "rows": len(x), "dim": x.shape[1],
                                        "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
