"""``embedtune evaluate``: exact search and pytrec_eval metrics for a model on a dataset."""

from __future__ import annotations

import argparse
import time

from embedtune.cli.common import add_data_flags, add_model_flags, add_split_flags, experiment_from_args, positive_int, print_json, print_table


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "evaluate",
        help="evaluate a frozen model on a BEIR dataset (nDCG@10, Recall@10, ...)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Encode (or load cached/precomputed) embeddings, run exact inner-product search and score with pytrec_eval.",
    )
    add_data_flags(parser)
    add_model_flags(parser)
    add_split_flags(parser)
    parser.add_argument("--queries", default="all", choices=["all", "train", "val", "test", "train+val"],
                        help="which judged queries: all of them, or one part of the query-disjoint split")
    parser.add_argument("--top-k", type=positive_int, default=100, help="documents retrieved per query (>= 1)")
    parser.add_argument("--keep-identical-ids", action="store_true",
                        help="keep retrieved docs whose id equals the query id (BEIR drops them by default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(handler=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    experiment = experiment_from_args(args, with_split=args.queries != "all")
    metrics = experiment.evaluate(args.queries, ignore_identical_ids=not args.keep_identical_ids, top_k=args.top_k)
    emb = experiment.embeddings
    result = {
        **metrics.to_dict(),
        "dataset": experiment.dataset.name,
        "model": args.model if args.doc_embeddings is None else "precomputed",
        "dim": emb.dim,
        "queries": args.queries,
        "similarity": experiment.similarity,  # the one used: the flag, else the model's own, else cosine
        "similarity_source": args.similarity_source,
        "ignore_identical_ids": not args.keep_identical_ids,
        "cache_hits": emb.cache_hits,
        "encode_seconds": emb.timings,
        "docs_per_second": (len(emb.doc_ids) / emb.timings["document"]) if emb.cache_hits.get("document") is False else None,
        "seconds": time.perf_counter() - start,
    }
    if args.json:
        print_json(result)
    else:
        print_table([result], ["dataset", "model", "dim", "n_queries", "ndcg@10", "recall@10", "recall@100", "p@1", "mrr@10"])
    return 0
