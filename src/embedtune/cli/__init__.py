"""The ``embedtune`` command line. Handlers are thin: each turns flags into a public API call."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from embedtune import __version__
from embedtune.cli.common import positive_int, HelpFormatter, warn_deprecated
from embedtune.cli.compress import ACTIONS as COMPRESS_ACTIONS
from embedtune.errors import EmbedtuneError
from embedtune.outputs import command_outputs
from embedtune.runtime import busy_machine_hint, cli_logging, default_threads, set_threads

__all__ = ["main", "build_parser"]

logger = logging.getLogger(__name__)


#: The CLI modules in the order they register, and the top-level commands each adds (`plan` adds
#: `compress plan` into the compress group). A test checks this against the modules.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "data_commands": ("embed", "embed-corpus", "split"),
    "evaluate": ("evaluate",),
    "compress": ("compress",),
    "plan": (),
    "finetune": ("finetune",),
    "diagnose": ("diagnose",),
    "bench": ("bench", "benchmark", "report"),
    "index": ("index", "search"),
    "mmeb": ("evaluate-mmeb",),
    "pipeline": ("pipeline",),
    "cache": ("cache",),
}
_ADDS_TO = {"plan": "compress"}  # a module that registers into another's group


def _words_of(argv: list[str]) -> list[str]:
    """The command and action words of ``argv``: those before the first option after the top-level ones."""
    words, rest = [], iter(argv)
    for word in rest:
        if word == "--threads" and not words:
            next(rest, None)
        elif word.startswith("-"):
            if words:
                break
        else:
            words.append(word)
    return words


def _modules_for(argv: list[str] | None) -> list[str]:
    """The CLI modules to register for ``argv``: only the named command's (its parser is all that is read), else all."""
    command = next(iter(_words_of(argv)), None) if argv is not None else None
    owner = next((module for module, commands in COMMAND_MODULES.items() if command in commands), None)
    if owner is None:  # top-level --help, no command, or an unknown one: every command, so the usage lists them all
        return list(COMMAND_MODULES)
    actions = _compress_actions(argv)
    return [module for module in COMMAND_MODULES
            if module == owner or (_ADDS_TO.get(module) == owner and (actions is None or module in actions))]


def _compress_actions(argv: list[str] | None) -> tuple[str, ...] | None:
    """The ``compress`` actions to register for ``argv``: the one it names (none for ``plan``), or None for all."""
    words = _words_of(argv) if argv is not None else []
    if len(words) < 2 or words[0] != "compress":
        return None
    if words[1] == "plan":
        return ("plan",)
    return (words[1],) if words[1] in COMPRESS_ACTIONS else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``embedtune`` parser; given ``argv``, with only the subcommand it names (start-up: the other commands' flags
    are never built), else with every command."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="embedtune",
        description="Make retrieval embeddings smaller (DIVE) and better (PACE). Works offline on local models and data.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"embedtune {__version__}")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true",
                           help="also log internals (DEBUG), with logger names and times, and warnings with their source")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="CPU threads for torch, FAISS, BLAS and the trellis encoder together (default: the cores this process "
                             "may use, whatever the load, so results do not depend on it; EMBEDTUNE_THREADS sets it too; on a "
                             "busy machine fewer are often faster)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Each command's module is imported here, and only for the command argv names: one command must not
    # load every other command's stack (bench, PACE) nor build their flags.
    for module in _modules_for(argv):
        if module == "compress":
            actions = _compress_actions(argv)
            importlib.import_module("embedtune.cli.compress").register(
                commands, actions=None if actions is None else tuple(a for a in actions if a != "plan"))
        else:
            importlib.import_module(f"embedtune.cli.{module}").register(commands)
    _say_defaults_once(parser)
    return parser


def _say_defaults_once(parser: argparse.ArgumentParser) -> None:
    """Every parser and subparser gets :class:`HelpFormatter` (each default in --help once, none for None)."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):
                _say_defaults_once(subparser)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = ["embedtune", *(sys.argv[1:] if argv is None else argv)]  # recorded in results.json
    if not args.verbose:
        # Dependencies' own bars (e.g. transformers' "Loading weights") for sub-second jobs; -v keeps them.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with cli_logging(verbose=args.verbose, quiet=args.quiet):
        return _run(args)


def _on_a_terminal() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def _run(args: argparse.Namespace) -> int:
    # One thread budget for torch, FAISS and BLAS: their own defaults (each all cores) oversubscribe a busy machine.
    args.threads_used = args.threads if args.threads is not None else default_threads()
    set_threads(args.threads_used)
    logger.debug("threads: %d (%s)", args.threads_used, "--threads" if args.threads is not None else "default: the usable cores")
    if args.threads is None and not os.environ.get("EMBEDTUNE_THREADS", "").strip() and _on_a_terminal():
        # Advice for a person at a terminal; a script's or a CI job's stderr stays what the command itself says.
        hint = busy_machine_hint(args.threads_used)
        if hint:
            logger.info(hint)
    if args.command == "bench":  # the deprecated name of `benchmark`
        warn_deprecated("`embedtune bench`", "`embedtune benchmark`")
    try:
        # A command that fails records in its --out marker what it wrote up to then (and nothing else).
        with command_outputs():
            return int(args.handler(args) or 0)
    except (Exception, KeyboardInterrupt) as error:
        if args.verbose and not isinstance(error, KeyboardInterrupt):
            raise  # -v: the full traceback
        return report_error(error)


# Errors that mean bad input, data or state (their messages name the file, row, field and fix):
# one line and exit 2. Anything else is a bug: one line that says so, and exit 1.
EXPECTED_ERRORS = (EmbedtuneError, ValueError, OSError)


def report_error(error: BaseException) -> int:
    """Print ``error`` as one ``embedtune: error: ...`` line on stderr; return the exit status."""
    if isinstance(error, KeyboardInterrupt):
        print("embedtune: interrupted", file=sys.stderr)
        return 130
    message = str(error).strip() or type(error).__name__
    if isinstance(error, EXPECTED_ERRORS):
        if isinstance(error, OSError) and error.filename is not None:
            message = f"{error.filename}: {error.strerror or message}"
        print(f"embedtune: error: {message}", file=sys.stderr)
        return 2
    print(f"embedtune: error: unexpected {type(error).__name__}: {message} (a bug in embedtune or a dependency; "
          "rerun with -v for the traceback and report it)", file=sys.stderr)
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
