"""Atomic file writes, safe weight I/O and config persistence shared by every module.

Every write goes to a temporary file in the destination folder and is then renamed over the
target, so a crash never leaves a half-written file behind (``os.replace`` is atomic on POSIX).

Files get the permissions the umask allows (``0666 & ~umask``), as ``open(path, "w")`` would:
the temporary file is created with :func:`os.open`, not :func:`tempfile.mkstemp` (which makes
every file ``0600``, unreadable to the other users of a shared model or index).

Every config dataclass (PACE configs, compressor configs) is saved and read by :func:`save_config`
and :func:`load_config`, in the PEFT way: indent 2, sorted keys, the embedtune version stamped in,
and keys written by another version dropped with a warning instead of crashing.

Integrity: a JSON file written by :func:`write_json_with_digest` carries the sha256 of its own
content, and :func:`read_json_verified` refuses it when one byte of the content changed;
:func:`verify_sha256` checks a file against a recorded digest before it is used.
:func:`check_version_stamp` warns about a file written by a newer embedtune (and refuses one of
a newer major version).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from embedtune import __version__
from embedtune.errors import EmbedtuneError, NoSpaceError

logger = logging.getLogger(__name__)

__all__ = [
    "release_mapped_pages",
    "IntegrityError",
    "DIGEST_KEY",
    "atomic_write",
    "add_write_observer",
    "notify_written",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_save_npy",
    "writing",
    "no_space_error",
    "OUT_SPACE_FIX",
    "sha256_file",
    "sha256_json",
    "verify_sha256",
    "xxh3_file",
    "xxh3_bytes",
    "FILE_DIGESTS",
    "verify_file_digest",
    "write_json_with_digest",
    "read_json_verified",
    "check_version_stamp",
    "older_than_installed",
    "current_umask",
    "save_weights",
    "load_weights",
    "VERSION_KEY",
    "config_from_dict",
    "save_config",
    "load_config",
]

VERSION_KEY = "embedtune_version"
T = TypeVar("T")


class IntegrityError(EmbedtuneError):
    """A file embedtune wrote no longer holds what it wrote (damaged, truncated or edited).

    An :class:`~embedtune.errors.EmbedtuneError`, so the command line prints it as one message; it names the file, the
    expected and the actual digest, and the fix.
    """


_umask_lock = threading.Lock()
_write_observers: list[Callable[[Path], None]] = []


def add_write_observer(observer: Callable[[Path], None]) -> None:
    """Call ``observer(path)`` after every :func:`atomic_write` has moved a file into place.

    :mod:`embedtune.outputs` records this way which files a command wrote into its ``--out``.
    """
    if observer not in _write_observers:
        _write_observers.append(observer)


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux ``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _umask_lock:  # os.umask can only be read by setting it: restore it at once
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _temporary_path(path: Path) -> tuple[int, Path]:
    """An exclusive new file next to ``path``, created with mode ``0666`` so the umask applies."""
    for _ in range(100):
        candidate = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666), candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"{path.parent}: could not create a temporary file next to {path.name}.")


def _only_owner_writes(folder: Path) -> bool:
    """Whether only this process's user can create files in ``folder`` (it owns it; neither group nor others may write)."""
    try:
        info = folder.stat()
    except OSError:
        return False
    return hasattr(os, "geteuid") and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _write_through(path: Path, writer: Callable[[Path], None]) -> Path:
    """``writer`` into a scratch file, whose bytes are then written into the device or pipe ``path`` (kept as it is)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="embedtune-") as scratch:
        tmp = Path(scratch) / (path.name or "out")
        writer(tmp)
        with open(tmp, "rb") as source, open(path, "wb") as target:
            shutil.copyfileobj(source, target)
    notify_written(path)
    return path


def atomic_write(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` and move the result to ``path`` atomically.

    The file gets the permissions the umask allows (``0666 & ~umask``), like any file a program opens.

    A ``path`` that exists and is neither a file nor a folder (``/dev/null``, a named pipe) is written through, never
    replaced: renaming a file over ``/dev/null`` as root would turn the machine's null device into a plain file.
    """
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        return _write_through(path, writer)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temporary_path(path)
    os.close(fd)
    if _only_owner_writes(path.parent):
        # No one else can create a file in the folder, so the reserved name is safe to leave free: the writer then
        # creates the file rather than truncating one, and ext4 starts the write-back of a truncated file's data
        # when it is closed (auto_da_alloc), which made writing a 150 MB index twice as slow.
        tmp.unlink()
    try:
        writer(tmp)
        if not tmp.exists():  # a writer that wrote nothing leaves an empty file, as it did in the reserved one
            tmp.touch()
        # Some writers replace the file with their own (safetensors makes it 0600): set the mode last.
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        named = no_space_error(error, path) if isinstance(error, Exception) else None
        if named is None or named is error:
            raise
        raise named from error
    notify_written(path)
    return path


# -- a full disk, named ---------------------------------------------------------------------------
#: The fix for a full disk under a command's ``--out``.
OUT_SPACE_FIX = "free space on that disk, or point --out at another disk, and run again"
_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# How the writers embedtune uses report a full disk without an errno: numpy's short write
# ("N requested and M written"), Rust's io::Error inside safetensors ("os error 28"), torch's zip writer.
_NO_SPACE_TEXT = ("requested and", "os error 28", "os error 122", "no space left", "disk quota", "file too large")


def no_space_error(error: BaseException, path: str | os.PathLike, fix: str = OUT_SPACE_FIX) -> NoSpaceError | None:
    """The :class:`~embedtune.errors.NoSpaceError` naming ``path`` when ``error`` is a full disk or quota, else None."""
    if isinstance(error, NoSpaceError):
        # Named already, by the write of one file: an enclosing block's own fix (e.g. EMBEDTUNE_CACHE) replaces the generic one.
        return NoSpaceError(error.path, error.reason, error.detail, fix) if error.fix == OUT_SPACE_FIX and fix != OUT_SPACE_FIX else error
    code = getattr(error, "errno", None)
    text = str(error)
    if code not in _NO_SPACE_ERRNOS and not any(part in text.lower() for part in _NO_SPACE_TEXT):
        return None
    reason = {errno.EDQUOT: "the disk quota is reached", errno.EFBIG: "the file would exceed a size limit"}.get(code, "the disk is full")
    detail = getattr(error, "strerror", None) or text
    return NoSpaceError(str(path), reason, detail, fix)


@contextlib.contextmanager
def writing(path: str | os.PathLike, fix: str = OUT_SPACE_FIX, staging: str | os.PathLike | None = None) -> Iterator[None]:
    """Turn a full disk or quota met inside the block into a :class:`~embedtune.errors.NoSpaceError` naming ``path`` and ``fix``.

    Any other error passes unchanged. ``path``: the file or folder being written. ``staging``: a
    temporary folder the block writes ``path``'s files into (moved in place at the end); a file
    named below it is named below ``path`` instead, where the user will look for it.
    """
    try:
        yield
    except Exception as error:  # noqa: BLE001 - only a full disk is renamed; the rest passes unchanged
        named = no_space_error(error, path, fix)
        if named is not None and staging is not None and Path(named.path).is_relative_to(staging):
            named = NoSpaceError(str(Path(path) / Path(named.path).relative_to(staging)), named.reason, named.detail, named.fix)
        if named is None or named is error:
            raise
        raise named from error.__cause__ if isinstance(error, NoSpaceError) else error


def notify_written(path: str | os.PathLike) -> None:
    """Tell the write observers that ``path`` was just written (a file moved into place without :func:`atomic_write`)."""
    for observer in _write_observers:
        observer(Path(path))


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


def verify_sha256(path: str | os.PathLike, expected: str, fix: str) -> None:
    """Raise :class:`IntegrityError` when ``path``'s sha256 is not ``expected``.

    ``fix`` completes the message: what recreates the file (e.g. "re-export the adapter").
    """
    verify_file_digest(path, "sha256", expected, fix)


def xxh3_file(path: str | os.PathLike, chunk_size: int = 1 << 22) -> str:
    """The XXH3-128 hex digest of a file, read in chunks: about 10 GB/s against sha256's 1.3 on one core.

    For the bulk data an index folder serves (FAISS codes, vectors), read in full before every
    search: it catches damaged and edited bytes as sha256 does, at a tenth of the cost. It is not a
    cryptographic hash; neither digest would stop someone who also rewrites the manifest beside it.
    """
    import xxhash

    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


def xxh3_bytes(data: Any) -> str:
    """The XXH3-128 hex digest of a bytes-like object (an array's buffer): :func:`xxh3_file` for data in memory."""
    import xxhash

    return xxhash.xxh3_128(data).hexdigest()


#: The file digests embedtune records, by the name a manifest stores them under.
FILE_DIGESTS: dict[str, Callable[[str | os.PathLike], str]] = {"sha256": sha256_file, "xxh3_128": xxh3_file}


def verify_file_digest(path: str | os.PathLike, algorithm: str, expected: str, fix: str) -> None:
    """Raise :class:`IntegrityError` when ``path``'s ``algorithm`` digest (a key of :data:`FILE_DIGESTS`) is not ``expected``.

    ``fix`` completes the message: what recreates the file (e.g. "re-export the adapter").
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found (it was recorded with {algorithm} {expected}). {fix}")
    actual = FILE_DIGESTS[algorithm](path)
    if actual != expected:
        raise IntegrityError(
            f"{path}: {algorithm} mismatch: expected {expected}, got {actual}; the file is damaged or was edited after it was written. {fix}"
        )


# -- JSON files that carry the digest of their own content ----------------------------------
DIGEST_KEY = "content_sha256"


def _looks_like_digest_key(key: str, value: Any) -> bool:
    """``key`` is :data:`DIGEST_KEY` with a few bytes overwritten, holding a 64-character string."""
    return (isinstance(value, str) and len(value) == 64 and len(key) == len(DIGEST_KEY)
            and sum(a != b for a, b in zip(key, DIGEST_KEY)) <= 4)


def sha256_json(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj`` (sorted keys, no whitespace), so layout does not count."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_json_with_digest(path: str | os.PathLike, obj: dict[str, Any]) -> Path:
    """:func:`atomic_write_json` of ``obj`` plus :data:`DIGEST_KEY`, the sha256 of the rest of it."""
    body = {key: value for key, value in obj.items() if key != DIGEST_KEY}
    return atomic_write_json(path, {**body, DIGEST_KEY: sha256_json(body)})


def read_json_verified(path: str | os.PathLike, fix: str, require_digest: bool = False) -> tuple[dict[str, Any], bool]:
    """Read a JSON object written by :func:`write_json_with_digest` and check its digest.

    Returns ``(obj, verified)``, ``obj`` without the digest field; ``verified`` is False for a
    file written before digests existed (no digest field), which ``require_digest`` refuses.
    Raises :class:`IntegrityError` (naming ``path`` and ending with ``fix``) on invalid UTF-8 or
    JSON, a non-object, or a digest that does not match the content.
    """
    path = Path(path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise IntegrityError(f"{path}: not UTF-8 text (byte {error.start}); the file is damaged. {fix}") from error
    except json.JSONDecodeError as error:
        raise IntegrityError(f"{path}: invalid JSON at line {error.lineno}, column {error.colno} ({error.msg}); the file is damaged. {fix}") from error
    if not isinstance(obj, dict):
        raise IntegrityError(f"{path}: expected a JSON object, found {type(obj).__name__}; the file is damaged. {fix}")
    expected = obj.pop(DIGEST_KEY, None)
    if expected is None:
        # Overwritten bytes in the digest's key still parse, under another name of the same length.
        renamed = [key for key, value in obj.items() if _looks_like_digest_key(key, value)]
        if require_digest or renamed:
            raise IntegrityError(f"{path}: the {DIGEST_KEY!r} field is missing or damaged. {fix}")
        return obj, False
    actual = sha256_json(obj)
    if actual != expected:
        raise IntegrityError(
            f"{path}: content sha256 mismatch: expected {expected}, got {actual}; the file is damaged or was edited. {fix}"
        )
    return obj, True


def _version_tuple(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def older_than_installed(stamp: Any) -> bool:
    """Whether ``stamp`` (a saved ``embedtune_version``) names an older embedtune than the installed one.

    Files of this version always carry their digests; only a file stamped by an older version may
    lack them (a missing or unreadable stamp is not older: its digests are required).
    """
    if not isinstance(stamp, str):
        return False
    saved, installed = _version_tuple(stamp), _version_tuple(__version__)
    return bool(saved) and bool(installed) and saved < installed


def check_version_stamp(stamp: Any, where: str) -> None:
    """Warn when ``stamp`` (a saved ``embedtune_version``) is newer than the installed embedtune.

    A newer major version is an error: its files may mean something this version cannot read.
    """
    if not isinstance(stamp, str):
        return
    saved, installed = _version_tuple(stamp), _version_tuple(__version__)
    if not saved or not installed or saved <= installed:
        return
    if saved[0] != installed[0]:
        raise ValueError(
            f"{where}: written by embedtune {stamp}, a newer major version than the installed embedtune {__version__}; "
            f"upgrade embedtune (pip install -U embedtune) to read it."
        )
    warnings.warn(
        f"{where}: written by embedtune {stamp}, newer than the installed embedtune {__version__}; "
        "settings it added are ignored. Upgrade embedtune to use them.",
        stacklevel=3,
    )


def _sort_safetensors_header(path: Path) -> None:
    """Rewrite ``path``'s safetensors header with sorted keys, in place.

    safetensors writes ``__metadata__`` in hash-map order, which varies between runs; sorted, two
    saves of the same tensors give the same bytes. The header keeps its length (same JSON, other
    order), so the tensor offsets stay valid.
    """
    with open(path, "r+b") as handle:
        size = int.from_bytes(handle.read(8), "little")
        raw = handle.read(size)
        text = raw.decode("utf-8")
        stripped = text.rstrip(" ")
        ordered = json.dumps(json.loads(stripped), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        encoded = ordered.encode("utf-8")
        if len(encoded) > size:  # another writer's spacing: leave the file as written
            return
        handle.seek(8)
        handle.write(encoded + b" " * (size - len(encoded)))


def save_weights(path: str | os.PathLike, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
    """Save a dict of torch tensors or numpy arrays to safetensors, atomically, with a sorted header.

    Equal tensors and metadata give byte-identical files.
    """
    if all(isinstance(value, np.ndarray) for value in tensors.values()):
        # numpy alone (the same bytes): saving a PCA does not import torch.
        from safetensors.numpy import save_file as save_numpy

        arrays = {name: np.ascontiguousarray(value) for name, value in tensors.items()}

        def write_arrays(tmp: Path) -> None:
            save_numpy(arrays, str(tmp), metadata=metadata)
            _sort_safetensors_header(tmp)

        return atomic_write(path, write_arrays)

    import torch
    from safetensors.torch import save_file

    contiguous = {
        name: (torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value.detach().cpu().contiguous())
        for name, value in tensors.items()
    }

    def write(tmp: Path) -> None:
        save_file(contiguous, str(tmp), metadata=metadata)
        _sort_safetensors_header(tmp)

    return atomic_write(path, write)


def load_weights(path: str | os.PathLike, as_numpy: bool = False) -> dict[str, Any]:
    """Load safetensors weights as torch tensors (``as_numpy``: numpy arrays, without importing torch); a bad file gets an error naming it."""
    from safetensors import SafetensorError

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: weights file not found. Pass the folder written by `save(dir)`.")
    try:
        if as_numpy:
            from safetensors.numpy import load_file as load_numpy

            try:
                return load_numpy(str(path))
            except TypeError:  # a dtype numpy lacks (bfloat16): read through torch, as float32
                from safetensors.torch import load_file

                return {name: value.float().numpy() for name, value in load_file(str(path)).items()}
        from safetensors.torch import load_file

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
    """Read a config saved by :func:`save_config`: from the file ``path``, or ``path/filename`` for a folder.

    A config written by a newer embedtune gets a warning naming both versions (an error for a newer major version).
    """
    path = Path(path)
    if path.is_dir():
        path = path / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {cls.__name__} here (it is written as {filename} next to the weights).")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: invalid JSON at line {error.lineno} ({error.msg}).") from error
    if isinstance(values, dict):
        check_version_stamp(values.get(VERSION_KEY), str(path))
    return config_from_dict(cls, values, where=str(path))


def release_mapped_pages(array: Any) -> bool:
    """Drop the pages of the memory-mapped file behind ``array`` from this process's resident memory; True if it had one.

    A read-only ``np.load(..., mmap_mode="r")`` array that was read through (a finiteness check, a sample, a block loop)
    keeps every page it touched counted in the process's RSS, a whole copy of the corpus. ``MADV_DONTNEED`` on a
    read-only file mapping only unmaps them: they stay in the page cache, and the next read maps them again, unchanged.
    Anything else (an in-memory array, a platform without ``madvise``) is left alone.
    """
    import mmap

    seen = 0
    while array is not None and seen < 8:
        mapping = getattr(array, "_mmap", None)
        if mapping is not None:
            if not hasattr(mapping, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
                return False
            try:
                mapping.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # a closed or unusual mapping: nothing to release
                return False
            return True
        array, seen = getattr(array, "base", None), seen + 1
    return False
