"""``embedtune evaluate``: exact search and pytrec_eval metrics for a model on a dataset."""

from __future__ import annotations

import argparse
import logging
import time

from embedtune.cli.common import (
    positive_int,
    add_data_flags,
    add_model_flags,
    add_split_flags,
    command_config,
    command_line,
    experiment_from_args,
    format_table,
    print_json,
)
from embedtune.evaluate.metrics import DEFAULT_METRICS, RetrievalMetrics, mteb_retrieval_metrics
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir
from embedtune.workflows.results import describe_data, describe_model, mteb_metrics, per_query_scores, write_mteb_result, write_results

logger = logging.getLogger(__name__)

COLUMNS = ["dataset", "model", "dim", "n_queries", "ndcg@10", "recall@10", "recall@100", "p@1", "mrr@10"]


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "evaluate",
        help="evaluate a frozen model on a BEIR dataset (nDCG@10, Recall@10, ...)",
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
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="write results.json (metrics, per-query scores, fingerprints), results.md and, when every judged "
                             "query of --split was scored, mteb/<Task>.json in MTEB's result format")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of a table; metrics under MTEB's names as in results.json "
                             "(ndcg_at_10, precision_at_1, ..., main_score); the older ndcg@10-style keys are kept for one release")
    parser.set_defaults(handler=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    if args.out:
        prepare_output_dir(args.out, args.overwrite, command="evaluate", inputs=[args.data, args.model, args.doc_embeddings, args.doc_ids, args.query_embeddings, args.query_ids])
    start = time.perf_counter()
    experiment = experiment_from_args(args, with_split=args.queries != "all")
    mteb_file = bool(args.out) and args.queries == "all"  # a whole qrels split: the setting an MTEB score has
    # The MTEB file gets the metrics MTEB itself reports (nDCG, MAP, recall, precision, MRR at 1..1000); the rest the defaults.
    scored = experiment.evaluate(args.queries, ignore_identical_ids=not args.keep_identical_ids, top_k=args.top_k,
                                 metrics=mteb_retrieval_metrics(args.top_k) if mteb_file else None)
    metrics = RetrievalMetrics({name: scored.aggregate[name] for name in DEFAULT_METRICS if name in scored.aggregate},
                               {qid: {name: values[name] for name in DEFAULT_METRICS if name in values} for qid, values in scored.per_query.items()})
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
    table = format_table([result], COLUMNS)
    if args.json:
        # MTEB's metric names, as results.json has them (ndcg_at_10, precision_at_1, ...), plus main_score; the
        # older keys (ndcg@10, p@1, ...) stay beside them for one release, as aliases.
        print_json({**result, **mteb_metrics(metrics.aggregate)})
    else:
        print(table)
    if args.out:
        data = describe_data(experiment.dataset, queries=args.queries)
        model = (describe_model(emb) if args.doc_embeddings is None else
                 describe_model(emb, name="precomputed", doc_embeddings=args.doc_embeddings, query_embeddings=args.query_embeddings))
        path = write_results(args.out, task="evaluate", command=command_line(args), config=command_config(args), data=data, model=model,
                             metrics=mteb_metrics({**metrics.aggregate, "n_queries": metrics.n_queries}),
                             per_query=per_query_scores(metrics.per_query), rows=[{**result, "metrics": mteb_metrics(metrics.aggregate)}],
                             table=table)
        logger.info("results: %s", path)
        if mteb_file:
            logger.info("MTEB format: %s", write_mteb_result(args.out, experiment.dataset.name, experiment.dataset.split,
                                                             scored.aggregate, result["seconds"],
                                                             dataset_sha256=experiment.dataset.fingerprints))
        finish_output_dir(args.out, "evaluate")
    return 0
