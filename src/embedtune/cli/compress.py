"""``embedtune compress train|apply|export``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from embedtune.cli.common import add_data_flags, add_model_flags, add_split_flags, experiment_from_args, print_json, print_table

METHOD_HELP = "frozen|truncate|pca|autoencoder|mrl-adaptor|search-adaptor|smec|dive"
# `compress train --method dive` without --preset; `--preset paper` reproduces the DIVE paper.
DEFAULT_DIVE_PRESET = "robust"
# The triplet-mining half of a preset (the other half is DIVEConfig.PRESETS): the robust preset
# filters likely false negatives and caps triplets per query (benchmarks/RESULTS.md, issue 9 §6).
MINING_PRESETS: dict[str, dict[str, Any]] = {
    "robust": {"false_negative_margin": 0.05, "false_negative_reference": "query-min", "max_triplets_per_query": 32},
}


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
    train.add_argument("--method", default="dive", help=METHOD_HELP)
    train.add_argument("--dim", type=int, default=128, help="output dimension k")
    train.add_argument("--preset", default=None,
                       help="DIVE preset: 'robust' (default for --method dive: the 'best' settings plus best-epoch selection "
                       "and false-negative-filtered, capped triplets), 'best' (PCA-rotated init, margin 0.4, selected on validation "
                       "queries), 'paper' (the DIVE paper's settings); --heads/--epochs/--lr/--set and the mining flags override it")
    train.add_argument("--heads", default=None, help="DIVE heads H (an integer or 'auto'); default: the config's 4")
    train.add_argument("--epochs", type=int, default=None, help="training epochs (default: the method's, 50)")
    train.add_argument("--lr", "--learning-rate", dest="lr", type=float, default=None, help="learning rate (default: the method's)")
    train.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                       help="any other config field, e.g. --set margin=0.4 --set triplet_loss=softplus")
    train.add_argument("--final", action="store_true", help="train on train+val and evaluate on the held-out test queries")
    train.add_argument("--seeds", type=int, nargs="+", default=[2027], help="training seeds; mean ± std is reported")
    train.add_argument("--negatives", default="hard", choices=["hard", "random"], help="triplet negatives")
    train.add_argument("--n-negatives", type=int, default=4, help="negatives per (query, relevant doc) pair")
    # Mining flags default to the preset's (see MINING_PRESETS); 'none' turns a filter off explicitly.
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
    train.add_argument("--compare", default="frozen,truncate", help="comma-separated methods to run beside --method ('' for none)")
    train.add_argument("--out", default=None, help="folder for the fitted compressor(s), triplets and training log")
    train.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    train.set_defaults(handler=run_train)

    apply = sub.add_parser("apply", help="compress a (large) .npy or parquet of embeddings in chunks", formatter_class=fmt,
                           description="Memory-mapped, chunked: memory stays bounded whatever the input size.")
    apply.add_argument("--adapter", required=True, help="folder written by `compress train --out` (or Compressor.save)")
    apply.add_argument("--input", required=True, help="(n, d) float32/float16 .npy, or .parquet with an id column")
    apply.add_argument("--output", required=True, help="(n, k) float32 .npy (parquet input: ids go to <stem>.ids.txt) or .parquet")
    apply.add_argument("--id-column", default="id", help="parquet id column")
    apply.add_argument("--vector-column", default="embedding", help="parquet vector column")
    apply.add_argument("--chunk-size", type=int, default=65536, help="rows per chunk")
    apply.set_defaults(handler=run_apply)

    export = sub.add_parser("export", help="write a sentence-transformers model with the compressor appended", formatter_class=fmt)
    export.add_argument("--adapter", required=True, help="folder of a fitted compressor")
    export.add_argument("--model", default="minilm", help="the base model the compressor was trained on")
    export.add_argument("--out", required=True, help="output model folder")
    export.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    export.set_defaults(handler=run_export)


def run_train(args: argparse.Namespace) -> int:
    from embedtune.bench.runner import fit_and_evaluate, shared_triplets, summarize
    from embedtune.compress import get_compressor_class
    from embedtune.data.triplets import check_mining_options, mining_options

    settings = _parse_settings(args.settings)
    if args.preset is None and args.method == "dive":
        args.preset = DEFAULT_DIVE_PRESET
    if args.preset is not None:
        from embedtune.compress.dive import DIVEConfig

        if args.method != "dive":
            raise ValueError(f"--preset names a DIVE preset, but --method is {args.method!r}; drop --preset or use --method dive.")
        if args.preset not in DIVEConfig.PRESETS:
            raise ValueError(f"--preset {args.preset!r} is unknown; choose one of: {', '.join(sorted(DIVEConfig.PRESETS))}.")
        settings = {**DIVEConfig.PRESETS[args.preset], **settings}
    if args.heads is not None:
        settings["heads"] = args.heads if args.heads == "auto" else int(args.heads)
    if args.epochs is not None:
        settings["epochs"] = args.epochs
    if args.lr is not None:
        settings["learning_rate"] = args.lr
    methods = [args.method] + [m.strip() for m in args.compare.split(",") if m.strip() and m.strip() != args.method]
    for method in methods:
        get_compressor_class(method)  # fail fast on a typo, before any encoding
    triplet_options: dict[str, Any] = {
        "skip_top": 0, "false_negative_margin": None, "false_negative_reference": "pair", "max_triplets_per_query": None,
        **MINING_PRESETS.get(args.preset or "", {}),
    }
    if args.negatives == "random":
        # The false-negative filter ranks hard candidates; random negatives keep only the cap.
        triplet_options.update(skip_top=0, false_negative_margin=None, false_negative_reference="pair")
    for name in list(triplet_options):
        if hasattr(args, name):
            triplet_options[name] = getattr(args, name)
    check_mining_options(args.negatives, **triplet_options, where="compress train")
    experiment = experiment_from_args(args)
    out = Path(args.out) if args.out else None
    train_part = "train+val" if args.final else "train"
    needs_triplets = any(get_compressor_class(m).supervised for m in methods)
    triplets = (
        shared_triplets(experiment, train_part, args.n_negatives, args.negatives, args.split_seed,
                        out / f"triplets-{train_part}.json" if out else None, **triplet_options)
        if needs_triplets else None
    )
    if triplets is not None and len(triplets) == 0:
        raise ValueError(
            "no training triplets survived mining: the false-negative filter dropped every candidate negative "
            f"(margin {triplet_options['false_negative_margin']}, reference {triplet_options['false_negative_reference']!r}). "
            "Loosen it with --false-negative-margin (e.g. 0.01), turn it off with --false-negative-margin none, "
            "or use --preset best."
        )
    rows, report = [], {}
    for method in methods:
        cls = get_compressor_class(method)
        # --heads/--epochs/--set target the main method; compared baselines keep their own defaults.
        overrides = settings if method == args.method else {}
        seeds = args.seeds if (cls.supervised or method in ("autoencoder",)) else args.seeds[:1]
        runs = [
            fit_and_evaluate(experiment, method, args.dim, seed, args.final, triplets, overrides,
                             out / method / f"seed-{seed}" if out else None)
            for seed in seeds
        ]
        summary = summarize(runs)
        summary["n_queries"] = runs[0].metrics.n_queries
        rows.append(summary)
        report[method] = {"summary": summary, "runs": [r.row() for r in runs]}
        history = getattr(runs[0].compressor, "history_", None)
        if history and method == args.method:
            report[method]["history_seed0"] = history
    result = {
        "dataset": experiment.dataset.name,
        "model": args.model,
        "queries": "test (held-out)" if args.final else "val",
        "dive_preset": args.preset,
        "split_seed": args.split_seed,
        "results": report,
    }
    if needs_triplets:
        result["triplets"] = {
            "negatives": args.negatives,
            "n_negatives": args.n_negatives,
            **mining_options(**triplet_options),
            "n_triplets": int(len(triplets)),  # type: ignore[arg-type]
        }
    if out:
        from embedtune.io import atomic_write_json

        atomic_write_json(out / "report.json", result)
    if args.json:
        print_json(result)
    else:
        preset = f", DIVE preset '{args.preset}'" if args.preset else ""
        print(f"{experiment.dataset.name} / {args.model}: {result['queries']} queries, split seed {args.split_seed}, seeds {args.seeds}{preset}")
        for row in rows:
            # One seed has no sample std: print the mean alone rather than a made-up "± 0.0000".
            for metric, column in (("ndcg@10", "nDCG@10"), ("recall@10", "Recall@10")):
                spread = f" ± {row[f'{metric}_std']:.4f}" if len(args.seeds) > 1 else ""
                row[column] = f"{row[metric]:.4f}{spread}"
            row["fit_s"] = f"{row['fit_s']:.1f}"
        print_table(rows, ["method", "dim", "heads", "nDCG@10", "Recall@10", "n_queries", "fit_s"])
        if out:
            print(f"saved to {out}")
    return 0


def run_apply(args: argparse.Namespace) -> int:
    import time

    from embedtune.compress import load_compressor
    from embedtune.compress.streaming import apply_compressor_streaming, embedding_file_shape

    compressor = load_compressor(args.adapter)
    start = time.perf_counter()
    path = apply_compressor_streaming(compressor, args.input, args.output, args.chunk_size,
                                      id_column=args.id_column, vector_column=args.vector_column)
    rows = embedding_file_shape(path, args.vector_column)[0]
    seconds = time.perf_counter() - start
    print_json({"output": str(path), "rows": int(rows), "dim": compressor.output_dim, "seconds": seconds, "vectors_per_second": rows / max(seconds, 1e-9)})
    return 0


def run_export(args: argparse.Namespace) -> int:
    from embedtune.compress import load_compressor
    from embedtune.compress.st_export import export_sentence_transformer
    from embedtune.encoders import resolve_model_path

    compressor = load_compressor(args.adapter)
    path = export_sentence_transformer(compressor, resolve_model_path(args.model), args.out, overwrite=args.overwrite)
    print_json({"out": str(path), "dim": compressor.output_dim})
    return 0
