"""``embedtune index build`` and ``embedtune search``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from embedtune.cli.common import add_data_flags, print_json, print_table
from embedtune.compress import load_compressor
from embedtune.data.beir import load_beir
from embedtune.encoders import SentenceEncoder
from embedtune.index import build_index, load_index
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir


def register(commands: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter

    index = commands.add_parser("index", help="build a retrieval index (FAISS) from embeddings, optionally through an adapter")
    sub = index.add_subparsers(dest="index_command", metavar="ACTION", required=True)
    build = sub.add_parser("build", formatter_class=fmt, help="write index.faiss + ids.txt + manifest.json",
                           description="Streams the embeddings in chunks through the adapter (if any) into the index; "
                           "only the index has to fit in memory.")
    build.add_argument("--embeddings", required=True, help="(n, d) float32/float16 .npy, or .parquet with an id column")
    build.add_argument("--ids", default=None, help="ids of the .npy rows (one per line, or a JSON list)")
    build.add_argument("--adapter", default=None,
                       help="compressor applied before indexing: its folder, or a `compress train --out` folder holding exactly one")
    build.add_argument("--out", required=True, help="index folder to write")
    build.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    build.add_argument("--kind", default="flat", help="flat (exact), sq8, binary, or a FAISS index_factory string such as 'IVF1024,Flat'")
    add_data_flags(build, split=False, default=None, help="BEIR dataset whose corpus titles to store for search results (e.g. scifact)")
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


def run_index_build(args: argparse.Namespace) -> int:
    prepare_output_dir(args.out, args.overwrite, command="index build", inputs=[args.embeddings, args.ids, args.adapter, args.data])
    titles = None
    if args.data:
        titles = {doc_id: doc.get("title", "") for doc_id, doc in load_beir(args.data).corpus.items()}
    out = build_index(args.embeddings, args.out, ids=args.ids, adapter=args.adapter, kind=args.kind, titles=titles, model=args.model,
                      chunk_size=args.chunk_size, id_column=args.id_column, vector_column=args.vector_column)
    finish_output_dir(out, "index build")
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
