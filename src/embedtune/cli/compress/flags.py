"""Flags and argparse types that several ``compress`` subcommands share, and the registry's help lines."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from embedtune.compress import available_methods, describe_method
from embedtune.compress.dive.config import DIVEConfig  # torch-free: the config alone, not the method

__all__ = ["ADAPTER_HELP", "dive_field_help", "method_help", "preset_help", "parse_settings", "method_settings", "add_label_flags",
           "non_negative_int", "positive_int", "finite_float", "finite_float_or_none", "positive_int_or_none"]

ADAPTER_HELP = "a fitted compressor's folder, or a `compress train --out` folder holding exactly one"


def method_help() -> str:
    """One line per registered method, from the registry."""
    return "; ".join(f"{name}: {describe_method(name).help}" for name in available_methods())


def preset_help() -> str:
    """Every registered method's presets, from the registry."""
    parts = []
    for name in available_methods():
        cls = describe_method(name)  # the catalogue's: no method module (torch) is imported for --help
        if cls.presets:
            default = f", default {cls.default_preset}" if cls.default_preset else ""
            parts.append(f"{name}: {', '.join(cls.presets)}{default}")
    return "; ".join(parts)


def dive_field_help(name: str) -> str:
    """A DIVE config field's own help and default, so a flag that sets it says what the config does."""
    field = {f.name: f for f in dataclasses.fields(DIVEConfig)}[name]
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
    return f"{field.metadata.get('help', name).rstrip('.')} (DIVE's default: {default}; other methods: their own)"


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as config fields (``-`` in a key becomes ``_``; values parsed as JSON when they are)."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE (e.g. --set margin=0.4); got {pair!r}.")
        settings[key.strip().replace("-", "_")] = _parse_value(value.strip())
    return settings


def method_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The method's config fields given by ``--set``, ``--heads``, ``--epochs`` and ``--lr``."""
    settings = parse_settings(args.settings)
    if args.heads is not None:
        settings["heads"] = args.heads if args.heads == "auto" else int(args.heads)
    if args.epochs is not None:
        settings["epochs"] = args.epochs
    if args.lr is not None:
        settings["learning_rate"] = args.lr
    return settings


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}; got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}; got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (worded as the other ``compress`` types are)."""
    return _int_at_least(text, 1)


def finite_float(text: str) -> float:
    """argparse type: a finite number (no nan or inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number; got {text!r}")
    return value


def finite_float_or_none(text: str) -> float | None:
    """argparse type: a finite number, or ``none`` (a filter turned off)."""
    return None if text.strip().lower() == "none" else finite_float(text)


def positive_int_or_none(text: str) -> int | None:
    """argparse type: an integer >= 1, or ``none`` (a cap turned off)."""
    return None if text.strip().lower() == "none" else positive_int(text)


def add_label_flags(parser: argparse.ArgumentParser) -> None:
    """``--pairs`` / ``--qrels``: relevance labels for precomputed vectors, with no BEIR folder (no texts)."""
    group = parser.add_argument_group("labels for precomputed vectors (instead of a BEIR folder's qrels)")
    labels = group.add_mutually_exclusive_group()
    labels.add_argument("--pairs", dest="labels", default=None, metavar="FILE",
                        help='(query, relevant doc) pairs: JSONL lines {"query_id": "q1", "doc_id": "d7"} or TSV lines q1<TAB>d7; '
                        "needs --doc-embeddings/--doc-ids and --query-embeddings/--query-ids")
    labels.add_argument("--qrels", dest="labels", default=None, metavar="FILE", help="a BEIR qrels TSV (query-id, corpus-id, score)")
