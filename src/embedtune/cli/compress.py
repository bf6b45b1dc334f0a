"""``embedtune compress train|apply|export``: thin handlers over :func:`embedtune.workflows.fit_compressor`."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from embedtune.cli.common import (
    DeprecatedAlias,
    add_data_flags,
    add_list_flag,
    add_model_flags,
    add_split_flags,
    experiment_from_args,
    print_json,
    print_table,
)
from embedtune.compress import available_methods, get_compressor_class, load_compressor
from embedtune.compress.st_export import export_sentence_transformer
from embedtune.compress.streaming import apply_compressor_streaming, embedding_file_shape, ids_path_for
from embedtune.encoders import resolve_model_path
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir, prepare_output_file
from embedtune.workflows.train_compressor import CompressionResult, fit_compressor

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
    add_list_flag(train, "--compare", default=["frozen", "truncate"], help="methods to run beside --method ('' for none)")
    train.add_argument("--out", default=None,
                       help="folder for the fitted compressors (OUT/<method>/, or OUT/<method>/seed-N/ with several seeds), "
                       "the triplets and report.json")
    train.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    train.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    train.set_defaults(handler=run_train)

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
    # Validated here, before any encoding; unset flags keep the preset's mining.
    mining = preset.mining.replace(**{name: getattr(args, name) for name in MINING_FLAGS if hasattr(args, name)})
    seeds = args.seeds or [2027]
    if args.out:
        prepare_output_dir(args.out, args.overwrite, command="compress train", inputs=[
            args.data, args.model, args.doc_embeddings, args.doc_ids, args.query_embeddings, args.query_ids])
    result = fit_compressor(experiment_from_args(args), args.method, args.dim, preset, seeds, args.final, settings, mining,
                            args.compare, args.out, labels={"model": args.model})
    if args.out:
        finish_output_dir(args.out, "compress train")
    if args.json:
        print_json(result.report)
    else:
        _print_summary(result, args.model, args.split_seed, seeds)
    return 0


def _print_summary(result: CompressionResult, model: str, split_seed: int, seeds: list[int]) -> None:
    report = result.report
    preset = f", preset '{result.preset.name}'" if result.preset.name != "defaults" else ""
    print(f"{report['dataset']} / {model}: {report['queries']} queries, split seed {split_seed}, seeds {seeds}{preset}")
    rows = []
    for summary in result.summaries.values():
        row = dict(summary)
        # One seed has no sample std: print the mean alone rather than a made-up "± 0.0000".
        for metric, column in (("ndcg@10", "nDCG@10"), ("recall@10", "Recall@10")):
            spread = f" ± {row[f'{metric}_std']:.4f}" if len(seeds) > 1 else ""
            row[column] = f"{row[metric]:.4f}{spread}"
        row["fit_s"] = f"{row['fit_s']:.1f}"
        rows.append(row)
    print_table(rows, ["method", "dim", "heads", "nDCG@10", "Recall@10", "n_queries", "fit_s"])
    if result.out:
        print(f"saved to {result.out}")


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
