"""``embedtune compress export``: a sentence-transformers model with the compressor appended (``--plan``: and its planned precision)."""

from __future__ import annotations

import argparse

from embedtune.cli.common import print_json
from embedtune.cli.compress.flags import ADAPTER_HELP
from embedtune.compress import load_compressor
from embedtune.compress.st_export import COMPRESSOR_SUBFOLDER, export_sentence_transformer
from embedtune.encoders import resolve_model_path
from embedtune.index.codecs import PRECISION_SUBFOLDER
from embedtune.index.plan_export import export_plan
from embedtune.outputs import OVERWRITE_HELP

__all__ = ["register", "run_export"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``export`` to the ``compress`` subcommands."""
    export = sub.add_parser("export", help="write a sentence-transformers model with the compressor appended",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    source = export.add_mutually_exclusive_group(required=True)
    source.add_argument("--adapter", help=ADAPTER_HELP)
    source.add_argument("--plan", help="a `compress plan` folder: its compressor, plus its precision (int8 ranges, or the trained "
                                       "RaBitQ/TurboQuant/int4 tables) in OUT/embedtune_precision/, for DeployedCodec.load(OUT)")
    export.add_argument("--model", default="minilm", help="the base model the compressor was trained on")
    export.add_argument("--out", required=True, help="output model folder")
    export.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    export.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    if args.plan is not None:
        path = export_plan(args.plan, resolve_model_path(args.model), args.out, overwrite=args.overwrite)
        compressor = load_compressor(path / COMPRESSOR_SUBFOLDER)
        print_json({"out": str(path), "dim": compressor.output_dim, "precision": str(path / PRECISION_SUBFOLDER)})
        return 0
    compressor = load_compressor(args.adapter)
    path = export_sentence_transformer(compressor, resolve_model_path(args.model), args.out, overwrite=args.overwrite,
                                       inputs=[args.adapter])
    print_json({"out": str(path), "dim": compressor.output_dim})
    return 0
