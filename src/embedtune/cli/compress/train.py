"""``embedtune compress train``: fit on the query-disjoint split and report held-out metrics (:func:`fit_compressor`)."""

from __future__ import annotations

import argparse
import logging

from embedtune.cli.common import (
    add_data_flags,
    add_list_flag,
    add_model_flags,
    add_split_flags,
    command_config,
    command_line,
    experiment_from_args,
    format_table,
    print_json,
)
from embedtune.cli.compress.flags import (
    add_label_flags,
    MINING_FLAG_FIELDS,
    add_method_config_flags,
    add_mining_flags,
    method_help,
    method_settings,
    mining_overrides,
    preset_help,
)
from embedtune.compress import get_compressor_class
from embedtune.compress.presets import SAFETY_NET_MINING
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir
from embedtune.workflows.experiment import Experiment
from embedtune.workflows.plots import plot_compression_runs
from embedtune.workflows.results import write_compression_results
from embedtune.workflows.subset_report import new_documents_lines, subset_lines
from embedtune.workflows.train_compressor import CompressionResult, fit_compressor, with_both_pca_variants
from embedtune.data.pseudo_queries import PSEUDO_QUERY_SOURCES

PSEUDO_QUERY_CHOICES = [*PSEUDO_QUERY_SOURCES, "none"]

__all__ = ["register", "run_train", "MINING_FLAGS"]

logger = logging.getLogger(__name__)

# The mining flags, each a MiningOptions field (generated from it); unset flags keep the preset's value.
MINING_FLAGS = MINING_FLAG_FIELDS


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1), e.g. 0.2; got {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` to the ``compress`` subcommands."""
    train = sub.add_parser(
        "train",
        help="to choose a method: fit on a query-disjoint split and report held-out scores beside the baselines (fit writes the one to deploy)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Fit on the train queries (train+val with --final), evaluate on val (test with --final), "
        "and print the result next to the frozen full-d model and the other --compare methods.",
    )
    add_data_flags(train)
    add_model_flags(train)
    add_split_flags(train)
    train.add_argument("--method", default="dive", help=method_help())
    train.add_argument("--dim", type=int, default=128, help="output dimension k")
    train.add_argument("--preset", default=None,
                       help="the method's named recipe (settings and triplet mining); default: the method's own (DIVE: robust). "
                       f"{preset_help()}. The settings flags (--heads, --epochs, --learning-rate, ...), --set and the mining flags override it")
    add_method_config_flags(train)
    train.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                       help="any other config field, e.g. --set margin=0.4 --set triplet_loss=softplus")
    train.add_argument("--final", action="store_true", help="train on train+val and evaluate on the held-out test queries")
    add_list_flag(train, "--seeds", default=None, item_type=int, help="training seeds; mean ± std is reported (default: 2027)")
    add_mining_flags(train)
    add_list_flag(train, "--compare", default=["frozen", "truncate", "pca", "pca-uncentred"],
                  help="methods to run beside --method ('' for none), each with its default preset; the report gives a paired test "
                  "of --method against each, and its gain over the stronger PCA variant (given one, the other is added)")
    train.add_argument("--protocol", choices=["paper", "beir-train"], default="paper",
                       help="paper: a query-disjoint --fractions split of the judged queries of --split; beir-train: fit on "
                       "qrels/train.tsv (selecting on part of it) and score every judged query of --split (implies --final)")
    add_label_flags(train)
    train.add_argument("--new-documents", type=_fraction, default=None, metavar="FRACTION",
                       help="the new-documents protocol: withhold this hashed fraction of the corpus (e.g. 0.2) from fitting "
                       "and selection, then also score the test queries whose positives are all withheld, over the whole corpus")
    train.add_argument("--pseudo-queries", choices=PSEUDO_QUERY_CHOICES, default=None,
                       help="DIVE's training-only pseudo-queries, one per document: its title, its first sentence or its first 12 words "
                       "(weighted by pseudo_query_weight); none: off. Default: the preset's")
    train.add_argument("--out", default=None,
                       help="folder for the fitted compressors (OUT/<method>/, or OUT/<method>/seed-N/ with several seeds), "
                       "the triplets, results.json (the one results layout, the full report in its 'details'; it replaces report.json), "
                       "results.md, training.png curves")
    train.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    train.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    train.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    for method in [args.method, *args.compare]:
        get_compressor_class(method)  # fail fast on a typo, before any encoding
    settings = method_settings(args, args.method)
    preset = get_compressor_class(args.method).get_preset(args.preset)
    # Validated here, before any encoding; unset flags keep the preset's mining (the safety net's
    # when --method is unsupervised and supervised methods are compared).
    mining = mining_overrides(args)
    base_mining = preset.mining if get_compressor_class(args.method).supervised else SAFETY_NET_MINING
    base_mining.replace(**mining)
    args.compare = with_both_pca_variants(args.method, args.compare)
    if args.protocol == "beir-train":
        args.final = True  # beir-train scores every judged test query
    seeds = args.seeds or [2027]
    if args.out:
        prepare_output_dir(args.out, args.overwrite, command="compress train", inputs=[
            args.data, args.model, args.doc_embeddings, args.doc_ids, args.query_embeddings, args.query_ids])
    experiment = experiment_from_args(args)
    result = fit_compressor(experiment, args.method, args.dim, preset, seeds, args.final, settings, mining,
                            args.compare, args.out, labels={"model": args.model}, new_documents=args.new_documents,
                            pseudo_queries=args.pseudo_queries)
    model_name = experiment.provenance.get("model", args.model)
    table = _summary_table(result, model_name, args.split_seed)
    if args.out:
        _write_results(args, result, experiment, table)
        finish_output_dir(args.out, "compress train")
    if args.json:
        print_json(result.report)
    else:
        print(table)
        if result.out:
            print(f"saved to {result.out}")
    return 0


def _summary_table(result: CompressionResult, model: str, split_seed: int) -> str:
    report = result.report
    preset = f", preset '{result.preset.name}'" if result.preset.name != "defaults" else ""
    seeds = result.summaries[next(iter(result.summaries))]["seeds"]
    protocol = " (beir-train: fitted on qrels/train.tsv)" if report.get("protocol") == "beir-train" else ""
    lines = [f"{report['dataset']} / {model}: {report['queries']} queries{protocol}, split seed {split_seed}, seeds {seeds}{preset}"]
    rows = []
    for summary in result.summaries.values():
        row = dict(summary)
        # A method that ran once (one seed, or a seed-free method) has no spread: its mean alone, not "± 0.0000".
        for metric, column in (("ndcg@10", "nDCG@10"), ("recall@10", "Recall@10")):
            spread = f" ± {row[f'{metric}_std']:.4f}" if len(row["seeds"]) > 1 else ""
            row[column] = f"{row[metric]:.4f}{spread}"
        row["runs"] = len(row["seeds"])
        row["fit_s"] = f"{row['fit_s']:.1f}"
        row["B/vector"] = 4 * int(row["dim"])  # float32; `compress plan` sweeps the smaller precisions
        epochs = row.get("selected_epochs")
        row["epoch"] = "/".join(str(e) for e in epochs) if epochs else None
        comparison = result.comparisons.get(row["method"])
        if comparison is not None:
            row[f"Δ {next(iter(result.summaries))} (p)"] = (
                f"{comparison['mean_difference']:+.4f} ({comparison['p_value']:.2g})")
        rows.append(row)
    main = next(iter(result.summaries))
    columns = ["method", "dim", "B/vector", "heads", "nDCG@10", "Recall@10", "n_queries", "epoch", f"Δ {main} (p)", "fit_s"]
    if any(row["runs"] > 1 for row in rows):
        columns.insert(5, "runs")
    columns = [c for c in columns if c not in ("heads", "epoch") or any(row.get(c) not in (None, "") for row in rows)]
    lines.append(format_table(rows, columns))
    lines += _training_lines(result)
    if result.subsets is not None:
        lines += [""] + subset_lines(result.subsets)
    if result.new_documents is not None:
        lines += [""] + new_documents_lines(result.new_documents)
    return "\n".join(lines)


def _training_lines(result: CompressionResult) -> list[str]:
    """What the table does not say: what epoch selection kept, the gain over the stronger PCA, what Δ is."""
    main = next(iter(result.summaries))
    lines = []
    if result.comparisons:
        n = next(iter(result.comparisons.values()))["n_queries"]
        lines.append(f"Δ: {main} minus the row's method, nDCG@10 per query (means over seeds), paired permutation p over {n} queries.")
    if any(row.get("selected_epochs") for row in result.summaries.values()):
        lines.append("epoch: the epoch best-epoch selection kept, per seed (0 = the untrained start).")
    return lines + list(result.notes)


def _write_results(args: argparse.Namespace, result: CompressionResult, experiment: Experiment, table: str) -> None:
    label = f"{experiment.dataset.name} / {args.model}"
    for path in plot_compression_runs(result, label):
        logger.info("training curves: %s", path)
    path = write_compression_results(args.out, result, experiment, args.method, command=command_line(args),
                                     config=command_config(args), model_name=args.model, table=table)
    logger.info("results: %s", path)
