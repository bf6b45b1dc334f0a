"""``embedtune diagnose``: angular–norm coupling, anisotropy and the norm-coloured PCA of a model."""

from __future__ import annotations

import argparse
import logging

from embedtune.cli.common import add_data_flags, command_config, command_line, format_table, print_json
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir
from embedtune.workflows.diagnose import diagnose_model
from embedtune.workflows.results import write_results

logger = logging.getLogger(__name__)

COLUMNS = ["model", "n_pairs", "coupling_r", "random_pair_cosine", "positive_cosine", "query_norm_mean", "candidate_norm_mean"]


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "diagnose",
        help="embedding-geometry diagnostics (PACE Figure 4 / Figure 2a)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "Embed matched (query, positive) pairs with the model's raw outputs (unnormalised, a trailing Normalize module "
            "stripped, as the paper defines the diagnostics) and report the Pearson r "
            "between standardised log(‖q‖·‖p⁺‖) and cos(q, p⁺), the mean cosine of random query–candidate pairs, and "
            "(with --out) a PNG of the PCA of L2-normalised embeddings coloured by norm percentile."
        ),
    )
    parser.add_argument("--model", required=True, help="'minilm', 'mpnet', or a local sentence-transformers folder")
    add_data_flags(parser, split_default="train", split_help="qrels split whose (query, positive) pairs are sampled")
    parser.add_argument("--n-pairs", type=int, default=1000, help="pairs sampled (0 = all)")
    parser.add_argument("--random-pairs", type=int, default=10000, help="random (query, candidate) pairs for the mean cosine")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--max-seq-length", type=int, default=None, help="cap on tokens per text")
    parser.add_argument("--batch-size", type=int, default=64, help="encoding batch size")
    parser.add_argument("--keep-normalize", action="store_true",
                        help="diagnose the model as saved: keep a trailing Normalize module (then every norm is 1 and r is undefined)")
    parser.add_argument("--out", default=None, help="folder for the PNGs, results.json (the full diagnosis in its 'details'; it replaces report.json) "
                        "and results.md")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(handler=run_diagnose)


def run_diagnose(args: argparse.Namespace) -> int:
    if args.out:
        prepare_output_dir(args.out, args.overwrite, command="diagnose", inputs=[args.model, args.data])
    report = diagnose_model(
        args.model,
        data=args.data,
        split=args.split,
        n_pairs=args.n_pairs or None,
        seed=args.seed,
        max_seq_length=args.max_seq_length,
        batch_size=args.batch_size,
        out_dir=args.out,
        n_random_pairs=args.random_pairs,
        strip_normalize=not args.keep_normalize,
    )
    result = {**report.to_dict(), "normalize_stripped": report.meta["normalize_stripped"], "outputs": report.meta["outputs"]}
    table = format_table([{**result, "model": args.model}], COLUMNS)
    if args.out:
        metrics = {key: result[key] for key in COLUMNS[1:]} | {"query_norm_std": result["query_norm_std"],
                                                              "candidate_norm_std": result["candidate_norm_std"]}
        path = write_results(args.out, task="diagnose", command=command_line(args), config=command_config(args),
                             data={**report.meta["dataset"], "queries": f"{result['n_pairs']} (query, positive) pairs"},
                             model={**report.meta["encoder"], "normalize_stripped": result["normalize_stripped"], "outputs": result["outputs"]},
                             metrics={**metrics, "main_score": result["coupling_r"]},
                             rows=[{"model": args.model, "outputs": result["outputs"], "metrics": metrics, "figures": report.figures}],
                             table=f"{table}\ndiagnosed: {result['outputs']}", details=result)
        logger.info("results: %s", path)
        finish_output_dir(args.out, "diagnose")
    if args.json:
        print_json(result)
    else:
        print(table)
        print(f"diagnosed: {result['outputs']}")
        for name, path in report.figures.items():
            print(f"{name}: {path}")
    return 0
