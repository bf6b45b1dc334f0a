"""Does each store, configured by `index deploy`'s bundle, find the plan's top-10? Measured in the real engines, embedded.

    .venv/bin/python benchmarks/deploy_stores.py --dim 64 --queries 300 --out benchmarks/results/deploy-stores.md

Fits PCA (``--dim``) on the bundled MiniLM vectors of SciFact's 5183 documents (nothing is
encoded or downloaded), writes a plan folder and its deploy bundle per precision
(:func:`embedtune.index.deploy_bundle.write_deploy_bundle`), loads the compressed corpus into
embedded Qdrant (``QdrantClient(path=...)``) and Milvus Lite by the bundle's ``qdrant.json`` and
``milvus.json`` (:mod:`embedtune.index.store_roundtrip`), and into LanceDB by ``lancedb.json``
(:mod:`embedtune.index.lancedb_store`), and searches the first ``--queries`` queries. Reported per
precision and store: the mean top-10 overlap with the plan's own FAISS index
(:class:`embedtune.index.codecs.QuantizedIndex`), the share of queries whose top-10 is identical
(same rows, same order), and the load + search seconds. A store that is not installed is skipped.
Embedded Qdrant and Milvus Lite search exactly (they accept the quantization settings but do not
apply them), so a quantised plan's figure there is exact search against the plan's quantised index.
Needs ``pip install 'embedtune[deploy]'``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from importlib.resources import files
from pathlib import Path

import numpy as np

from embedtune.compress import make_compressor
from embedtune.index.codecs import Precision, QuantizedIndex
from embedtune.index.deploy_bundle import write_deploy_bundle
from embedtune.index.deployment import deployment_recipe
from embedtune.index.plan_format import load_plan, write_plan
from embedtune.index.store_roundtrip import search_bundle_store
from embedtune.io import atomic_write_bytes
from embedtune.runtime import set_threads

PRECISIONS = ("float32", "float16", "int8", "binary", "binary-asym", "binary-rescore", "rabitq1-rescore", "faiss:PQ16")


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean share of ``b``'s top-k ids that ``a`` finds (per query, then averaged)."""
    return float(np.mean([len(set(x) & set(y)) / len(y) for x, y in zip(a, b)]))


def _lancedb(plan: Path, bundle: Path, docs: np.ndarray, ids: list[str], xq: np.ndarray, work: Path, k: int) -> np.ndarray:
    from embedtune.index.lancedb_store import load_plan_into_lancedb, search_lancedb

    table = load_plan_into_lancedb(plan, docs, ids, work / "lancedb")
    return search_lancedb(table, json.loads((bundle / "lancedb.json").read_text()), xq, k)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=64, help="PCA dimension of the plans")
    parser.add_argument("--queries", type=int, default=300, help="the first this many SciFact queries")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), help="plan precisions to deploy")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (FAISS, BLAS)")
    parser.add_argument("--out", default=None, help="also write the table here (Markdown)")
    args = parser.parse_args()
    set_threads(args.threads)
    k = 10
    bundled = np.load(files("embedtune.datasets") / "scifact-minilm-vectors.npz")
    docs = np.ascontiguousarray(bundled["document"], dtype=np.float32)
    queries = np.ascontiguousarray(bundled["query"][: args.queries], dtype=np.float32)
    ids = [str(i) for i in bundled["document_ids"]]
    compressor = make_compressor("pca", dim=args.dim).fit_unsupervised(docs)
    x, xq = compressor.transform(docs), compressor.transform(queries)
    stores = {"qdrant": "qdrant_client", "milvus-lite": "milvus_lite", "lancedb": "lancedb"}
    lines = [f"PCA-{args.dim} of SciFact's {len(docs)} bundled MiniLM documents, {len(xq)} queries; top-{k} against the plan's own FAISS index.",
             "", "| precision | store | setting | top-10 overlap | identical top-10 | seconds |", "|---|---|---|---|---|---|"]
    for name in args.precisions:
        precision = Precision(name)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            write_plan(work / "plan", compressor, precision, docs, {"chosen": {"setting": f"pca-{args.dim}/{name}"},
                                                                    "deployment": deployment_recipe(precision, args.dim)})
            deploy = write_deploy_bundle(work / "plan", work / "bundle", include_model=False)
            _, _, planned, calibration = load_plan(work / "plan")
            _, I_plan = QuantizedIndex.build(x, planned, calibration=calibration).search(xq, k)
            for store, module in stores.items():
                if importlib.util.find_spec(module) is None:
                    print(f"{name} {store}: skipped ({module} is not installed)", flush=True)
                    continue
                start = time.perf_counter()
                if store == "lancedb":
                    I = _lancedb(work / "plan", work / "bundle", docs, ids, xq, work, k)
                else:
                    I = search_bundle_store(store, work / "bundle", precision, x, xq, work, k)[1]
                seconds = time.perf_counter() - start
                setting = deploy["stores"]["milvus" if store == "milvus-lite" else store]["setting"]
                row = (f"| {name} | {store} | {setting} | {overlap(I, I_plan):.3f} | {float(np.mean((I == I_plan).all(axis=1))):.3f} "
                       f"| {seconds:.1f} |")
                print(row, flush=True)
                lines.append(row)
    if args.out:
        atomic_write_bytes(args.out, ("\n".join(lines) + "\n").encode())


if __name__ == "__main__":
    main()
