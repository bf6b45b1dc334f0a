"""Flags shared by several commands, and JSON/table output helpers."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embedtune.compress.ray_apply import RayPool
    from embedtune.workflows.experiment import Experiment

DATA_HELP = "BEIR folder, BEIR-layout .zip, or bundled name 'scifact'"


class _ListAction(argparse.Action):
    """``--flag a b c``; ``--flag a,b,c`` (the older form) is accepted too, and both may mix."""

    def __init__(self, *args: Any, item_type: Callable[[str], Any] = str, **kwargs: Any) -> None:
        self.item_type = item_type
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        items = []
        for value in values if isinstance(values, list) else [values]:
            for part in str(value).split(","):
                if part.strip():
                    try:
                        items.append(self.item_type(part.strip()))
                    except ValueError:
                        parser.error(f"{option_string}: invalid value {part.strip()!r}")
        setattr(namespace, self.dest, items)


def add_list_flag(parser: Any, flag: str, default: Sequence[Any] | None, help: str, item_type: Callable[[str], Any] = str,
                  **kwargs: Any) -> None:
    """A list flag, given the one way every command takes lists: space-separated (commas also work).

    ``--flag ''`` gives an empty list.
    """
    parser.add_argument(flag, nargs="*" if default is not None else "+", action=_ListAction, item_type=item_type,
                        default=list(default) if default is not None else None, help=help, **kwargs)


class DeprecatedAlias(argparse.Action):
    """An old flag or command name kept for one release: stores the value and warns once."""

    def __init__(self, *args: Any, replacement: str, **kwargs: Any) -> None:
        self.replacement = replacement
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        warn_deprecated(str(option_string), self.replacement)
        setattr(namespace, self.dest, values)


def warn_deprecated(old: str, new: str) -> None:
    """One line on stderr: ``old`` still works for now, use ``new``."""
    print(f"embedtune: warning: {old} is deprecated and will be removed in the next release; use {new}.", file=sys.stderr)


def add_data_flags(parser: argparse.ArgumentParser, split: bool = True, default: str | None = "scifact", help: str = DATA_HELP,
                   split_default: str = "test", split_help: str = "qrels split to load (qrels/<split>.tsv)",
                   many: bool = False) -> None:
    """``--data`` (and ``--split``), the one declaration every command uses.

    ``many=True``: several datasets, given like every list flag (space-separated; commas work too).
    """
    group = parser.add_argument_group("data")
    if many:
        add_list_flag(group, "--data", default=[default] if default else [], help=help)
    else:
        group.add_argument("--data", default=default, help=help)
    if split:
        group.add_argument("--split", default=split_default, help=split_help)


def add_split_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("query-disjoint split")
    group.add_argument("--split-seed", type=int, default=2027, help="seed of the sha256 query ranking")
    group.add_argument("--fractions", type=float, nargs=3, default=(0.6, 0.2, 0.2), metavar=("TRAIN", "VAL", "TEST"))


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("encoder")
    group.add_argument("--model", default="minilm", help="'minilm', 'mpnet', or a local sentence-transformers folder")
    group.add_argument("--batch-size", type=int, default=64, help="encoding batch size")
    group.add_argument("--max-seq-length", type=int, default=None, help="override the model's max sequence length")
    add_backend_flag(group)
    group.add_argument("--query-prompt", default="", help="text prepended to queries (instruction models)")
    group.add_argument("--doc-prompt", default="", help="text prepended to documents")
    group.add_argument("--similarity", default=None, choices=["cosine", "dot"],
                       help="cosine: L2-normalise before search (precomputed vectors too); dot: rank by the raw dot product. "
                            "Default: the model's own (similarity_fn_name of a sentence-transformers folder, e.g. dot for "
                            "PACE Stage II models), else cosine")
    group.add_argument("--no-cache", action="store_true", help="do not read or write the embedding cache")
    pre = parser.add_argument_group("precomputed embeddings (skip encoding)")
    pre.add_argument("--doc-embeddings", default=None, help="(n_docs, d) .npy or .parquet of corpus vectors")
    pre.add_argument("--doc-ids", default=None, help="ids of --doc-embeddings rows (.txt one per line, or .json)")
    pre.add_argument("--query-embeddings", default=None, help="(n_queries, d) .npy or .parquet of query vectors")
    pre.add_argument("--query-ids", default=None, help="ids of --query-embeddings rows")


BACKEND_CHOICES = ("torch", "onnx", "onnx-int8")  # embedtune.encoders.onnx_backend.BACKENDS, without importing the encoders for --help
BACKEND_HELP = ("encoding runtime: torch (sentence-transformers), onnx (ONNX Runtime fp32 on the CPU: the same vectors, faster) or "
                "onnx-int8 (dynamic int8: faster still, slightly other vectors; see the README). The onnx ones need "
                "pip install \"embedtune[onnx]\"")


def add_backend_flag(parser: Any, recorded: str | None = None) -> None:
    """``--backend``, for every command that encodes text.

    ``recorded`` names where the backend is read from when the flag is left out (an index's
    manifest): the default is then None, and a given flag is checked against what was recorded.
    """
    if recorded is None:
        parser.add_argument("--backend", default="torch", choices=BACKEND_CHOICES, help=BACKEND_HELP)
    else:
        parser.add_argument("--backend", default=None, choices=BACKEND_CHOICES,
                            help=f"the backend that encoded the vectors; default: the one {recorded} records (torch when none). "
                                 "A different one is refused: its vectors would not match.")


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """``{"backend": ...}`` for a non-default ``--backend``, else nothing (torch's options read as before)."""
    backend = getattr(args, "backend", "torch")
    return {"backend": backend} if backend != "torch" else {}


def encoder_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The encoder flags as ``encoder_options``, with the similarity resolved by :func:`encoder_settings`.

    ``args.similarity`` is set to the similarity used (the flag, else the model's own, else
    cosine) and ``args.similarity_source`` to why.
    """
    # Imported on use: the experiment stack is a tenth of a second that commands on vectors alone never need.
    from embedtune.workflows.experiment import encoder_settings

    choice, options = encoder_settings(getattr(args, "similarity", None), args.model,
                                       precomputed=getattr(args, "doc_embeddings", None) is not None,
                                       batch_size=args.batch_size, max_seq_length=args.max_seq_length,
                                       query_prompt=args.query_prompt, document_prompt=args.doc_prompt)
    args.similarity, args.similarity_source = choice.name, choice.source
    return {**options, **backend_options(args)}


def experiment_from_args(args: argparse.Namespace, with_split: bool = True) -> "Experiment":
    """The :class:`Experiment` named by the data, model and split flags.

    ``args.similarity`` is resolved first (:func:`encoder_options_from_args`) and set to the
    similarity used.
    """
    from embedtune.workflows.experiment import load_experiment

    encoder_options = encoder_options_from_args(args)
    return load_experiment(
        data=args.data,
        model=args.model,
        qrels_split=args.split,
        split_seed=getattr(args, "split_seed", 2027) if with_split else None,
        fractions=tuple(getattr(args, "fractions", (0.6, 0.2, 0.2))),
        encoder_options=encoder_options,
        cache=not args.no_cache,
        doc_embeddings=args.doc_embeddings,
        doc_ids=args.doc_ids,
        query_embeddings=args.query_embeddings,
        query_ids=args.query_ids,
        protocol=getattr(args, "protocol", "paper"),
        labels=getattr(args, "labels", None),
    )


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


def format_table(*args: Any, **kwargs: Any) -> str:
    """:func:`embedtune.result_files.format_table`, imported on use: this module loads for every command, numpy or not."""
    from embedtune.result_files import format_table as table

    return table(*args, **kwargs)


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Print :func:`format_table` and return the text (for the results file)."""
    text = format_table(rows, columns)
    print(text)
    return text


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default, said once.

    No ``(default: ...)`` is added where the help text already says the default (or the preset's
    value), nor where the default is None, False, an empty string or an empty list, which say nothing.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        lowered = text.lower()
        if "default" in lowered or "(preset:" in lowered:
            return text
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or (isinstance(default, (str, list, tuple)) and not default):
            return text
        return super()._get_help_string(action)


def command_line(args: argparse.Namespace) -> list[str] | None:
    """The argv that ran this command (``["embedtune", ...]``), when :func:`embedtune.cli.main` recorded it."""
    return getattr(args, "argv", None)


def command_config(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags as plain values (what results files record as the command's config)."""
    skip = {"handler", "argv"}
    return {key: value for key, value in sorted(vars(args).items()) if key not in skip and not callable(value)}


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--top-k 0`` or ``--threads 0`` is refused with the flag named)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {value}")
    return value


def add_ray_flags(parser: argparse.ArgumentParser, actor: str, threads: str, gpus: bool = False) -> None:
    """The Ray Data options, one declaration for every command that can run on an actor pool.

    ``actor``: what one actor is (``"encoder"``); ``threads``: what its threads are (``"torch threads"``);
    ``gpus``: offer ``--gpus-per-actor`` (only encoders use a GPU).
    """
    ray = parser.add_argument_group("Ray Data (pip install \"embedtune[ray]\")")
    ray.add_argument("--ray-actors", type=int, default=0, help=f"{actor} actors; 0 runs in this process")
    ray.add_argument("--ray-address", default=None,
                     help="an existing cluster: 'auto' on one of its nodes, or ray://HOST:10001; default: a local Ray started for this run")
    ray.add_argument("--cpus-per-actor", type=float, default=1.0, help="CPUs each actor reserves")
    if gpus:
        ray.add_argument("--gpus-per-actor", type=float, default=0.0, help="GPUs each actor reserves (1: one encoder per GPU)")
    ray.add_argument("--threads-per-actor", type=int, default=None,
                     help=f"{threads} in each actor (default: the CPUs it reserves, --cpus-per-actor, at least 1)")


def ray_pool(args: argparse.Namespace) -> "RayPool | None":
    """The actor pool that :func:`add_ray_flags`' options describe; None for a run in this process.

    A local ``compress apply`` never imports the Ray layer (20 ms of its start-up); the flags are still
    checked, by :func:`~embedtune.compress.ray_apply.pool_from_flags`, whenever one is given.
    """
    if args.ray_actors == 0 and args.ray_address is None:
        return None
    from embedtune.compress.ray_apply import pool_from_flags

    return pool_from_flags(args.ray_actors, args.ray_address, args.cpus_per_actor, args.threads_per_actor)

