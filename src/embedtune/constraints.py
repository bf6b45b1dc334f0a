"""Parameter constraints declared once, as data, and checked by one function (scikit-learn's idea).

A config lists what each field accepts next to the fields themselves::

    @dataclass
    class MyConfig:
        epochs: int = field(default=50, metadata={"help": "Passes over the data."})
        patience: int | None = field(default=None, metadata={"help": "Stop after this many epochs without gain."})
        init: str = field(default="pca", metadata={"help": "Start of the adapter."})

        _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
            "epochs": [Interval(int, 0, None)],
            "patience": [Interval(int, 1, None), None],
            "init": [Options(("pca", "identity"))],
        }

        def __post_init__(self) -> None:
            validate_constraints(self)

A value passes when any constraint of its list accepts it (``None`` in the list accepts None).
The error names the field, every accepted form and the value: ``patience must be a positive
integer or None; got 0.`` A form that means something particular says so with ``means``
(``Options((0,), means="skip the stage")`` reads ``0 (skip the stage)``), and a nested config is
an :class:`Instance`. Only what relates two fields stays hand-written in ``__post_init__``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Union

__all__ = ["Constraint", "Instance", "Interval", "Options", "Text", "validate_constraints", "collected_constraints"]


@dataclass(frozen=True)
class Interval:
    """A number in ``[left, right]`` (``None``: unbounded); ``closed`` says which ends belong.

    ``kind`` is ``int`` (booleans refused) or ``float`` (any finite real, ints included); ``means``,
    when given, follows the range in the error (what such a number stands for).
    """

    kind: type
    left: float | None
    right: float | None
    closed: str = "both"  # "both", "left", "right" or "neither"
    means: str = ""

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind is int:
            if not isinstance(value, int):
                return False
        elif not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.left is not None and (value < self.left or (value == self.left and self.closed in ("right", "neither"))):
            return False
        if self.right is not None and (value > self.right or (value == self.right and self.closed in ("left", "neither"))):
            return False
        return True

    def describe(self) -> str:
        return _with_meaning(self._range(), self.means)

    def _range(self) -> str:
        if self.kind is int:
            if self.left is None and self.right is None:
                return "an integer"
            if self.left == 1 and self.right is None and self.closed in ("both", "left"):
                return "a positive integer"
            if self.right is None:
                return f"an integer {'>=' if self.closed in ('both', 'left') else '>'} {self.left:g}"
            return f"an integer in {self._bounds()}"
        if self.left is not None and self.right is None:
            return f"a finite number {'>=' if self.closed in ('both', 'left') else '>'} {self.left:g}"
        if self.left is None and self.right is None:
            return "a finite number"
        return f"a number in {self._bounds()}"

    def _bounds(self) -> str:
        left = "[" if self.closed in ("both", "left") else "("
        right = "]" if self.closed in ("both", "right") else ")"
        return f"{left}{'-inf' if self.left is None else f'{self.left:g}'}, {'inf' if self.right is None else f'{self.right:g}'}{right}"


@dataclass(frozen=True)
class Options:
    """One of a fixed set of values (compared with ``==``, booleans never standing in for 0 and 1).

    ``means``, when given, follows the values in the error: ``Options((None,), means="no limit")``
    reads ``None (no limit)``.
    """

    values: tuple[Any, ...]
    means: str

    def __init__(self, values: Iterable[Any], means: str = "") -> None:
        object.__setattr__(self, "values", tuple(values))
        object.__setattr__(self, "means", means)

    def accepts(self, value: Any) -> bool:
        return any(value == option and isinstance(value, bool) == isinstance(option, bool) for option in self.values)

    def describe(self) -> str:
        return _with_meaning(repr(self.values[0]) if len(self.values) == 1 else f"one of {list(self.values)}", self.means)


@dataclass(frozen=True)
class Text:
    """A non-empty string; ``what`` says what it names in the error (e.g. a torch device such as 'cpu')."""

    what: str = "a non-empty string"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and bool(value)

    def describe(self) -> str:
        return self.what


@dataclass(frozen=True)
class Instance:
    """An instance of ``kind``, such as a nested config; ``what`` names it in the error (default: ``a <kind>``)."""

    kind: type
    what: str = ""

    def accepts(self, value: Any) -> bool:
        return isinstance(value, self.kind)

    def describe(self) -> str:
        return self.what or f"a {self.kind.__name__}"


Constraint = Union[Interval, Options, Text, Instance, None]


def _with_meaning(form: str, means: str) -> str:
    return f"{form} ({means})" if means else form


def collected_constraints(cls: type) -> dict[str, list[Constraint]]:
    """The ``_parameter_constraints`` of ``cls`` and its bases, a subclass's entry replacing its base's."""
    merged: dict[str, list[Constraint]] = {}
    for klass in reversed(cls.__mro__):
        merged.update(vars(klass).get("_parameter_constraints", {}))
    return merged


def validate_constraints(obj: Any, constraints: dict[str, list[Constraint]] | None = None) -> None:
    """Raise ``ValueError`` naming the first field of ``obj`` that no constraint of its list accepts."""
    for name, allowed in (constraints if constraints is not None else collected_constraints(type(obj))).items():
        value = getattr(obj, name)
        if any(value is None if rule is None else rule.accepts(value) for rule in allowed):
            continue
        forms = " or ".join("None" if rule is None else rule.describe() for rule in allowed)
        raise ValueError(f"{name} must be {forms}; got {value!r}.")
