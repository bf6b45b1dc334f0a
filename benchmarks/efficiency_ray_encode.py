"""Encoding rows/s: single process against a Ray Data actor pool of 1 and 2 encoders.

    nice -n 10 .venv/bin/python benchmarks/efficiency_ray_encode.py --data scifact --model minilm --n 512 --shard-size 128
    .venv/bin/python benchmarks/efficiency_ray_encode.py --n 300 --shard-size 100 --backends torch onnx onnx-int8

With ``--backends`` every runner is measured once per encoding backend (the ONNX graphs are
exported and cached before the first timed run), and the vectors are compared within a backend.

Encodes the first ``--n`` corpus texts into sharded .npy files three times, each into a fresh
folder: in this process, then with ``ray.init(num_cpus=2)`` and 1 and 2 actors. Every encoder
uses ``--threads`` torch threads, so 2 actors use twice the threads of one process. The Ray
figures include starting the actors (loading the model in each), not ``ray.init``. The vectors of
the three runs are compared (max absolute difference).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from embedtune.bench.efficiency import machine_info
from embedtune.data.beir import document_text, load_beir
from embedtune.encoders import SentenceEncoder
from embedtune.encoders.ray_encode import encode_sharded, encode_sharded_ray, read_shards
from embedtune.io import atomic_write_json
from embedtune.runtime import set_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="scifact")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--shard-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backends", nargs="+", default=["torch"], choices=["torch", "onnx", "onnx-int8"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import ray

    set_threads(args.threads)
    corpus = load_beir(args.data).corpus
    ids = list(corpus)[: args.n]
    texts = [document_text(corpus[i]) for i in ids]
    work = Path(tempfile.mkdtemp(prefix="ray-encode-"))
    for backend in args.backends:  # the export is not part of any timed run
        if backend != "torch":
            SentenceEncoder(args.model, backend=backend, show_progress=False).model
    rows = []
    for backend in args.backends:
        start = time.perf_counter()
        encode_sharded(ids, texts, args.model, work / f"local-{backend}", args.shard_size, backend=backend)
        rows.append({"runner": "single process", "encoder_backend": backend, "actors": 0, "seconds": time.perf_counter() - start,
                     "folder": f"local-{backend}"})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for backend in args.backends:
            for actors in (1, 2):
                start = time.perf_counter()
                encode_sharded_ray(ids, texts, args.model, work / f"ray{actors}-{backend}", args.shard_size, actors=actors,
                                   num_cpus=2 / actors - 0.25, threads_per_actor=args.threads, backend=backend)
                rows.append({"runner": f"ray, {actors} actor(s)", "encoder_backend": backend, "actors": actors,
                             "seconds": time.perf_counter() - start, "folder": f"ray{actors}-{backend}"})
    finally:
        ray.shutdown()
    for row in rows:
        reference = read_shards(work / f"local-{row['encoder_backend']}")[1]
        row["rows_per_s"] = args.n / row["seconds"]
        row["max_abs_diff_vs_local"] = float(np.abs(read_shards(work / row.pop("folder"))[1] - reference).max())
    result = {"machine": machine_info(), "data": args.data, "model": args.model, "n": args.n, "shard_size": args.shard_size,
              "threads_per_encoder": args.threads, "rows": rows}
    if args.out:
        atomic_write_json(args.out, result)
    print(json.dumps(result, indent=2))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
