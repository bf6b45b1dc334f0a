"""How close does each plan precision's LanceDB recipe come to the planned index? Top-10 agreement on the bundled SciFact vectors.

    .venv/bin/python benchmarks/lancedb_recipes.py --dim 64 --queries 300 --out benchmarks/results/lancedb-recipes.md

Fits PCA (``--dim``) on the bundled MiniLM vectors of SciFact's 5183 documents (nothing is
encoded or downloaded), writes a plan folder per precision (:func:`embedtune.index.plan_format.write_plan`,
with its ``deployment`` recipe), loads the corpus into an embedded LanceDB table by that recipe
(:func:`embedtune.index.lancedb_store.load_plan_into_lancedb`) and searches the first
``--queries`` queries (:func:`~embedtune.index.lancedb_store.search_lancedb`). Reported per
precision: the recipe (vector type, index, rescoring, exact or nearest), the mean top-10 overlap
with the plan's own index (:class:`embedtune.index.codecs.QuantizedIndex`, what the plan scores
and ``index build --plan`` serves) and with the exact float32 top-10, and the load seconds.
Needs ``pip install 'embedtune[lancedb]'``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from importlib.resources import files
from pathlib import Path

import numpy as np

from embedtune.compress import make_compressor
from embedtune.index.codecs import PRECISIONS, Precision, QuantizedIndex
from embedtune.index.deployment import deployment_recipe
from embedtune.index.lancedb_store import lancedb_recipe_of, load_plan_into_lancedb, search_lancedb
from embedtune.index.plan_format import write_plan
from embedtune.io import atomic_write_bytes
from embedtune.runtime import set_threads


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean share of ``b``'s top-k ids that ``a`` finds (per query, then averaged)."""
    return float(np.mean([len(set(x) & set(y)) / len(y) for x, y in zip(a, b)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--precisions", nargs="+", default=[*PRECISIONS, "faiss:PQ16"])
    parser.add_argument("--out", help="write the markdown table here too")
    args = parser.parse_args()
    set_threads(1)
    bundled = np.load(files("embedtune.datasets") / "scifact-minilm-vectors.npz")
    docs = np.ascontiguousarray(bundled["document"], dtype=np.float32)
    queries = np.ascontiguousarray(bundled["query"][: args.queries], dtype=np.float32)
    ids = [str(i) for i in bundled["document_ids"]]
    compressor = make_compressor("pca", dim=args.dim).fit_unsupervised(docs)
    xb, xq = compressor.transform(docs), compressor.transform(queries)
    _, exact = QuantizedIndex.build(xb, "float32").search(xq, 10)
    lines = [f"PCA-{args.dim} of the bundled SciFact MiniLM vectors ({len(docs)} documents), first {len(queries)} queries; "
             "overlap: mean share of the top-10 found.", "",
             "| precision | LanceDB vector | index | rescoring | exact | overlap with the planned index | with exact float32 | load s |",
             "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="lancedb-recipes-") as work:
        for name in args.precisions:
            precision = Precision(name)
            plan = Path(work) / name.replace(":", "_").replace(",", "+")
            write_plan(plan, compressor, precision, docs, {"chosen": {"setting": f"pca-{args.dim}/{name}"},
                                                           "deployment": deployment_recipe(precision, args.dim)})
            recipe = lancedb_recipe_of(plan)
            start = time.perf_counter()
            table = load_plan_into_lancedb(plan, docs, ids, plan / "lancedb")
            load_s = time.perf_counter() - start
            _, found = search_lancedb(table, recipe, xq, 10)
            planned = None if precision.is_faiss else QuantizedIndex.build(xb, precision).search(xq, 10)[1]
            index = recipe["index"]["index_type"] if recipe["index"] else "none (scan)"
            rescore = f"{recipe['rescore']} top {recipe['candidates']}" if recipe.get("rescore") else "-"
            lines.append(f"| {name} | {recipe['vector_type']} | {index} | {rescore} | {'yes' if recipe['exact'] else 'no'} | "
                         f"{'n/a (trained at build)' if planned is None else format(overlap(found, planned), '.3f')} | "
                         f"{overlap(found, exact):.3f} | {load_s:.1f} |")
            print(lines[-1], flush=True)
    if args.out:
        atomic_write_bytes(args.out, ("\n".join(lines) + "\n").encode("utf-8"))


if __name__ == "__main__":
    main()
