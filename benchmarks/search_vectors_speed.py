"""Flat-index search speed: embedtune's exact search against FAISS's ``IndexFlatIP.search``, side by side.

Random unit vectors (``--rows`` x ``--dim``, seed 0) go into an ``index build`` flat index; the same
queries are then searched, interleaved, ``--repeats`` times each, on ``--threads`` threads:

- ``embedtune``: ``Index.search`` (what ``search --query-vectors`` runs): FAISS's scan for the
  candidates, then the canonical rescoring and tie order;
- ``faiss``: ``index.faiss_index.search`` on the same loaded index;
- ``tuned (before)``: ``exact_search(kernel="auto")``, what a flat index ran before (the kernels
  timed on first use of each shape, that timing included in its first call).

Prints the median seconds and the ratio to FAISS, and checks that the hits agree.

    python benchmarks/search_vectors_speed.py --rows 200000 --dim 384 --queries 1000 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from embedtune.evaluate.search import exact_search
from embedtune.index import build_index
from embedtune.index.store import load_index
from embedtune.runtime import set_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, nargs="+", default=[1000, 10])
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    set_threads(args.threads)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        docs = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
        docs /= np.linalg.norm(docs, axis=1, keepdims=True)
        np.save(Path(tmp) / "docs.npy", docs)
        ids = [f"d{i}" for i in range(args.rows)]
        del docs
        build_index(Path(tmp) / "docs.npy", Path(tmp) / "index", ids=ids)
        index = load_index(Path(tmp) / "index")
        import faiss

        xb = faiss.rev_swig_ptr(index.faiss_index.get_xb(), index.faiss_index.ntotal * index.dim).reshape(-1, index.dim)
        for nq in args.queries:
            queries = rng.standard_normal((nq, args.dim), dtype=np.float32)
            queries /= np.linalg.norm(queries, axis=1, keepdims=True)
            runs = {
                "embedtune": lambda: index.search(queries, args.top_k),
                "faiss": lambda: index.faiss_index.search(queries, args.top_k),
                "tuned (before)": lambda: exact_search(queries, xb, args.top_k, kernel="auto"),
            }
            seconds: dict[str, list[float]] = {name: [] for name in runs}
            results = {}
            for _ in range(args.repeats):
                for name, run in runs.items():
                    start = time.perf_counter()
                    results[name] = run()
                    seconds[name].append(time.perf_counter() - start)
            same = float(np.mean(results["embedtune"][1] == results["faiss"][1]))
            assert np.array_equal(results["embedtune"][1], results["tuned (before)"][1])
            faiss_median = statistics.median(seconds["faiss"])
            print(f"{args.rows} x {args.dim}, {nq} queries, top {args.top_k}, {args.threads} thread(s):")
            for name, values in seconds.items():
                median = statistics.median(values)
                print(f"  {name:15s} median {median:.3f}s ({median / faiss_median:.2f}x FAISS); runs {' '.join(f'{v:.3f}' for v in values)}")
            print(f"  hits equal to FAISS's (row for row): {same:.4f}; equal to the tuned kernels': 1.0000")


if __name__ == "__main__":
    main()
