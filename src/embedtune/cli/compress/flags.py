"""Flags and argparse types that several ``compress`` subcommands share, and the registry's help lines."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

from embedtune.cli.config_flags import add_config_flags, check_field_values, config_overrides, flag_fields, flag_name
from embedtune.compress import available_methods, describe_method, get_compressor_class
from embedtune.compress.dive.config import DIVEConfig  # torch-free: the config alone, not the method
from embedtune.compress.pca import PCAConfig, parse_fit_sample
from embedtune.compress.presets import SAFETY_NET_MINING, MiningOptions

__all__ = ["ADAPTER_HELP", "DIVE_FLAG_FIELDS", "DIVE_FLAG_ALIASES", "PCA_FLAG_FIELDS", "MINING_FLAG_FIELDS", "add_method_config_flags",
           "add_mining_flags", "mining_overrides", "mining_help", "method_help",
           "preset_help", "parse_settings", "method_settings", "add_label_flags"]

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


# DIVE's fields without a flag: the command's own flags set them (--dim; --seed or --seeds), the flag name is
# the encoder's (--batch-size: texts per encoding batch), or the global -q decides them (progress bars).
# --set still reaches every one of them.
_DIVE_FIELDS_WITHOUT_FLAGS = ("dim", "seed", "batch_size", "progress")
#: DIVE's config fields that ``compress train`` and ``compress fit`` take as flags, one each.
DIVE_FLAG_FIELDS = tuple(flag_fields(DIVEConfig, exclude=_DIVE_FIELDS_WITHOUT_FLAGS))
#: Flag names kept working where they differ from the generated one (documented in older commands).
DIVE_FLAG_ALIASES = {"learning_rate": ("--lr",)}
#: PCA's (pca, pca-uncentred) config fields taken as flags.
PCA_FLAG_FIELDS = ("fit_sample",)


def _fit_sample_value(text: str) -> int | str:
    """``--fit-sample``: ``auto``, ``all`` (read as 0) or a row count >= 0, read as PCAConfig reads it."""
    try:
        return parse_fit_sample(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _default_note(config_cls: type, method: str, presets: dict[str, dict[str, Any]]) -> Callable[[str, str], str]:
    """``(field, help) -> help + " (DIVE's default: 0.7; presets best, robust: 0.4)"``: the field's help, its dataclass
    default and the presets that differ."""
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
                for f in dataclasses.fields(config_cls)}

    def note(name: str, help_text: str) -> str:
        by_value: dict[str, list[str]] = {}
        for preset, values in presets.items():
            if name in values and values[name] != defaults[name]:
                by_value.setdefault(str(values[name]), []).append(preset)
        differing = "".join(f"; preset{'s' if len(names) > 1 else ''} {', '.join(names)}: {value}" for value, names in by_value.items())
        return f"{help_text} ({method}'s default: {defaults[name]}{differing})"

    return note


def add_method_config_flags(parser: argparse.ArgumentParser) -> None:
    """The compressor config fields ``compress train`` and ``compress fit`` take as flags, generated from the configs."""
    dive = parser.add_argument_group(
        "DIVE settings (DIVEConfig fields, one flag each)",
        "A flag given overrides the preset's value; one not given keeps it. With another --method, a flag sets that "
        "method's field of the same name (e.g. --epochs, --learning-rate) and is refused where it has none. "
        "Every other config field: --set FIELD=VALUE.")
    add_config_flags(dive, DIVEConfig, DIVE_FLAG_FIELDS, aliases=DIVE_FLAG_ALIASES,
                     help_text=_default_note(DIVEConfig, "DIVE", DIVEConfig.PRESETS))
    pca = parser.add_argument_group("PCA settings (pca, pca-uncentred: PCAConfig fields)")
    add_config_flags(pca, PCAConfig, PCA_FLAG_FIELDS, value_parsers={"fit_sample": _fit_sample_value},
                     help_text=_default_note(PCAConfig, "PCA", {}))


#: MiningOptions fields taken as flags, one each (every field).
MINING_FLAG_FIELDS = tuple(flag_fields(MiningOptions))
# A field's help ends with its dataclass default, "(default: VALUE)"; a flag states the command's default instead.
_STATED_DEFAULT = re.compile(r"\s*\(default: [^()]*\)$")


def mining_help(base: MiningOptions = SAFETY_NET_MINING, base_name: str = "the safety net of the default preset, robust",
                other: str = "the paper's plain mining, e.g. --preset paper") -> Callable[[str, str], str]:
    """``(field, help) -> help``: the field's help, then the value a command uses when the flag is left out (``base``'s,
    named ``base_name``) and, where it differs, MiningOptions' own default (the mining of ``other``)."""
    defaults = MiningOptions()

    def note(name: str, help_text: str) -> str:
        value, plain = getattr(base, name), getattr(defaults, name)
        stated = f"default: {value!r}" + (f", {base_name}; {plain!r} with {other}" if value != plain else "")
        return f"{_STATED_DEFAULT.sub('', help_text)} ({stated})"

    return note


def add_mining_flags(parser: argparse.ArgumentParser, help_text: Callable[[str, str], str] | None = None,
                     description: str = "A flag given overrides the preset's mining; one left out keeps it. "
                                        "'none' turns the false-negative filter or the cap off.") -> None:
    """The triplet-mining flags, one per :class:`MiningOptions` field, generated from it."""
    group = parser.add_argument_group("triplet mining (MiningOptions fields)", description)
    add_config_flags(group, MiningOptions, MINING_FLAG_FIELDS, help_text=help_text or mining_help())


def mining_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The mining fields whose flags were given, each checked by MiningOptions' declared constraints (before any encoding)."""
    return config_overrides(args, MiningOptions, MINING_FLAG_FIELDS)


def method_settings(args: argparse.Namespace, method: str) -> dict[str, Any]:
    """``method``'s config fields given by ``--set`` and by the generated flags (which win over ``--set``).

    A flag for a field ``method`` lacks is refused, naming the flag; every value of a field it has is
    checked against its config's declared constraints now, before any data is read.
    """
    settings = parse_settings(args.settings)
    flags = {**config_overrides(args, DIVEConfig, DIVE_FLAG_FIELDS, check=False),
             **config_overrides(args, PCAConfig, PCA_FLAG_FIELDS, check=False)}
    config_cls = get_compressor_class(method).config_class
    known = [f.name for f in dataclasses.fields(config_cls)]
    for name in flags:
        if name not in known:
            raise ValueError(f"{flag_name(name)} sets the config field {name!r}, which {method} does not have "
                             f"(its fields: {', '.join(known)}): drop {flag_name(name)}.")
    settings.update(flags)
    check_field_values(config_cls, {name: value for name, value in settings.items() if name in known})
    return settings


def add_label_flags(parser: argparse.ArgumentParser) -> None:
    """``--pairs`` / ``--qrels``: relevance labels for precomputed vectors, with no BEIR folder (no texts)."""
    group = parser.add_argument_group("labels for precomputed vectors (instead of a BEIR folder's qrels)")
    labels = group.add_mutually_exclusive_group()
    labels.add_argument("--pairs", dest="labels", default=None, metavar="FILE",
                        help='(query, relevant doc) pairs: JSONL lines {"query_id": "q1", "doc_id": "d7"} or TSV lines q1<TAB>d7; '
                        "needs --doc-embeddings/--doc-ids and --query-embeddings/--query-ids")
    labels.add_argument("--qrels", dest="labels", default=None, metavar="FILE", help="a BEIR qrels TSV (query-id, corpus-id, score)")
