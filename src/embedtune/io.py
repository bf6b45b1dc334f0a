"""Atomic file writes and safe weight I/O shared by every module.

Every write goes to a temporary file in the destination folder and is then renamed over the
target, so a crash never leaves a half-written file behind (``os.replace`` is atomic on POSIX).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = [
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_save_npy",
    "sha256_file",
    "save_weights",
    "load_weights",
]


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
