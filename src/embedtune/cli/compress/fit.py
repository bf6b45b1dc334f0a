"""``embedtune compress fit``: fit one compressor on all the data given and write it to ``--out`` (:func:`fit_on_all`)."""

from __future__ import annotations

import argparse

from embedtune.data.pseudo_queries import PSEUDO_QUERY_SOURCES
from embedtune.cli.common import add_model_flags, encoder_options_from_args, print_json
from embedtune.cli.compress.flags import (
    add_label_flags,
    add_method_config_flags,
    add_mining_flags,
    method_help,
    method_settings,
    mining_overrides,
)
from embedtune.compress import available_methods, get_compressor_class
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir
from embedtune.workflows.fit import FIT_INFO_NAME, fit_on_all, supported_paths

__all__ = ["register", "run_fit", "fit_paths_help"]


def fit_paths_help() -> str:
    """Which registered methods take which path, from the registry."""
    rows = {"supervised and unsupervised": [], "supervised only": [], "unsupervised only": []}
    for name in available_methods():
        paths = supported_paths(name)
        key = "supervised and unsupervised" if len(paths) == 2 else f"{paths[0]} only"
        rows[key].append(name)
    return "; ".join(f"{key}: {', '.join(names)}" for key, names in rows.items() if names)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``fit`` to the ``compress`` subcommands."""
    fit = sub.add_parser(
        "fit",
        help="to deploy: fit one compressor on all the data given and write it to --out (no evaluation split; use train to compare methods)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
                     help="the method's named recipe; default: the method's own (supervised methods: robust, the safety net; "
                     "DIVE without labels: unsupervised-guarded from a corpus's text, which keeps training only where the "
                     "held-out documents' pseudo-queries show it pays, else unsupervised)")
    fit.add_argument("--pseudo-queries", choices=[*PSEUDO_QUERY_SOURCES, "none"], default=None,
                     help="DIVE's training-only pseudo-queries, one per document (its title, its first sentence or its first 12 words); "
                     "none: off. Default: the preset's (skipped on given vectors, which carry no text). On the unsupervised "
                     "path: their source (default title, then first-words where no title or sentence gives one) for the "
                     "default unsupervised-guarded preset, for --set selection_signal=pseudo-queries (the held-out documents' "
                     "pseudo-queries DIVE selects its start and epoch on), for --set training_guard=pseudo-queries (the same "
                     "pseudo-queries decide whether training is kept over the PCA start) and for --set pseudo_query_weight=W "
                     "(the training documents' pseudo-queries as anchors of the rank distillation)")
    add_method_config_flags(fit)
    fit.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE", help="any other config field")
    val = fit.add_mutually_exclusive_group()
    val.add_argument("--val-split", default=None, metavar="SPLIT_OR_FILE",
                     help="queries held out for best-epoch selection only (never trained on): a qrels split of --data, "
                     "or a pairs/qrels file. Default: the method's own hold-out of training queries, then a refit on all")
    val.add_argument("--val-fraction", type=float, default=None, help="or hold out this fraction of the labelled queries instead")
    fit.add_argument("--seed", type=int, default=2027, help="training, mining and hold-out seed")
    add_mining_flags(fit, description="A flag given overrides the preset's mining (supervised path only); one left out keeps it. "
                                      "'none' turns the false-negative filter or the cap off.")
    fit.add_argument("--out", required=True, help="folder for the compressor itself (load_compressor(OUT)) and fit.json")
    fit.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    fit.add_argument("--json", action="store_true", help="print fit.json instead of a summary")
    fit.set_defaults(handler=run_fit)


def run_fit(args: argparse.Namespace) -> int:
    cls = get_compressor_class(args.method)  # fail fast on a typo, before any encoding
    settings = method_settings(args, args.method)
    preset = cls.get_preset(args.preset)
    mining = mining_overrides(args)
    preset.mining.replace(**mining)
    prepare_output_dir(args.out, args.overwrite, command="compress fit", inputs=[
        args.data, args.labels, args.doc_embeddings, args.doc_ids, args.query_embeddings, args.query_ids])
    encoder_options = encoder_options_from_args(args)  # the similarity as evaluate and train resolve it
    result = fit_on_all(
        args.method, args.dim, data=args.data, model=args.model, split=args.split, labels=args.labels,
        doc_embeddings=args.doc_embeddings, doc_ids=args.doc_ids, query_embeddings=args.query_embeddings, query_ids=args.query_ids,
        unsupervised=args.unsupervised, val_split=args.val_split, val_fraction=args.val_fraction, preset=args.preset, settings=settings,
        mining=mining or None, seed=args.seed, encoder_options=encoder_options, cache=not args.no_cache, out=args.out,
        pseudo_queries=args.pseudo_queries,
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
    print(f"fitted {info['method']} (preset {info['preset']}) {info['input_dim']}-d -> {info['dim']}-d on {used}{info['documents']} documents "
          f"({info['provenance'].get('model')}) in {info['fit_seconds']:.1f}s{epoch}")
    print(f"saved to {result.out} ({FIT_INFO_NAME} says what was used)")
    return 0
