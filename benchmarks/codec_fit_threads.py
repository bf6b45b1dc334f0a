"""Does a codec's fit depend on the thread count, and what does each count cost? Times and fingerprints each fit.

    .venv/bin/python benchmarks/codec_fit_threads.py --codecs klt-pq:32 klt-apq:32 --threads 1 2 --repeats 2

Each codec is fitted on the bundled SciFact MiniLM document vectors (``--vectors`` for others) once per thread count
and repeat, in this process (``embedtune.runtime.set_threads``), and its trained tables are written to a scratch folder
and fingerprinted (the first 12 hex digits of the sha256 of each written file, in name order). Equal fingerprints on
every thread count: the fit does not depend on it. Only the public codec API is used (``Precision(name)``'s codec
family ``train`` and ``write_trained``), so the same command run from an older checkout measures that checkout: the
"before" rows of docs/threads-memory.md come from ``c8a3147``. With ``--encode N``, each fit's tables then encode N
rows (the vectors tiled with a little noise, unit rows) through ``QuantizedIndex.build`` on the same thread count, timed
and fingerprinted too. Prints one line per fit and, with ``--out``, writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.index.codecs import QuantizedIndex  # noqa: E402
from embedtune.index.codecs.precision import Precision  # noqa: E402
from embedtune.runtime import set_threads  # noqa: E402

DEFAULT_VECTORS = HERE.parent / "src/embedtune/datasets/scifact-minilm-vectors.npz"


def fingerprint(directory: Path) -> str:
    return "".join(hashlib.sha256((directory / name).read_bytes()).hexdigest()[:12] for name in sorted(p.name for p in directory.iterdir()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--codecs", nargs="+", default=["klt-pq:32", "klt-apq:32"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--vectors", type=Path, default=DEFAULT_VECTORS, help="an .npz (its first array) or .npy of document vectors")
    parser.add_argument("--encode", type=int, default=0, help="also encode this many rows with each fit's tables (0: none)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    loaded = np.load(args.vectors)
    docs = np.ascontiguousarray(loaded[loaded.files[0]] if hasattr(loaded, "files") else loaded, dtype=np.float32)
    to_encode = None
    if args.encode:
        rng = np.random.default_rng(0)
        tiles = -(-args.encode // len(docs))
        to_encode = np.concatenate([docs + 0.01 * rng.standard_normal(docs.shape).astype(np.float32) for _ in range(tiles)])[: args.encode]
        to_encode /= np.linalg.norm(to_encode, axis=1, keepdims=True)
    rows = []
    for _ in range(args.repeats):
        for name in args.codecs:
            for threads in args.threads:
                set_threads(threads)
                codec = Precision(name).precision_codec
                start = time.perf_counter()
                trained = codec.family_codec.train(docs)
                seconds = time.perf_counter() - start
                with tempfile.TemporaryDirectory() as scratch:
                    codec.write_trained(trained, Path(scratch))
                    tables = fingerprint(Path(scratch))
                row = {"codec": name, "threads": threads, "fit_s": round(seconds, 2), "tables": tables}
                line = f"{name:14s} {threads} thread(s)  fit {seconds:6.2f} s  tables {tables}"
                if to_encode is not None:
                    start = time.perf_counter()
                    index = QuantizedIndex.build(to_encode, Precision(name), trained_index=trained)
                    row["encode_s"] = round(time.perf_counter() - start, 2)
                    row["encoded_rows"] = len(to_encode)
                    row["codes"] = hashlib.sha256(np.ascontiguousarray(index.backend.sa_encode(to_encode[:20_000])).tobytes()).hexdigest()[:12]
                    line += f"  encode {len(to_encode):,} rows {row['encode_s']:6.2f} s  codes {row['codes']}"
                rows.append(row)
                print(line, flush=True)
    for name in args.codecs:
        prints = {row["tables"] for row in rows if row["codec"] == name}
        print(f"{name}: {'the same tables on every thread count' if len(prints) == 1 else 'tables differ between thread counts'}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "machine": machine_info(), "vectors": str(args.vectors), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
