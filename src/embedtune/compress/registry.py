"""Compressors by name, as used by ``--method``.

Each method module registers its class with :func:`register`; importing
``embedtune.compress`` imports them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embedtune.compress.base import Compressor, read_compressor_meta

__all__ = ["register", "get_compressor_class", "available_methods", "make_compressor", "load_compressor"]

_REGISTRY: dict[str, type[Compressor]] = {}


def register(cls: type[Compressor]) -> type[Compressor]:
    if cls.method in _REGISTRY and _REGISTRY[cls.method] is not cls:
        raise ValueError(f"compressor method {cls.method!r} is registered twice.")
    _REGISTRY[cls.method] = cls
    return cls


def available_methods() -> list[str]:
    return list(_REGISTRY)


def get_compressor_class(method: str) -> type[Compressor]:
    try:
        return _REGISTRY[method]
    except KeyError:
        raise ValueError(f"unknown compression method {method!r}; choose one of: {', '.join(_REGISTRY)}.") from None


def make_compressor(method: str, **config_values: Any) -> Compressor:
    """Build a compressor by registry name; keyword arguments go to its config dataclass."""
    cls = get_compressor_class(method)
    return cls(cls.config_class(**config_values))


def load_compressor(directory: str | Path) -> Compressor:
    """Load any saved compressor; the method is read from its ``config.json``."""
    meta = read_compressor_meta(Path(directory))
    return get_compressor_class(meta["method"]).load(directory)
