"""Compressors by name, as used by ``--method``.

Each method module registers its class with :func:`register`. A built-in method's module is
imported when its class is first asked for (:func:`get_compressor_class`, :func:`load_compressor`),
not before: a command that only applies a PCA never imports torch. What lists methods without
their classes (the CLI help) reads :func:`describe_method`, served by
:mod:`embedtune.compress.catalog` for a built-in method not yet imported. A new built-in method is
its module ending with ``@register`` on its class plus one catalogue entry (a plug-in needs only
the ``@register``).
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

from embedtune.compress.base import CONFIG_NAME, Compressor, read_compressor_meta
from embedtune.compress.catalog import BUILTIN_METHODS, MethodEntry
from embedtune.io import IntegrityError

__all__ = [
    "register", "unregister", "get_compressor_class", "available_methods", "unsupervised_methods", "make_compressor",
    "load_compressor", "find_compressor_dir", "describe_method", "load_all_methods",
]

_REGISTRY: dict[str, type[Compressor]] = {}
_BUILTIN: dict[str, MethodEntry] = {entry.method: entry for entry in BUILTIN_METHODS}
_UNREGISTERED: set[str] = set()  # built-in methods a caller removed: listed no more, imported no more


def _entry_of(cls: type[Compressor]) -> MethodEntry:
    return MethodEntry(cls.method, cls.__module__, cls.help, bool(cls.supervised), bool(cls.supports_unsupervised),
                       tuple(cls.presets), cls.default_preset)


def register(cls: type[Compressor]) -> type[Compressor]:
    """Add ``cls`` under ``cls.method`` (a class decorator); its traits are checked here."""
    method = getattr(cls, "method", None)
    if not isinstance(method, str) or not method:
        raise TypeError(f"{cls.__name__} needs a class attribute method = '<name>' to be registered.")
    if method in _REGISTRY and _REGISTRY[method] is not cls:
        raise ValueError(f"compressor method {method!r} is registered twice.")
    if not isinstance(cls.lr_candidates, tuple):
        raise TypeError(f"{cls.__name__}.lr_candidates must be a tuple of learning rates; got {cls.lr_candidates!r}.")
    if cls.default_preset is not None and cls.default_preset not in cls.presets:
        raise ValueError(f"{cls.__name__}.default_preset {cls.default_preset!r} is not one of its presets {sorted(cls.presets)}.")
    if cls.unsupervised_preset is not None and (not cls.supports_unsupervised or cls.unsupervised_preset not in cls.presets):
        raise ValueError(f"{cls.__name__}.unsupervised_preset {cls.unsupervised_preset!r} needs supports_unsupervised = True "
                         f"and a preset of that name; its presets: {sorted(cls.presets)}.")
    if cls.unsupervised_text_preset is not None and (cls.unsupervised_preset is None or cls.unsupervised_text_preset not in cls.presets):
        raise ValueError(f"{cls.__name__}.unsupervised_text_preset {cls.unsupervised_text_preset!r} needs an unsupervised_preset "
                         f"to fall back on and a preset of that name; its presets: {sorted(cls.presets)}.")
    if cls.wide_output_settings:
        fields = {f.name for f in dataclasses.fields(cls.config_class)}
        unknown = sorted(set(cls.wide_output_settings) - fields)
        if unknown:
            raise ValueError(f"{cls.__name__}.wide_output_settings sets {unknown}, which are not fields of "
                             f"{cls.config_class.__name__}; its fields: {sorted(fields)}.")
    builtin = _BUILTIN.get(method)
    if builtin is not None and builtin.module == cls.__module__ and _entry_of(cls) != builtin:
        raise ValueError(f"{cls.__name__} disagrees with its entry in embedtune.compress.catalog (what --help says without "
                         f"importing it): the class says {_entry_of(cls)}, the catalogue {builtin}; make them agree.")
    _REGISTRY[method] = cls
    _UNREGISTERED.discard(method)
    return cls


def unregister(method: str) -> None:
    """Remove ``method`` from the registry (e.g. a plug-in or a test's toy method)."""
    _REGISTRY.pop(method, None)
    if method in _BUILTIN:
        _UNREGISTERED.add(method)


def available_methods() -> list[str]:
    """Method names: the built-in ones in catalogue order, then the others in registration order (the order reports list them)."""
    names = [name for name in _BUILTIN if name not in _UNREGISTERED]
    return names + [name for name in _REGISTRY if name not in _BUILTIN]


def describe_method(method: str) -> MethodEntry:
    """``method``'s help line and traits, without importing a built-in method's module that is not loaded yet."""
    if method in _REGISTRY:
        return _entry_of(_REGISTRY[method])
    if method in _BUILTIN and method not in _UNREGISTERED:
        return _BUILTIN[method]
    raise ValueError(f"unknown compression method {method!r}; choose one of: {', '.join(available_methods())}.")


def unsupervised_methods() -> list[str]:
    """Methods that can fit on corpus vectors alone (``supports_unsupervised``)."""
    return [name for name in available_methods() if describe_method(name).supports_unsupervised]


def get_compressor_class(method: str) -> type[Compressor]:
    """The class registered as ``method``; a built-in method's module is imported on first use."""
    if method not in _REGISTRY and method in _BUILTIN and method not in _UNREGISTERED:
        importlib.import_module(_BUILTIN[method].module)
    try:
        return _REGISTRY[method]
    except KeyError:
        raise ValueError(f"unknown compression method {method!r}; choose one of: {', '.join(available_methods())}.") from None


def load_all_methods() -> dict[str, type[Compressor]]:
    """Every available method's class (imports every built-in method's module, torch with them)."""
    return {name: get_compressor_class(name) for name in available_methods()}


def make_compressor(method: str, **config_values: Any) -> Compressor:
    """Build a compressor by registry name; keyword arguments go to its config dataclass."""
    cls = get_compressor_class(method)
    return cls(cls.config_class(**config_values))


def find_compressor_dir(directory: str | Path) -> Path:
    """The saved compressor in ``directory``: the folder itself, or the one fitted compressor below it.

    ``compress train --out OUT`` saves to ``OUT/<method>/`` (one seed) or
    ``OUT/<method>/seed-N/``, so ``OUT`` itself is accepted when it holds exactly one.
    """
    directory = Path(directory)
    if (directory / CONFIG_NAME).is_file() or not directory.is_dir():
        return directory  # read_compressor_meta names a missing folder or config
    found = sorted(path.parent for depth in ("*", "*/*") for path in directory.glob(f"{depth}/{CONFIG_NAME}") if _is_compressor(path.parent))
    if len(found) == 1:
        return found[0]
    if not found:
        raise FileNotFoundError(f"{directory}: no fitted compressor here or in its sub-folders; pass a folder written by `save(dir)`.")
    choices = ", ".join(str(path) for path in found)
    raise ValueError(f"{directory} holds {len(found)} fitted compressors; pick one: {choices}.")


def _is_compressor(directory: Path) -> bool:
    try:
        read_compressor_meta(directory)
    except IntegrityError:
        return True  # a damaged compressor config: loading it names the damage
    except (ValueError, FileNotFoundError):
        return False  # e.g. a transformers config.json inside an exported model
    return True


def load_compressor(directory: str | Path) -> Compressor:
    """Load any saved compressor; the method is read from its ``config.json``.

    ``directory`` may also be a ``compress train --out`` folder holding exactly one fitted
    compressor (see :func:`find_compressor_dir`).
    """
    directory = find_compressor_dir(directory)
    meta = read_compressor_meta(directory)
    return get_compressor_class(meta["method"]).load(directory)
