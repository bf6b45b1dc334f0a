"""``embedtune compress export``: a sentence-transformers model with the compressor appended."""

from __future__ import annotations

import argparse

from embedtune.cli.common import print_json
from embedtune.cli.compress.flags import ADAPTER_HELP
from embedtune.compress import load_compressor
from embedtune.compress.st_export import export_sentence_transformer
from embedtune.encoders import resolve_model_path
from embedtune.outputs import OVERWRITE_HELP

__all__ = ["register", "run_export"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``export`` to the ``compress`` subcommands."""
    export = sub.add_parser("export", help="write a sentence-transformers model with the compressor appended",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    export.add_argument("--adapter", required=True, help=ADAPTER_HELP)
    export.add_argument("--model", default="minilm", help="the base model the compressor was trained on")
    export.add_argument("--out", required=True, help="output model folder")
    export.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    export.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    compressor = load_compressor(args.adapter)
    path = export_sentence_transformer(compressor, resolve_model_path(args.model), args.out, overwrite=args.overwrite,
                                       inputs=[args.adapter])
    print_json({"out": str(path), "dim": compressor.output_dim})
    return 0
