"""``embedtune index build``, ``embedtune search`` and ``embedtune bench index``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from embedtune.bench.efficiency import ANN_COLUMNS, FLAT_COLUMNS, format_table, run_index_benchmark
from embedtune.cli.common import print_json, print_table
from embedtune.compress import load_compressor
from embedtune.data.beir import load_beir
from embedtune.encoders import SentenceEncoder
from embedtune.index import build_index, load_index
from embedtune.io import atomic_write_json


def _int_list(text: str) -> list[int]:
    return [int(value) for value in text.split(",") if value.strip()]


def register(commands: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter

    index = commands.add_parser("index", help="build a retrieval index (FAISS) from embeddings, optionally through an adapter")
    sub = index.add_subparsers(dest="index_command", metavar="ACTION", required=True)
    build = sub.add_parser("build", formatter_class=fmt, help="write index.faiss + ids.txt + manifest.json",
                           description="Streams the embeddings in chunks through the adapter (if any) into the index; "
                           "only the index has to fit in memory.")
    build.add_argument("--embeddings", required=True, help="(n, d) float32/float16 .npy, or .parquet with an id column")
    build.add_argument("--ids", default=None, help="ids of the .npy rows (one per line, or a JSON list)")
    build.add_argument("--adapter", default=None, help="compressor folder (compress train --out) applied before indexing")
    build.add_argument("--out", required=True, help="index folder to write")
    build.add_argument("--kind", default="flat", help="flat (exact), sq8, binary, or a FAISS index_factory string such as 'IVF1024,Flat'")
    build.add_argument("--data", default=None, help="BEIR dataset whose corpus titles to store for search results (e.g. scifact)")
    build.add_argument("--model", default=None, help="encoder the embeddings came from, recorded as the search default")
    build.add_argument("--chunk-size", type=int, default=65536, help="rows per chunk")
    build.add_argument("--id-column", default="id", help="parquet id column")
    build.add_argument("--vector-column", default="embedding", help="parquet vector column")
    build.add_argument("--json", action="store_true", help="print the manifest as JSON")
    build.set_defaults(handler=run_index_build)

    search = commands.add_parser("search", formatter_class=fmt, help="encode a query and print the top hits of an index",
                                 description="Encodes the query with --model, applies --adapter (default: the one the index "
                                 "was built with, if its folder still exists), and searches the index.")
    search.add_argument("query", nargs="+", help="query text (several arguments are several queries)")
    search.add_argument("--index", required=True, help="index folder written by `index build`")
    search.add_argument("--model", default=None, help="encoder (default: the one recorded in the index manifest, else minilm)")
    search.add_argument("--adapter", default=None, help="compressor folder; default: the index's own adapter")
    search.add_argument("--no-adapter", action="store_true", help="search with the raw model vectors")
    search.add_argument("--query-prompt", default="", help="text prepended to the query (instruction models)")
    search.add_argument("--top-k", type=int, default=10, help="hits to print")
    search.add_argument("--rescore", default=None, choices=["float", "asym"], help="binary index: rescore the top 100 candidates")
    search.add_argument("--json", action="store_true", help="print JSON instead of a table")
    search.set_defaults(handler=run_search)

    bench = commands.add_parser("bench", help="efficiency benchmarks")
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    bindex = bsub.add_parser("index", formatter_class=fmt, help="exact flat search at full vs compressed dims (DIVE §4.9)",
                             description="Memory, build time, single-query latency p50/p95 and batched throughput of exact "
                             "inner-product search, FAISS IndexFlatIP beside embedtune's exact_search, with ratios against full d "
                             "measured in the same run. An exact flat index costs the same whatever the vectors contain.")
    bindex.add_argument("--data", default="scifact", help="comma-separated BEIR corpora ('' for none)")
    bindex.add_argument("--model", default="minilm", help="encoder of the corpora")
    bindex.add_argument("--synthetic", default="100000", help="comma-separated synthetic corpus sizes, e.g. 100000,1000000 ('' for none)")
    bindex.add_argument("--synthetic-dim", type=int, default=768, help="full dimension of the synthetic corpora")
    bindex.add_argument("--dims", default="256,128,64", help="compressed dims to compare with full d")
    bindex.add_argument("--k", type=int, default=10, help="neighbours per query")
    bindex.add_argument("--batch", type=int, default=256, help="queries per batched search")
    bindex.add_argument("--rounds", type=int, default=5, help="timing rounds (every dim and engine per round)")
    bindex.add_argument("--singles", type=int, default=20, help="single-query searches per dim, engine and round")
    bindex.add_argument("--engines", default="faiss,embedtune", help="faiss, embedtune, or both")
    bindex.add_argument("--ann", default="", help="';'-separated index_factory strings for approximate indexes, e.g. 'IVF1024,Flat;HNSW32'")
    bindex.add_argument("--out", default=None, help="write the full result as JSON here")
    bindex.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    bindex.set_defaults(handler=run_bench_index)


def run_index_build(args: argparse.Namespace) -> int:
    titles = None
    if args.data:
        titles = {doc_id: doc.get("title", "") for doc_id, doc in load_beir(args.data).corpus.items()}
    out = build_index(args.embeddings, args.out, ids=args.ids, adapter=args.adapter, kind=args.kind, titles=titles, model=args.model,
                      chunk_size=args.chunk_size, id_column=args.id_column, vector_column=args.vector_column)
    manifest = json.loads((Path(out) / "manifest.json").read_text(encoding="utf-8"))
    if args.json:
        print_json(manifest)
    else:
        print_table([manifest], ["kind", "ntotal", "input_dim", "dim", "bytes_per_vector", "index_bytes", "build_seconds"])
        print(f"saved to {out}")
    return 0


def search_texts(index_dir: str | Path, queries: list[str], model: str | None = None, adapter: str | Path | None = None,
                 use_adapter: bool = True, top_k: int = 10, query_prompt: str = "", rescore: str | None = None) -> list[list[dict]]:
    """Encode ``queries`` with ``model`` (+ adapter) and return the hits of the index for each."""
    index = load_index(index_dir)
    model = model or index.manifest.get("model") or "minilm"
    if use_adapter and adapter is None:
        recorded = (index.manifest.get("adapter") or {}).get("path")
        if recorded:
            if not Path(recorded).is_dir():
                raise FileNotFoundError(f"the index was built with the adapter {recorded}, which no longer exists; pass --adapter or --no-adapter.")
            adapter = recorded
    encoder = SentenceEncoder(model, query_prompt=query_prompt, show_progress=False)
    vectors = encoder.encode(queries, kind="query")
    if use_adapter and adapter is not None:
        vectors = load_compressor(adapter).transform(vectors)
    D, I = index.search(vectors, top_k, rescore_with=rescore)
    return index.hits(D, I)


def run_search(args: argparse.Namespace) -> int:
    results = search_texts(args.index, args.query, args.model, args.adapter, not args.no_adapter, args.top_k, args.query_prompt, args.rescore)
    if args.json:
        print_json({"queries": [{"query": q, "hits": hits} for q, hits in zip(args.query, results)]})
        return 0
    for query, hits in zip(args.query, results):
        print(f"query: {query}")
        for hit in hits:
            hit["title"] = (hit.get("title") or "")[:80]
        print_table(hits, ["rank", "score", "id", "title"])
    return 0


def run_bench_index(args: argparse.Namespace) -> int:
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    unknown = set(engines) - {"faiss", "embedtune"}
    if unknown or not engines:
        raise ValueError(f"--engines takes faiss and/or embedtune; got {args.engines!r}.")
    result = run_index_benchmark(
        datasets=[d.strip() for d in args.data.split(",") if d.strip()],
        model=args.model,
        synthetic=_int_list(args.synthetic),
        synthetic_dim=args.synthetic_dim,
        dims=_int_list(args.dims),
        k=args.k,
        batch=args.batch,
        rounds=args.rounds,
        singles=args.singles,
        engines=engines,
        ann=[f.strip() for f in args.ann.split(";") if f.strip()],
    )
    if args.out:
        atomic_write_json(args.out, result)
    if args.json:
        print_json(result)
        return 0
    machine = result["machine"]
    print(f"machine: {machine['cpu']}, {machine['cpus']} CPUs, threads {machine['threads']}, FAISS {machine['faiss']} "
          f"({machine['faiss_simd_level']}), torch {machine['torch']}; {machine['date']}")
    print(result["note"])
    print(format_table(result["flat"], FLAT_COLUMNS))
    print("ratios: against the largest d of the same corpus and engine, measured in this run (higher is better).")
    print(result["paper"])
    if result["ann"]:
        print(format_table(result["ann"], ANN_COLUMNS))
    if args.out:
        print(f"saved to {args.out}")
    return 0
