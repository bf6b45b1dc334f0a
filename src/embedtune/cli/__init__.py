"""The ``embedtune`` command line. Handlers are thin: each turns flags into a public API call."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from embedtune import __version__
from embedtune.cli.common import warn_deprecated
from embedtune.runtime import set_threads

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    # Imported here, not at the top: `import embedtune.cli.compress` runs this package's
    # __init__, and one command's module must not load every other command's stack (bench, PACE).
    from embedtune.cli import bench, compress, data_commands, diagnose, evaluate, finetune, index, mmeb, pipeline

    parser = argparse.ArgumentParser(
        prog="embedtune",
        description="Make retrieval embeddings smaller (DIVE) and better (PACE). Works offline on local models and data.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"embedtune {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details to stderr")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch and FAISS (default: their own; 1 is often fastest for small adapters on a busy machine)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    data_commands.register(commands)
    evaluate.register(commands)
    compress.register(commands)
    finetune.register(commands)
    diagnose.register(commands)
    bench.register(commands)
    index.register(commands)
    mmeb.register(commands)
    pipeline.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("faiss.loader", "sentence_transformers", "httpx", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.simplefilter("default", UserWarning)
    if args.threads is not None:
        set_threads(args.threads)
    if args.command == "bench":  # the deprecated name of `benchmark`
        warn_deprecated("`embedtune bench`", "`embedtune benchmark`")
    try:
        return int(args.handler(args) or 0)
    except (FileNotFoundError, ValueError) as error:
        if args.verbose:
            raise
        print(f"embedtune: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
