"""Search speed of ``klt-tcq`` codes against FAISS's ``IndexPQ`` scan at the same bytes, on 1M vectors, one thread.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trellis_speed.py

A scan's time does not depend on what its codes hold, so both indexes hold 1,000,000 random codes
of 32 bytes (encoding a million vectors with the Viterbi encoder takes minutes): the
trellis index trained on the SciFact MiniLM documents, FAISS ``PQ32`` (8-bit) trained on the same.
FAISS's fastest scan at the same bytes, the 4-bit fast-scan ``PQ{2B}x4fs``, lays its codes out in
blocks of its own, so it holds the SciFact documents tiled to the same rows (plus a little noise),
encoded. The three are timed in turns, ``--rounds`` times, on the same batch of SciFact queries;
each ratio is FAISS's seconds over the trellis index's (1: FAISS's speed). ``klt-tcq-sphere`` is the same codes
decoded onto the unit sphere (one more scale per decoded row). A scan decodes every code once per batch of queries,
so ``--single`` queries are also timed one at a time (the latency of a lone query), for the trellis indexes and FAISS
``PQ``; the first lone query, which on the sphere also makes the norm tables the index keeps, is timed apart. ``--encode`` rows (the SciFact documents, tiled) are encoded by each trellis code (10- and 12-bit registers) and by
FAISS ``PQ``, one thread: the Viterbi encoder's vectors per second; then ``klt-tcq`` on ``--encode-threads`` threads. Writes ``benchmarks/results/trellis/speed.json``.
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
from embedtune.index.codecs.trellis import KltTCQ, KltTCQ12  # noqa: E402
from embedtune.io import atomic_write_json  # noqa: E402
from embedtune.runtime import set_threads  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import faiss

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--bytes", type=int, default=32)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--single", type=int, default=5, help="queries timed one at a time (the latency of a lone query)")
    parser.add_argument("--encode", type=int, default=20_000, help="rows encoded to time each encoder (0: none)")
    parser.add_argument("--encode-threads", type=int, default=2,
                        help="then klt-tcq's encoder again on this many threads (its blocks split over them; 1: not run)")
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(1)
    data = np.load(HERE.parent / "src/embedtune/datasets/scifact-minilm-vectors.npz", allow_pickle=False)
    docs = np.ascontiguousarray(data["document"], dtype=np.float32)
    queries = np.ascontiguousarray(data["query"][: args.queries], dtype=np.float32)
    codes = np.random.default_rng(0).integers(0, 256, size=(args.rows, args.bytes), dtype=np.uint8)
    trellis = KltTCQ(args.bytes).train(docs)
    trellis.codes = codes
    sphere = trellis.clone_empty().on_sphere(1.0)
    sphere.codes = codes
    pq = faiss.IndexPQ(docs.shape[1], args.bytes, 8, faiss.METRIC_INNER_PRODUCT)
    pq.train(docs)
    pq.sa_decode(codes[:1])  # the tables are trained
    pq.codes.resize(codes.size)
    faiss.copy_array_to_vector(codes.ravel(), pq.codes)
    pq.ntotal = args.rows
    fast = faiss.IndexPQFastScan(docs.shape[1], 2 * args.bytes, 4, faiss.METRIC_INNER_PRODUCT)
    fast.train(docs)
    noise = np.random.default_rng(1)
    for start in range(0, args.rows, 65_536):
        rows = np.arange(start, min(args.rows, start + 65_536)) % len(docs)
        fast.add(docs[rows] + 0.02 * noise.standard_normal((len(rows), docs.shape[1]), dtype=np.float32))
    timings: dict[str, list[float]] = {"klt-tcq": [], "klt-tcq-sphere": [], "faiss IndexPQ": [], "faiss IndexPQFastScan": []}
    for _ in range(args.rounds):
        for name, index in (("klt-tcq", trellis), ("klt-tcq-sphere", sphere), ("faiss IndexPQ", pq), ("faiss IndexPQFastScan", fast)):
            start = time.perf_counter()
            index.search(queries, 10)
            timings[name].append(time.perf_counter() - start)
    # A lone query's first search on the sphere also makes the norm tables it keeps: timed apart.
    first_query_s: dict[str, float] = {}
    for name, index in (("klt-tcq", trellis), ("klt-tcq-sphere", sphere)):
        start = time.perf_counter()
        index.search(queries[-1:], 10)
        first_query_s[name] = time.perf_counter() - start
    single: dict[str, list[float]] = {"klt-tcq": [], "klt-tcq-sphere": [], "faiss IndexPQ": []}
    lone = (("klt-tcq", trellis), ("klt-tcq-sphere", sphere), ("faiss IndexPQ", pq))
    for row in range(args.single):
        for name, index in lone:
            start = time.perf_counter()
            index.search(queries[row : row + 1], 10)
            single[name].append(time.perf_counter() - start)
    encode_s: dict[str, float] = {}
    if args.encode:
        rows = docs[np.arange(args.encode) % len(docs)]
        for name, encoder in ((f"klt-tcq:{args.bytes}", trellis), (f"klt-tcq12:{args.bytes}", KltTCQ12(args.bytes).train(docs)),
                              (f"faiss PQ{args.bytes}", pq)):
            start = time.perf_counter()
            encoder.sa_encode(rows)
            encode_s[name] = time.perf_counter() - start
        if args.encode_threads > 1:  # last: set_threads also gives FAISS, torch and BLAS these threads
            set_threads(args.encode_threads)
            start = time.perf_counter()
            threaded = trellis.sa_encode(rows)
            encode_s[f"klt-tcq:{args.bytes} on {args.encode_threads} threads"] = time.perf_counter() - start
            set_threads(1)
            if not np.array_equal(threaded[:2_000], trellis.sa_encode(rows[:2_000])):
                raise SystemExit("the encoder gave other codes on several threads")
    tcq_s, pq_s = float(np.median(timings["klt-tcq"])), float(np.median(timings["faiss IndexPQ"]))
    sphere_s = float(np.median(timings["klt-tcq-sphere"]))
    fast_s = float(np.median(timings["faiss IndexPQFastScan"]))
    record = {"rows": args.rows, "bytes": args.bytes, "queries": args.queries, "rounds": args.rounds, "timings_s": timings,
              "klt_tcq_queries_per_s": args.queries / tcq_s, "faiss_pq_queries_per_s": args.queries / pq_s,
              "ratio_faiss_s_over_tcq_s": pq_s / tcq_s, "faiss_fast_scan_queries_per_s": args.queries / fast_s,
              "ratio_fast_scan_s_over_tcq_s": fast_s / tcq_s, "klt_tcq_sphere_queries_per_s": args.queries / sphere_s,
              "ratio_faiss_s_over_tcq_sphere_s": pq_s / sphere_s, "ratio_fast_scan_s_over_tcq_sphere_s": fast_s / sphere_s,
              "single_query_s": single, "first_single_query_s": first_query_s, "encode_rows": args.encode, "encode_s": encode_s,
              "encode_vectors_per_s": {name: args.encode / seconds for name, seconds in encode_s.items()}, "single_query_median_s": {name: float(np.median(v)) for name, v in single.items() if v},
              "machine": machine_info(),
              "command": "python benchmarks/trellis_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (HERE / "results" / "trellis").mkdir(parents=True, exist_ok=True)
    atomic_write_json(HERE / "results" / "trellis" / "speed.json", record)
    print(f"klt-tcq:{args.bytes} {args.queries / tcq_s:.1f} q/s, FAISS PQ{args.bytes} {args.queries / pq_s:.1f} q/s at "
          f"{args.rows:,} rows: ratio {pq_s / tcq_s:.2f}; FAISS PQ{2 * args.bytes}x4fs {args.queries / fast_s:.1f} q/s: "
          f"ratio {fast_s / tcq_s:.2f}; klt-tcq-sphere:{args.bytes} {args.queries / sphere_s:.1f} q/s (ratio to PQ "
          f"{pq_s / sphere_s:.2f})")
    if encode_s:
        print(f"encoding {args.encode:,} rows, one thread: " + ", ".join(f"{name} {args.encode / v:,.0f} vectors/s"
                                                                        for name, v in encode_s.items()))
    if args.single:
        print("one query at a time: " + ", ".join(f"{name} {np.median(v):.4f} s" for name, v in single.items()))
        print("the first lone query (the sphere's makes its norm tables): "
              + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in first_query_s.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
