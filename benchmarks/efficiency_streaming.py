"""Streaming apply of a 1M x 768 float32 .npy: vectors/s against a bare numpy matmul, and peak RSS.

    python benchmarks/efficiency_streaming.py --n 1000000 --d 768 --k 128 --work /tmp/etstream \
        --out benchmarks/results/efficiency/streaming.json

Writes a synthetic input (n x d float32, ~3 GB for 1M x 768) block by block, fits PCA to k dims on
its first 100k rows, then runs ``apply_compressor_streaming`` in a fresh subprocess (its peak
RSS is VmHWM) and, in this process, a bare ``block @ W`` over the same blocks.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from embedtune.bench.efficiency import machine_info, streaming_benchmark
from embedtune.compress import TrainingData, make_compressor
from embedtune.io import atomic_write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=768)
    parser.add_argument("--k", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=65536)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    parser.add_argument("--repeats", type=int, default=1, help="alternating rounds of bare matmul and apply (medians reported)")
    parser.add_argument("--work", default="/tmp/etstream")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source = work / f"in-{args.n}x{args.d}-{args.dtype}.npy"
    if not source.is_file():
        rng = np.random.default_rng(2027)
        X = np.lib.format.open_memmap(source, mode="w+", dtype=args.dtype, shape=(args.n, args.d))
        for start in range(0, args.n, 65536):
            X[start : start + 65536] = rng.standard_normal((min(65536, args.n - start), args.d), dtype=np.float32)
        X.flush()
        del X
    sample = np.asarray(np.load(source, mmap_mode="r")[:100_000], dtype=np.float32)
    ids = [str(i) for i in range(len(sample))]
    make_compressor("pca", dim=args.k).fit(TrainingData(ids[:1], sample[:1], ids, sample, {})).save(work / "pca")
    del sample
    row = streaming_benchmark(str(work / "pca"), str(source), str(work / "out.npy"), args.chunk_size, args.repeats)
    result = {"machine": machine_info(), "dtype": args.dtype, **row}
    if args.out:
        atomic_write_json(args.out, result)
    print(json.dumps(result, indent=2))
    (work / "out.npy").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
