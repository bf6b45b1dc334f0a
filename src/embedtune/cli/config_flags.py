"""Command-line flags generated from a config dataclass, so a flag cannot drift from the field it sets.

Each field becomes one flag: ``hidden_dim`` is ``--hidden-dim``, its type comes from the annotation
(``int``, ``float``, ``str``, unions of them, ``X | None`` with ``none`` for None, ``bool`` as
``--flag/--no-flag``, ``list[X]`` as ``--flag a b c`` or ``--flag a,b,c``), its choices from a ``Literal`` annotation or the field's :class:`~embedtune.constraints.Options`
constraint, and its help from ``metadata["help"]``::

    group = parser.add_argument_group("DIVE settings")
    add_config_flags(group, DIVEConfig, fields=["margin", "hidden_dim"])
    ...
    overrides = config_overrides(args, DIVEConfig, fields=["margin", "hidden_dim"])  # only the flags given

A flag that is not given leaves no value in the namespace (``argparse.SUPPRESS``), so the config's,
or a preset's, value stays in place; ``None`` could not serve as "not given", because ``--hidden-dim none``
sets a field to None on purpose. Ranges are not checked here: the config's own constraints check a
value when the config is built, and :func:`config_overrides` applies them to the flags given at once,
so a bad value is refused before any work with the config's message, which names the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from embedtune.constraints import Options, collected_constraints, validate_constraints

__all__ = ["add_config_flags", "config_overrides", "check_field_values", "flag_fields", "flag_name", "field_help", "field_choices"]


def flag_name(field_name: str, prefix: str = "") -> str:
    """The flag of a field: ``hidden_dim`` -> ``--hidden-dim`` (``prefix='stage1-'``: ``--stage1-hidden-dim``)."""
    return f"--{prefix}{field_name.replace('_', '-')}"


def _dest(field_name: str, prefix: str) -> str:
    return f"{prefix.replace('-', '_')}{field_name}"


def flag_fields(config_cls: type, fields: Iterable[str] | None = None, exclude: Iterable[str] = ()) -> list[str]:
    """The fields of ``config_cls`` that get flags: ``fields`` (default: every field) less ``exclude``, in field order."""
    names = [f.name for f in dataclasses.fields(config_cls) if f.init]
    if fields is not None:
        wanted = list(fields)
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise ValueError(f"{config_cls.__name__} has no field {', '.join(map(repr, unknown))}; its fields: {', '.join(names)}.")
        names = [name for name in names if name in wanted]
    excluded = set(exclude)
    return [name for name in names if name not in excluded]


def field_help(config_cls: type, field_name: str) -> str:
    """The field's ``metadata["help"]`` (every config field has one: ``tests/test_config_declarations.py``)."""
    return {f.name: f for f in dataclasses.fields(config_cls)}[field_name].metadata["help"]


def field_choices(config_cls: type, field_name: str) -> list[Any] | None:
    """The values a field is limited to: its ``Literal`` annotation's, or those of its ``Options`` constraints
    when every constraint of the field is an ``Options`` (None included when None is allowed); else None."""
    annotation = typing.get_type_hints(config_cls)[field_name]
    literal = _literal_values(annotation)
    if literal is not None:
        return literal
    allowed = collected_constraints(config_cls).get(field_name)
    if not allowed or not all(rule is None or isinstance(rule, Options) for rule in allowed):
        return None
    values = [value for rule in allowed if rule is not None for value in rule.values]
    return values + ([None] if None in allowed and None not in values else [])


def _literal_values(annotation: Any) -> list[Any] | None:
    members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    literal = [value for member in members if typing.get_origin(member) is typing.Literal for value in typing.get_args(member)]
    if not literal:
        return None
    return literal + ([None] if type(None) in members else [])


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) is typing.Union or isinstance(annotation, types.UnionType)


def _value_parser(annotation: Any, field_name: str) -> Callable[[str], Any]:
    """How a flag's text becomes the field's value: each member type of the annotation in turn, ``none`` as None."""
    members = list(typing.get_args(annotation)) if _is_union(annotation) else [annotation]
    optional = type(None) in members
    kinds: list[type] = []
    for member in members:
        if typing.get_origin(member) is typing.Literal:
            kinds.extend(type(value) for value in typing.get_args(member))
        elif member in (int, float, str):
            kinds.append(member)
    # An integer's text is an int where the field takes ints, whatever the annotation's order ("2000" a step, not 2000.0).
    kinds = sorted(dict.fromkeys(kinds), key=[int, float, str].index) or [str]

    def parse(text: str) -> Any:
        if optional and text.strip().lower() == "none":
            return None
        for kind in kinds:
            try:
                return kind(text)
            except ValueError:
                continue
        expected = " or ".join({int: "an integer", float: "a number", str: "a string"}[kind] for kind in kinds)
        raise argparse.ArgumentTypeError(f"{field_name} expects {expected}{' or none' if optional else ''}; got {text!r}")

    # argparse names the type in "invalid <name> value" messages for a plain ValueError; ours raises its own.
    parse.__name__ = kinds[0].__name__ if len(kinds) == 1 and not optional else field_name
    return parse


class _ListValues(argparse.Action):
    """A ``list[X]`` field's flag: ``--flag a b c``, or ``--flag a,b,c`` (both may mix); ``--flag ''`` is the empty list."""

    def __init__(self, *args: Any, item_parser: Callable[[str], Any], **kwargs: Any) -> None:
        self.item_parser = item_parser
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        items = []
        for part in (part.strip() for value in values for part in str(value).split(",")):
            if part:
                try:
                    items.append(self.item_parser(part))
                except (argparse.ArgumentTypeError, ValueError) as error:
                    parser.error(f"argument {option_string}: {error}")
        setattr(namespace, self.dest, items)


def add_config_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    config_cls: type,
    fields: Iterable[str] | None = None,
    prefix: str = "",
    aliases: Mapping[str, Sequence[str]] | None = None,
    value_parsers: Mapping[str, Callable[[str], Any]] | None = None,
    help_text: Callable[[str, str], str] | None = None,
) -> list[argparse.Action]:
    """Add one flag per field of ``config_cls`` (``fields``: which; default all) to ``parser`` (or an argument group).

    Args:
        prefix: put before every flag name (and, with ``-`` as ``_``, every dest), for two configs of one class.
        aliases: ``{field: ["--old-name", ...]}``, flag names kept working beside the generated one.
        value_parsers: ``{field: parse}`` where text needs more than the annotation says (e.g. ``'all'`` read as 0);
            the config still validates what it returns.
        help_text: ``(field, the field's help) -> the flag's help``, where the command says more than the field (e.g.
            what a preset sets it to); default: the field's help as it is.

    Returns:
        The added actions; each one's dest is the field name (with the prefix) and its default ``SUPPRESS``.
    """
    hints = typing.get_type_hints(config_cls)
    actions = []
    for name in flag_fields(config_cls, fields):
        text = field_help(config_cls, name) if help_text is None else help_text(name, field_help(config_cls, name))
        option_strings = [flag_name(name, prefix), *(aliases or {}).get(name, ())]
        common: dict[str, Any] = {"dest": _dest(name, prefix), "default": argparse.SUPPRESS,
                                  "help": text.replace("%", "%%")}  # argparse %-formats help
        if hints[name] is bool:
            action = parser.add_argument(*option_strings, action=argparse.BooleanOptionalAction, **common)
        elif typing.get_origin(hints[name]) is list:
            parse = (value_parsers or {}).get(name) or _value_parser(typing.get_args(hints[name])[0], name)
            action = parser.add_argument(*option_strings, nargs="+", action=_ListValues, item_parser=parse, **common)
        else:
            parse = (value_parsers or {}).get(name) or _value_parser(hints[name], name)
            choices = field_choices(config_cls, name)
            metavar = None if choices is None else "{" + ",".join("none" if value is None else str(value) for value in choices) + "}"
            action = parser.add_argument(*option_strings, type=parse, choices=choices, metavar=metavar, **common)
        actions.append(action)
    return actions


def config_overrides(args: argparse.Namespace, config_cls: type, fields: Iterable[str] | None = None, prefix: str = "",
                     check: bool = True) -> dict[str, Any]:
    """The fields whose flags (from :func:`add_config_flags` with the same ``fields`` and ``prefix``) were given.

    With ``check``, each value is checked at once by :func:`check_field_values`; without, the caller checks
    them against the config they are for (a flag shared by several configs).
    """
    given = {name: getattr(args, _dest(name, prefix)) for name in flag_fields(config_cls, fields) if hasattr(args, _dest(name, prefix))}
    if check:
        check_field_values(config_cls, given)
    return given


def check_field_values(config_cls: type, values: Mapping[str, Any]) -> None:
    """Refuse the first value that its field's declared constraints do not accept, with the config's own
    message (``margin must be ...; got ...``), before any data is read; fields ``config_cls`` lacks are not
    checked here, and what relates two fields is checked when the config is built."""
    constraints = collected_constraints(config_cls)
    validate_constraints(argparse.Namespace(**values), {name: constraints[name] for name in values if name in constraints})
