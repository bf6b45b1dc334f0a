"""``embedtune compress train|apply|export``: thin handlers over :func:`embedtune.workflows.fit_compressor`."""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from embedtune.cli.common import (
    DeprecatedAlias,
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
from embedtune.compress import available_methods, get_compressor_class, load_compressor
from embedtune.compress.presets import SAFETY_NET_MINING
from embedtune.compress.st_export import export_sentence_transformer
from embedtune.compress.streaming import apply_compressor_streaming, embedding_file_shape, ids_path_for
from embedtune.encoders import resolve_model_path
from embedtune.encoders.similarity import resolve_similarity
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir, prepare_output_file
from embedtune.workflows.experiment import Experiment
from embedtune.workflows.plots import plot_compression_runs
from embedtune.workflows.results import compression_rows, describe_data, describe_model, write_results
from embedtune.workflows.fit import FIT_INFO_NAME, fit_on_all, supported_paths
from embedtune.workflows.subset_report import new_documents_lines, subset_lines
from embedtune.workflows.train_compressor import PCA_VARIANTS, CompressionResult, fit_compressor

logger = logging.getLogger(__name__)

# The mining flags, each a MiningOptions field; unset flags keep the preset's value.
MINING_FLAGS = ("negatives", "n_negatives", "skip_top", "false_negative_margin", "false_negative_reference", "max_triplets_per_query")


def method_help() -> str:
    """One line per registered method, from the registry."""
    return "; ".join(f"{name}: {get_compressor_class(name).help}" for name in available_methods())


def preset_help() -> str:
    """Every registered method's presets, from the registry."""
    parts = []
    for name in available_methods():
        cls = get_compressor_class(name)
        if cls.presets:
            default = f", default {cls.default_preset}" if cls.default_preset else ""
            parts.append(f"{name}: {', '.join(cls.presets)}{default}")
    return "; ".join(parts)


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _parse_settings(pairs: list[str]) -> dict[str, Any]:
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE (e.g. --set margin=0.4); got {pair!r}.")
        settings[key.strip().replace("-", "_")] = _parse_value(value.strip())
    return settings


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}; got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}; got {value}")
    return value


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number; got {text!r}")
    return value


def _finite_float_or_none(text: str) -> float | None:
    return None if text.strip().lower() == "none" else _finite_float(text)


def _positive_int_or_none(text: str) -> int | None:
    return None if text.strip().lower() == "none" else _positive_int(text)


ADAPTER_HELP = "a fitted compressor's folder, or a `compress train --out` folder holding exactly one"


def add_label_flags(parser: argparse.ArgumentParser) -> None:
    """``--pairs`` / ``--qrels``: relevance labels for precomputed vectors, with no BEIR folder (no texts)."""
    group = parser.add_argument_group("labels for precomputed vectors (instead of a BEIR folder's qrels)")
    labels = group.add_mutually_exclusive_group()
    labels.add_argument("--pairs", dest="labels", default=None, metavar="FILE",
                        help='(query, relevant doc) pairs: JSONL lines {"query_id": "q1", "doc_id": "d7"} or TSV lines q1<TAB>d7; '
                        "needs --doc-embeddings/--doc-ids and --query-embeddings/--query-ids")
    labels.add_argument("--qrels", dest="labels", default=None, metavar="FILE", help="a BEIR qrels TSV (query-id, corpus-id, score)")


def with_both_pca_variants(method: str, compare: list[str]) -> list[str]:
    """``compare`` with the other PCA variant added when one is there and ``method`` is supervised.

    A supervised method's gain is reported against the stronger of centred and uncentred PCA
    (DIVE's PCA-rotated start is the uncentred one).
    """
    present = [name for name in PCA_VARIANTS if name in compare]
    if present and get_compressor_class(method).supervised:
        return [*compare, *(name for name in PCA_VARIANTS if name not in compare and name != method)]
    return compare


def fit_paths_help() -> str:
    """Which registered methods take which path, from the registry."""
    rows = {"supervised and unsupervised": [], "supervised only": [], "unsupervised only": []}
    for name in available_methods():
        paths = supported_paths(name)
        key = "supervised and unsupervised" if len(paths) == 2 else f"{paths[0]} only"
        rows[key].append(name)
    return "; ".join(f"{key}: {', '.join(names)}" for key, names in rows.items() if names)


def register(commands: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    compress = commands.add_parser("compress", help="train, apply and export embedding compressors (DIVE and baselines)")
    sub = compress.add_subparsers(dest="compress_command", metavar="ACTION", required=True)

    train = sub.add_parser(
        "train",
        help="fit a compressor on the query-disjoint split and report held-out metrics",
        formatter_class=fmt,
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
                       f"{preset_help()}. --heads/--epochs/--lr/--set and the mining flags override it")
    train.add_argument("--heads", default=None, help="DIVE heads H (an integer or 'auto'); default: the config's 4")
    train.add_argument("--epochs", type=int, default=None, help="training epochs (default: the method's, 50)")
    train.add_argument("--lr", "--learning-rate", dest="lr", type=float, default=None, help="learning rate (default: the method's)")
    train.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                       help="any other config field, e.g. --set margin=0.4 --set triplet_loss=softplus")
    train.add_argument("--final", action="store_true", help="train on train+val and evaluate on the held-out test queries")
    add_list_flag(train, "--seeds", default=None, item_type=int, help="training seeds; mean ± std is reported (default: 2027)")
    train.add_argument("--negatives", default=argparse.SUPPRESS, choices=["hard", "random"], help="triplet negatives; default hard")
    train.add_argument("--n-negatives", type=_positive_int, default=argparse.SUPPRESS,
                       help="negatives per (query, relevant doc) pair; default 4")
    # Mining flags default to the preset's (Preset.mining); 'none' turns a filter off explicitly.
    train.add_argument("--skip-top", type=_non_negative_int, default=argparse.SUPPRESS,
                       help="hard negatives: never use the frozen model's top-N non-relevant docs (likely unjudged positives); default 0")
    train.add_argument("--false-negative-margin", type=_finite_float_or_none, default=argparse.SUPPRESS, metavar="MARGIN",
                       help="hard negatives: drop candidates scoring above score(query, positive) - MARGIN; 'none' disables the filter. "
                       "Default: 0.05 with the default preset, none with --preset paper/best")
    train.add_argument("--false-negative-reference", choices=["pair", "query-min"], default=argparse.SUPPRESS,
                       help="the positive score the margin is taken from: the pair's own, or the query's lowest (sentence-transformers); "
                       "default: query-min with the default preset, else pair")
    train.add_argument("--max-triplets-per-query", type=_positive_int_or_none, default=argparse.SUPPRESS, metavar="N",
                       help="cap the triplets of each query, spread over its relevant docs; 'none' disables it. "
                       "Default: 32 with the default preset, none with --preset paper/best")
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
    train.add_argument("--out", default=None,
                       help="folder for the fitted compressors (OUT/<method>/, or OUT/<method>/seed-N/ with several seeds), "
                       "the triplets, results.json (the one results layout), results.md, training.png curves; "
                       "report.json is kept for one release")
    train.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    train.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    train.set_defaults(handler=run_train)

    fit = sub.add_parser(
        "fit",
        help="fit one compressor on all the data given (no evaluation split) and write it to --out",
        formatter_class=fmt,
        description="Fit on every labelled query (the supervised path) or on the corpus alone (the unsupervised path: no "
        "labels given, --unsupervised, or a method that reads none), and write the compressor itself to --out with "
        f"fit.json (what was used). Inputs: a BEIR folder with --model; or your own vectors (--doc-embeddings/--doc-ids, "
        f"--query-embeddings/--query-ids) with --pairs or --qrels, no texts needed; or a corpus alone. {fit_paths_help()}.",
    )
    data = fit.add_argument_group("data")
    data.add_argument("--data", default=None, help="BEIR folder, BEIR-layout .zip, or bundled name 'scifact' (with --model)")
    data.add_argument("--split", default="train", help="qrels split of --data to fit on (qrels/<split>.tsv)")
    add_model_flags(fit)
    add_label_flags(fit)
    fit.add_argument("--unsupervised", action="store_true", help="fit on the corpus alone even when labels are given")
    fit.add_argument("--method", default="dive", help=method_help())
    fit.add_argument("--dim", type=int, default=128, help="output dimension k")
    fit.add_argument("--preset", default=None,
                     help="the method's named recipe; default: the method's own (supervised methods: robust, the safety net)")
    fit.add_argument("--heads", default=None, help="DIVE heads H (an integer or 'auto')")
    fit.add_argument("--epochs", type=int, default=None, help="training epochs (default: the method's, 50)")
    fit.add_argument("--lr", "--learning-rate", dest="lr", type=float, default=None, help="learning rate (default: the method's)")
    fit.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE", help="any other config field")
    val = fit.add_mutually_exclusive_group()
    val.add_argument("--val-split", default=None, metavar="SPLIT_OR_FILE",
                     help="queries held out for best-epoch selection only (never trained on): a qrels split of --data, "
                     "or a pairs/qrels file. Default: the method's own hold-out of training queries, then a refit on all")
    val.add_argument("--val-fraction", type=float, default=None, help="or hold out this fraction of the labelled queries instead")
    fit.add_argument("--seed", type=int, default=2027, help="training, mining and hold-out seed")
    for name in ("--false-negative-margin", "--max-triplets-per-query"):
        kind = _finite_float_or_none if name == "--false-negative-margin" else _positive_int_or_none
        fit.add_argument(name, type=kind, default=argparse.SUPPRESS,
                         help="as in `compress train`; default: the preset's (the safety net: 0.05 / 32); 'none' disables it")
    fit.add_argument("--out", required=True, help="folder for the compressor itself (load_compressor(OUT)) and fit.json")
    fit.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    fit.add_argument("--json", action="store_true", help="print fit.json instead of a summary")
    fit.set_defaults(handler=run_fit)

    apply = sub.add_parser("apply", help="compress a (large) .npy or parquet of embeddings in chunks", formatter_class=fmt,
                           description="Memory-mapped, chunked: memory stays bounded whatever the input size.")
    apply.add_argument("--adapter", required=True, help=ADAPTER_HELP)
    apply.add_argument("--input", required=True, help="(n, d) float32/float16 .npy, or .parquet with an id column")
    out = apply.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", help="(n, k) float32 .npy (parquet input: ids go to <stem>.ids.txt) or .parquet")
    out.add_argument("--output", dest="out", action=DeprecatedAlias, replacement="--out", help=argparse.SUPPRESS)
    apply.add_argument("--id-column", default="id", help="parquet id column")
    apply.add_argument("--vector-column", default="embedding", help="parquet vector column")
    apply.add_argument("--chunk-size", type=int, default=65536, help="rows per chunk")
    apply.add_argument("--overwrite", action="store_true", help="replace an existing --out file (never the --input)")
    apply.set_defaults(handler=run_apply)

    export = sub.add_parser("export", help="write a sentence-transformers model with the compressor appended", formatter_class=fmt)
    export.add_argument("--adapter", required=True, help=ADAPTER_HELP)
    export.add_argument("--model", default="minilm", help="the base model the compressor was trained on")
    export.add_argument("--out", required=True, help="output model folder")
    export.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    export.set_defaults(handler=run_export)


def run_train(args: argparse.Namespace) -> int:
    settings = _parse_settings(args.settings)
    if args.heads is not None:
        settings["heads"] = args.heads if args.heads == "auto" else int(args.heads)
    if args.epochs is not None:
        settings["epochs"] = args.epochs
    if args.lr is not None:
        settings["learning_rate"] = args.lr
    for method in [args.method, *args.compare]:
        get_compressor_class(method)  # fail fast on a typo, before any encoding
    preset = get_compressor_class(args.method).get_preset(args.preset)
    # Validated here, before any encoding; unset flags keep the preset's mining (the safety net's
    # when --method is unsupervised and supervised methods are compared).
    mining = {name: getattr(args, name) for name in MINING_FLAGS if hasattr(args, name)}
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
                            args.compare, args.out, labels={"model": args.model}, new_documents=args.new_documents)
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


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1), e.g. 0.2; got {text!r}")
    return value


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
    rows = compression_rows(result)
    main = next(row for row in rows if row["method"] == args.method)
    config = {**command_config(args), "preset": result.preset.name,
              "compressor": result.runs[args.method][0].compressor.config.to_dict() if result.runs[args.method][0].compressor else None,
              "triplets": result.report.get("triplets")}
    data = describe_data(experiment.dataset, queries=result.report["queries"], split_seed=result.report.get("split_seed"))
    path = write_results(args.out, task="compress train", command=command_line(args), config=config, data=data,
                         model=describe_model(experiment.embeddings, name=experiment.provenance.get("model", args.model),
                                              **({"vectors": experiment.provenance["vectors"]} if "vectors" in experiment.provenance else {})),
                         metrics=main["metrics"],
                         per_query=main["per_query"], rows=rows, table=table,
                         extra={key: result.report[key] for key in ("subsets", "new_documents") if key in result.report})
    logger.info("results: %s", path)


def run_fit(args: argparse.Namespace) -> int:
    settings = _parse_settings(args.settings)
    if args.heads is not None:
        settings["heads"] = args.heads if args.heads == "auto" else int(args.heads)
    if args.epochs is not None:
        settings["epochs"] = args.epochs
    if args.lr is not None:
        settings["learning_rate"] = args.lr
    cls = get_compressor_class(args.method)  # fail fast on a typo, before any encoding
    preset = cls.get_preset(args.preset)
    mining = {name: getattr(args, name) for name in ("false_negative_margin", "max_triplets_per_query") if hasattr(args, name)}
    preset.mining.replace(**mining)
    prepare_output_dir(args.out, args.overwrite, command="compress fit", inputs=[
        args.data, args.labels, args.doc_embeddings, args.doc_ids, args.query_embeddings, args.query_ids])
    # The flag, else the model's own (a PACE Stage II model ranks by dot), else cosine: what evaluate and train use.
    choice = resolve_similarity(args.similarity, args.model, precomputed=args.doc_embeddings is not None)
    args.similarity, args.similarity_source = choice.name, choice.source
    encoder_options = {"batch_size": args.batch_size, "max_seq_length": args.max_seq_length, "query_prompt": args.query_prompt,
                       "document_prompt": args.doc_prompt, "normalize": choice.name != "dot"}
    result = fit_on_all(
        args.method, args.dim, data=args.data, model=args.model, split=args.split, labels=args.labels,
        doc_embeddings=args.doc_embeddings, doc_ids=args.doc_ids, query_embeddings=args.query_embeddings, query_ids=args.query_ids,
        unsupervised=args.unsupervised, val_split=args.val_split, val_fraction=args.val_fraction, preset=args.preset, settings=settings,
        mining=mining or None, seed=args.seed, encoder_options=encoder_options, cache=not args.no_cache, out=args.out,
    )
    finish_output_dir(args.out, "compress fit")
    if args.json:
        print_json(result.info)
        return 0
    for line in result.notes:
        print(line)
    info = result.info
    triplets = info.get("triplets", {}).get("n_triplets")
    used = (f"{info['labels']['train_queries']} labelled queries, {triplets} triplets, " if result.path == "supervised" else "")
    epoch = f", kept epoch {info['selected_epoch']} (0 = the untrained start)" if info.get("selected_epoch") is not None else ""
    print(f"fitted {info['method']} {info['input_dim']}-d -> {info['dim']}-d on {used}{info['documents']} documents "
          f"({info['provenance'].get('model')}) in {info['fit_seconds']:.1f}s{epoch}")
    print(f"saved to {result.out} ({FIT_INFO_NAME} says what was used)")
    return 0


def run_apply(args: argparse.Namespace) -> int:
    prepare_output_file(args.out, args.overwrite, inputs=[args.input])
    if args.input.endswith(".parquet") and args.out.endswith(".npy"):  # the ids go beside the vectors
        prepare_output_file(ids_path_for(args.out), args.overwrite, inputs=[args.input], flag="--out's ids file")
    compressor = load_compressor(args.adapter)
    start = time.perf_counter()
    path = apply_compressor_streaming(compressor, args.input, args.out, args.chunk_size,
                                      id_column=args.id_column, vector_column=args.vector_column)
    rows = embedding_file_shape(path, args.vector_column)[0]
    seconds = time.perf_counter() - start
    print_json({"output": str(path), "rows": int(rows), "dim": compressor.output_dim, "seconds": seconds, "vectors_per_second": rows / max(seconds, 1e-9)})
    return 0


def run_export(args: argparse.Namespace) -> int:
    compressor = load_compressor(args.adapter)
    path = export_sentence_transformer(compressor, resolve_model_path(args.model), args.out, overwrite=args.overwrite,
                                       inputs=[args.adapter])
    print_json({"out": str(path), "dim": compressor.output_dim})
    return 0
