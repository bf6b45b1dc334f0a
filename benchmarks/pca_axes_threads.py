"""How long PCA's axes take on 1 and 2 threads, and whether they are the same bits. Times ``principal_axes``.

    .venv/bin/python benchmarks/pca_axes_threads.py --rows 300000 --dim 384 --k 128 --threads 1 2 --repeats 3

Gaussian rows with a decaying spectrum (seeded), float32. For each thread count (``embedtune.runtime.set_threads``) the
best of ``--repeats`` fits is printed with a fingerprint of the mean, axes and variances (the first 12 hex digits of
their sha256): equal fingerprints, the same axes. Only :func:`embedtune.compress.pca.principal_axes` is used, so the
same command from an older checkout (``PYTHONPATH=that/src``) measures that checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np

from embedtune.compress.pca import principal_axes
from embedtune.runtime import set_threads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=128)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((args.rows, args.dim)) * np.geomspace(1.0, 0.01, args.dim)).astype(np.float32)
    for threads in args.threads:
        set_threads(threads)
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            mean, components, variances = principal_axes(x, args.k)
            best = min(best, time.perf_counter() - start)
        fingerprint = hashlib.sha256(mean.tobytes() + components.tobytes() + variances.tobytes()).hexdigest()[:12]
        print(f"{args.rows:,} x {args.dim} to {args.k} axes, {threads} thread(s): best of {args.repeats} {best:.3f} s, axes {fingerprint}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
