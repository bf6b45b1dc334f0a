"""Atomic file writes, safe weight I/O and config persistence shared by every module.

Every write goes to a temporary file in the destination folder and is then renamed over the
target, so a crash never leaves a half-written file behind (``os.replace`` is atomic on POSIX).

Every config dataclass (PACE configs, compressor configs) is saved and read by :func:`save_config`
and :func:`load_config`, in the PEFT way: indent 2, sorted keys, the embedtune version stamped in,
and keys written by another version dropped with a warning instead of crashing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from embedtune import __version__

__all__ = [
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_save_npy",
    "sha256_file",
    "save_weights",
    "load_weights",
    "VERSION_KEY",
    "config_from_dict",
    "save_config",
    "load_config",
]

VERSION_KEY = "embedtune_version"
T = TypeVar("T")


def atomic_write(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` and move the result to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write JSON with sorted keys and a trailing newline, so equal objects give equal bytes."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save_npy(path: str | os.PathLike, array: np.ndarray) -> Path:
    def _write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.save(handle, array, allow_pickle=False)

    return atomic_write(path, _write)


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


def save_weights(path: str | os.PathLike, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
    """Save a dict of torch tensors or numpy arrays to safetensors, atomically."""
    import torch
    from safetensors.torch import save_file

    contiguous = {
        name: (torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value.detach().cpu().contiguous())
        for name, value in tensors.items()
    }
    return atomic_write(path, lambda tmp: save_file(contiguous, str(tmp), metadata=metadata))


def load_weights(path: str | os.PathLike) -> dict[str, Any]:
    """Load safetensors weights as torch tensors; a bad file gets an error naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: weights file not found. Pass the folder written by `save(dir)`.")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(
            f"{path}: not a readable safetensors file ({error}). The file is corrupted or foreign; "
            "re-create it with the estimator's `save(dir)`."
        ) from error


def _dataclass_of(annotation: Any) -> type | None:
    """The dataclass an annotation names: ``Stage``, ``Stage | None`` or ``Optional[Stage]``."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        classes = [arg for arg in typing.get_args(annotation) if dataclasses.is_dataclass(arg)]
        return classes[0] if len(classes) == 1 else None
    return None


def config_from_dict(cls: type[T], values: dict[str, Any], where: str | None = None) -> T:
    """Build the dataclass ``cls`` from a saved dict.

    The version stamp is ignored; keys ``cls`` does not know (written by another embedtune version)
    are dropped with a warning; a dict under a field annotated with a dataclass (``StageConfig``,
    ``StageConfig | None``) is built the same way, recursively. A class with a classmethod
    ``migrate(values) -> values`` gets to rename the keys of older releases first.
    """
    where = where or cls.__name__
    migrate = getattr(cls, "migrate", None)
    if callable(migrate):
        values = migrate(dict(values))
    known = {item.name: item for item in dataclasses.fields(cls) if item.init}
    values = {key: value for key, value in values.items() if key != VERSION_KEY}
    unknown = sorted(set(values) - set(known))
    if unknown:
        warnings.warn(f"{where}: ignoring unknown config keys {unknown} (saved by another embedtune version?)", stacklevel=2)
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation that names a type-checking-only import: no nesting then
        hints = {}
    kwargs = {}
    for name, value in values.items():
        if name not in known:
            continue
        nested = _dataclass_of(hints.get(name))
        if nested is not None and isinstance(value, dict):
            value = config_from_dict(nested, value, where=f"{where}.{name}")
        kwargs[name] = value
    return cls(**kwargs)


def save_config(config: Any, directory: str | os.PathLike, filename: str = "config.json") -> Path:
    """Write the dataclass ``config`` to ``directory/filename`` (indent 2, sorted keys, version stamped)."""
    return atomic_write_json(Path(directory) / filename, {**dataclasses.asdict(config), VERSION_KEY: __version__})


def load_config(cls: type[T], path: str | os.PathLike, filename: str = "config.json") -> T:
    """Read a config saved by :func:`save_config`: from the file ``path``, or ``path/filename`` for a folder."""
    path = Path(path)
    if path.is_dir():
        path = path / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {cls.__name__} here (it is written as {filename} next to the weights).")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: invalid JSON at line {error.lineno} ({error.msg}).") from error
    return config_from_dict(cls, values, where=str(path))
