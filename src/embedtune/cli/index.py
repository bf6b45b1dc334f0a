"""``embedtune index build``, ``embedtune index deploy`` and ``embedtune search``."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from embedtune.cli.common import add_backend_flag, add_data_flags, add_ray_flags, positive_int, print_json, print_table, ray_pool
from embedtune.data.beir import load_beir_corpus
from embedtune.data.query_files import read_query_file
from embedtune.evaluate.run_files import write_jsonl_run, write_trec_run
from embedtune.index.query import search_texts, search_vectors
from embedtune.index.store import build_index
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir

# The plan's builder and the deployment bundle are imported by the commands that use them: they load every codec,
# which a flat `index build` and `search --query-vectors` never need, and start-up is most of a small job's time.

__all__ = ["register", "run_index_build", "run_index_deploy", "run_search"]

logger = logging.getLogger(__name__)


def register(commands: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter

    index = commands.add_parser("index", help="build a retrieval index (FAISS) from embeddings, optionally through an adapter")
    sub = index.add_subparsers(dest="index_command", metavar="ACTION", required=True)
    build = sub.add_parser("build", formatter_class=fmt, help="write index.faiss + ids.txt + manifest.json",
                           description="Streams the embeddings in chunks through the adapter (if any) into the index; "
                           "only the index has to fit in memory. With --ray-actors N and an adapter (or --plan), N actors of a "
                           "Ray cluster transform ranges of a .npy through it (the same bits as here) and this process adds "
                           "them to the index; on a cluster, --embeddings, the adapter and --out's folder must be on storage "
                           "every node reaches.")
    build.add_argument("--embeddings", required=True, help="(n, d) float32/float16 .npy, or .parquet with an id column")
    build.add_argument("--ids", default=None, help="ids of the .npy rows (one per line, or a JSON list)")
    build.add_argument("--adapter", default=None,
                       help="compressor applied before indexing: its folder, or a `compress train --out` folder holding exactly one")
    build.add_argument("--out", required=True, help="index folder to write")
    build.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    build.add_argument("--kind", default="flat", help="flat (exact), sq8, binary, or a FAISS index_factory string such as 'IVF1024,Flat'")
    build.add_argument("--plan", default=None,
                       help="a `compress plan --out` folder: build exactly what it planned (its compressor, precision and int8 "
                            "calibration); replaces --adapter and --kind")
    add_data_flags(build, split=False, default=None,
                   help="the corpus whose titles to store for search results: a corpus.jsonl, or a BEIR folder or name (e.g. scifact)")
    build.add_argument("--model", default=None, help="encoder the embeddings came from, recorded as the search default "
                       "(default: the one recorded beside the vectors by `embed` or `embed-corpus`; another one is refused)")
    add_backend_flag(build, recorded="the vectors' encoder.json (or embed-corpus run.json)")
    build.add_argument("--chunk-size", type=int, default=65536, help="rows per chunk")
    build.add_argument("--id-column", default="id", help="parquet id column")
    build.add_argument("--vector-column", default="embedding", help="parquet vector column")
    build.add_argument("--json", action="store_true", help="print the manifest as JSON")
    add_ray_flags(build, actor="adapter", threads="transform threads (4096-row tiles side by side)")
    build.set_defaults(handler=run_index_build)

    deploy = sub.add_parser("deploy", formatter_class=fmt,
                            help="write a deploy bundle of a plan: the model, the FAISS factory string and ready LanceDB, Qdrant, "
                                 "pgvector and Milvus configurations, with a README and a bytes table",
                            description="Writes into --out: deploy.json (everything as data, with the precision -> store settings "
                                        "table and where each store's own quantiser differs from the plan's), faiss_factory.txt, "
                                        "lancedb.json, qdrant.json, pgvector.sql, milvus.json, README.md and model/ (the "
                                        "sentence-transformers model with the plan's compressor and precision, as `compress export "
                                        "--plan` writes it).")
    deploy.add_argument("--plan", required=True, help="a `compress plan` folder")
    deploy.add_argument("--out", required=True, help="bundle folder to write")
    model = deploy.add_mutually_exclusive_group()
    model.add_argument("--model", default=None,
                       help="the base model to export with the compressor (default: the model the plan was made with; none for a "
                            "plan made from precomputed vectors)")
    model.add_argument("--no-model", action="store_true", help="write the store configurations without the model")
    deploy.add_argument("--top-k", type=positive_int, default=10, help="the number of hits the search settings are sized for")
    deploy.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    deploy.set_defaults(handler=run_index_deploy)

    search = commands.add_parser("search", formatter_class=fmt, help="encode queries (or take query vectors) and print or save the top hits of an index",
                                 description="Encodes the queries (arguments, or --queries FILE) with --model, applies --adapter "
                                 "(default: the one the index was built with, if its folder still exists), and searches the index. "
                                 "--query-vectors FILE searches your own query vectors instead: no model is loaded, the vectors are "
                                 "scored as given (inner product; normalise them as the index's vectors were), through the same adapter. "
                                 "--out writes the hits as a TREC run file (run.trec: 'qid Q0 docid rank score tag', for trec_eval, "
                                 "pytrec_eval, ranx) and as run.jsonl.")
    search.add_argument("query", nargs="*", help="query text (several arguments are several queries, ids 1, 2, ...)")
    search.add_argument("--queries", default=None, metavar="FILE",
                        help="query file: JSONL ({\"_id\" or \"query_id\", \"text\"} per line, e.g. BEIR's queries.jsonl) or TSV (id<TAB>text)")
    search.add_argument("--query-vectors", default=None, metavar="FILE",
                        help="(n, d) float32/float16 .npy of query vectors (with --query-ids), or .parquet with 'id' and 'embedding' "
                             "columns, in the space the index was built from; instead of query texts, no model loaded. NaN or "
                             "infinity, and vectors of another dimension, are refused")
    search.add_argument("--query-ids", default=None, metavar="FILE",
                        help="ids of the --query-vectors rows (.txt one per line, or a .json list), unique")
    search.add_argument("--out", default=None, metavar="DIR", help="write run.trec and run.jsonl there instead of printing tables")
    search.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    search.add_argument("--run-tag", default="embedtune", help="the TREC run file's last column")
    search.add_argument("--index", required=True, help="index folder written by `index build`")
    search.add_argument("--model", default=None,
                        help="encoder of the queries (default: the one the index manifest records; an index that records none needs it)")
    search.add_argument("--adapter", default=None, help="compressor folder; default: the index's own adapter")
    search.add_argument("--no-adapter", action="store_true", help="search with the raw model vectors")
    search.add_argument("--query-prompt", default=None,
                        help="text prepended to the query (instruction models); default: the one the index's encoder recipe records")
    add_backend_flag(search, recorded="the index's manifest")
    search.add_argument("--top-k", type=positive_int, default=10, help="hits per query (>= 1)")
    search.add_argument("--rescore", default=None, choices=["float", "asym"], help="binary index: rescore the top 100 candidates")
    search.add_argument("--keep-identical-ids", action="store_true",
                        help="with --queries or --query-vectors: keep a hit whose document id equals the query id (dropped by default, as "
                             "`evaluate` and BEIR drop it)")
    search.add_argument("--json", action="store_true", help="print JSON instead of a table")
    search.set_defaults(handler=run_search)


def run_index_build(args: argparse.Namespace) -> int:
    inputs = [args.embeddings, args.ids, args.adapter, args.data, args.plan]
    # Refusals now; --out itself is prepared (and --overwrite applied) only once the index is built.
    prepare_output_dir(args.out, args.overwrite, command="index build", inputs=inputs, check_only=True)

    def prepare() -> None:
        prepare_output_dir(args.out, args.overwrite, command="index build", inputs=inputs)

    pool = ray_pool(args)
    if args.plan and (args.adapter or args.kind != "flat"):
        raise ValueError("--plan fixes the adapter and the index kind; drop --adapter and --kind.")
    titles = None
    if args.data:
        # Only the corpus is read: a bare corpus.jsonl, or a BEIR folder whether or not it has qrels.
        titles = {doc_id: doc.get("title", "") for doc_id, doc in load_beir_corpus(args.data).corpus.items()}
    if args.plan:
        from embedtune.index.planned import build_planned_index

        out = build_planned_index(args.embeddings, args.out, args.plan, ids=args.ids, titles=titles, model=args.model,
                                  backend=args.backend, chunk_size=args.chunk_size, id_column=args.id_column, vector_column=args.vector_column,
                                  before_write=prepare, ray=pool)
    else:
        out = build_index(args.embeddings, args.out, ids=args.ids, adapter=args.adapter, kind=args.kind, titles=titles, model=args.model,
                          backend=args.backend, chunk_size=args.chunk_size, id_column=args.id_column, vector_column=args.vector_column,
                          before_write=prepare, ray=pool)
    finish_output_dir(out, "index build")
    manifest = json.loads((Path(out) / "manifest.json").read_text(encoding="utf-8"))
    if args.json:
        print_json(manifest)
    else:
        print_table([manifest], ["kind", "ntotal", "input_dim", "dim", "bytes_per_vector", "index_bytes", "build_seconds"])
        print(f"saved to {out}")
    return 0


def run_index_deploy(args: argparse.Namespace) -> int:
    from embedtune.index.deploy_bundle import write_deploy_bundle

    deploy = write_deploy_bundle(args.plan, args.out, model=args.model, include_model=not args.no_model, overwrite=args.overwrite,
                                 top_k=args.top_k)
    print_json({"out": str(args.out), "precision": deploy["precision"]["name"], "dim": deploy["dim"], "model": deploy["model"],
                "bytes_per_vector": deploy["bytes"]["bytes_per_vector"], "files": sorted(deploy["files"].values())})
    return 0


def run_search(args: argparse.Namespace) -> int:
    if args.query_vectors is not None:
        return _search_vectors(args)
    if args.query_ids is not None:
        raise ValueError("--query-ids names the rows of --query-vectors; give --query-vectors too (or drop --query-ids).")
    if args.queries and args.query:
        raise ValueError("give queries as arguments or as --queries FILE, not both.")
    if args.queries:
        queries = read_query_file(args.queries)
    elif args.query:
        queries = [(str(number), text) for number, text in enumerate(args.query, 1)]
    else:
        raise ValueError("no query: pass query text as arguments, or --queries FILE (JSONL or TSV).")
    inputs = [args.queries, args.index, args.adapter]
    if args.out:  # refusals now; --out is prepared once the hits are there
        prepare_output_dir(args.out, args.overwrite, command="search", inputs=inputs, check_only=True)
    # Queries from a file carry real ids: a hit with the query's own id is dropped, as `evaluate` (and BEIR) drop it.
    # Argument queries are numbered 1, 2, ...: those numbers are no document's id.
    results = search_texts(args.index, [text for _, text in queries], args.model, args.adapter, not args.no_adapter, args.top_k,
                           args.query_prompt, args.rescore, show_progress=len(queries) > 1,
                           query_ids=[qid for qid, _ in queries] if args.queries else None,
                           ignore_identical_ids=not args.keep_identical_ids, backend=args.backend)
    hits = {qid: found for (qid, _), found in zip(queries, results)}
    return _report_hits(args, queries, hits, inputs)


def _search_vectors(args: argparse.Namespace) -> int:
    """``search --query-vectors``: the hits of given query vectors, written and printed as text search's are."""
    given = [flag for flag, value in (("query text", args.query), ("--queries", args.queries), ("--model", args.model),
                                      ("--query-prompt", args.query_prompt), ("--backend", args.backend)) if value]
    if given:
        raise ValueError(f"--query-vectors are searched as given, with no model: drop {', '.join(given)}.")
    inputs = [args.query_vectors, args.query_ids, args.index, args.adapter]
    if args.out:  # refusals now; --out is prepared once the hits are there
        prepare_output_dir(args.out, args.overwrite, command="search", inputs=inputs, check_only=True)
    query_ids, results = search_vectors(args.index, args.query_vectors, args.query_ids, args.adapter, not args.no_adapter, args.top_k,
                                        args.rescore, ignore_identical_ids=not args.keep_identical_ids)
    queries: list[tuple[str, Any]] = [(qid, None) for qid in query_ids]  # no text: run.jsonl's "query" is null
    return _report_hits(args, queries, dict(zip(query_ids, results)), inputs)


def _report_hits(args: argparse.Namespace, queries: list[tuple[str, Any]], hits: dict[str, Any], inputs: list[Any]) -> int:
    if args.out:
        out = prepare_output_dir(args.out, args.overwrite, command="search", inputs=inputs)
        trec = write_trec_run(out / "run.trec", hits, args.run_tag)
        jsonl = write_jsonl_run(out / "run.jsonl", queries, hits)
        finish_output_dir(out, "search")
    if args.json:
        print_json({"queries": [{"query_id": qid, "query": text, "hits": hits[qid]} for qid, text in queries]})
        return 0
    if args.out:  # the one summary line (it was printed twice, once as a log line)
        print(f"{len(queries)} queries, top {args.top_k} hits each: {trec} (TREC run), {jsonl}")
        return 0
    for qid, query in queries:
        print(f"query {qid}: {query}" if query is not None else f"query {qid}")
        print_table([{**hit, "title": (hit.get("title") or "")[:80]} for hit in hits[qid]], ["rank", "score", "id", "title"])
    return 0
