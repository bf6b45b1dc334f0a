"""What embedtune keeps in its user cache, and removing what has not been used for a while.

The cache (``$EMBEDTUNE_CACHE``, else ``~/.cache/embedtune``) grows with every corpus, model and
plan: encoded corpora (``embeddings/``), exported ONNX graphs (``onnx/``), the fits of plan sweeps
(``plan-sweeps/``) and models unpacked from their packages (``models/``). Nothing in it is ever
the only copy: every entry is rebuilt on its next use. :func:`cache_usage` lists it by kind;
:func:`prune_cache` removes the entries not used for a number of days. An entry's last use is the
newest mtime of its folder, its lock file and its top-level files: a cache hit touches the entry,
a plan touches its sweep's lock. An entry whose lock a running process holds is never removed.

Only what the cache recorded writing is removed: an encoded corpus or an ONNX graph whose
``meta.json`` names its own key (the folder's name), or an encode cut short (only ``partial/``,
beside its lock); a sweep folder holding its ``.lock``; a model folder whose ``.complete`` names the
key in its folder's name. Anything else found there (a folder the user put under ``models/``, say)
is listed as not embedtune's and kept, and so is every symbolic link: the kind folder, a prefix
folder or an entry that is a link is never followed, and removing an entry never follows a link
inside it.
"""

from __future__ import annotations

import json
import os
import shutil
import string
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from embedtune.encoders.paths import cache_root
from embedtune.locks import lock_if_free
from embedtune.workflows.plan import SWEEP_CACHE, SWEEP_LOCK

__all__ = ["CACHE_KINDS", "CacheEntry", "PruneResult", "cache_entries", "cache_usage", "prune_cache"]

#: Kind -> (folder under the cache root, entries nested by a two-character key prefix).
CACHE_KINDS: dict[str, tuple[str, bool]] = {
    "embeddings": ("embeddings", True),
    "onnx": ("onnx", True),
    "plan-sweeps": (SWEEP_CACHE, False),
    "models": ("models", False),
}


@dataclass(frozen=True)
class CacheEntry:
    """One entry of the cache: its kind, folder, size on disk, last use (epoch seconds) and lock file.

    ``foreign`` says why embedtune does not take the folder for an entry it wrote (empty when it
    does): such a folder is listed, never removed.
    """

    kind: str
    path: Path
    bytes: int
    last_used: float
    lock: Path | None
    foreign: str = ""

    @property
    def age_days(self) -> float:
        return max(0.0, (time.time() - self.last_used) / 86400.0)


_LINK = "a symbolic link (the cache never writes one; nothing is removed through it)"


def _size(folder: Path) -> int:
    if folder.is_symlink():
        return 0
    total = 0
    for root, _, files in os.walk(folder):  # links are not followed
        for name in files:
            path = Path(root) / name
            try:
                if not path.is_symlink():
                    total += path.stat().st_size
            except OSError:  # removed meanwhile
                continue
    return total


def _last_used(folder: Path, lock: Path | None) -> float:
    if folder.is_symlink():
        return folder.lstat().st_mtime
    stamps = [folder]
    if lock is not None:
        stamps.append(lock)
    stamps += [p for p in folder.iterdir() if p.is_file() and not p.is_symlink()] if folder.is_dir() else []
    return max((p.stat().st_mtime for p in stamps if p.exists()), default=0.0)


#: What an embeddings or ONNX entry holds before its meta.json is written (the entry's own files so far).
_PARTIAL_NAMES = {"embeddings": {"partial", "embeddings.npy", "ids.json"}, "onnx": {"model.onnx"}}


def _is_temporary(name: str) -> bool:
    """A temporary file of :func:`embedtune.io.atomic_write` (``.<name>.<hex>.tmp``), left by a killed write."""
    return name.startswith(".") and name.endswith(".tmp")


def _is_hex(name: str) -> bool:
    return bool(name) and all(c in string.hexdigits for c in name)


def _is_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _recorded_key(meta_path: Path) -> object:
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return meta.get("key") if isinstance(meta, dict) else None


def _not_written_by_the_cache(kind: str, folder: Path, lock: Path | None) -> str:
    """Why ``folder`` is not an entry the cache recorded writing ("" when it is one)."""
    if folder.is_symlink():
        return _LINK
    if kind in ("embeddings", "onnx"):
        if not _is_hex(folder.name) or folder.parent.name != folder.name[:2]:
            return "its name is not a cache key"
        meta = folder / "meta.json"
        if _is_file(meta):
            return "" if _recorded_key(meta) == folder.name else "its meta.json does not name this entry's key"
        # An entry cut short (an encode's shards so far, or a store stopped before its meta.json), beside its lock.
        partial_names = _PARTIAL_NAMES[kind]
        leftovers = [p for p in folder.iterdir() if not _is_temporary(p.name)]
        if (lock is not None and _is_file(lock) and all(p.name in partial_names and not p.is_symlink() for p in leftovers)):
            return ""
        return "it has no meta.json naming its key"
    if kind == "plan-sweeps":
        return "" if _is_hex(folder.name) and lock is not None and _is_file(lock) else "it holds no sweep lock (.lock)"
    complete = folder / ".complete"  # models: unpacked by embedtune, whose .complete names the key in the folder's name
    try:
        recorded = complete.read_text(encoding="utf-8").strip() if _is_file(complete) else ""
    except (OSError, UnicodeDecodeError):
        recorded = ""
    if recorded and folder.name.endswith(f"-{recorded}"):
        return ""
    return "it has no .complete record naming its key (embedtune did not unpack it)"


def _entry_folders(kind: str, root: Path) -> Iterator[tuple[Path, Path | None, str]]:
    """``(folder, lock, why it is not the cache's own or "")`` for every folder where an entry of ``kind`` would be."""
    name, nested = CACHE_KINDS[kind]
    base = root / name
    if base.is_symlink():
        yield base, None, _LINK
        return
    if not base.is_dir():
        return
    parents = sorted(p for p in base.iterdir() if p.is_dir() or p.is_symlink()) if nested else [base]
    for parent in parents:
        if parent.is_symlink():
            yield parent, None, _LINK
            continue
        for folder in sorted(p for p in parent.iterdir() if (p.is_dir() or p.is_symlink()) and not p.name.startswith(".")):
            if folder.is_symlink() and not folder.is_dir():
                yield folder, None, _LINK  # a link to a file or to nothing, named like an entry
                continue
            if kind in ("embeddings", "onnx"):
                lock: Path | None = parent / f"{folder.name}.lock"
            elif kind == "plan-sweeps":
                lock = folder / SWEEP_LOCK
            else:
                lock = None
            yield folder, lock, _not_written_by_the_cache(kind, folder, lock)


def cache_entries(kinds: Sequence[str] | None = None, root: str | Path | None = None) -> list[CacheEntry]:
    """Every entry of the cache of ``kinds`` (default: all of :data:`CACHE_KINDS`), oldest use first."""
    root = Path(root) if root is not None else cache_root()
    kinds = list(kinds) if kinds else list(CACHE_KINDS)
    unknown = sorted(set(kinds) - set(CACHE_KINDS))
    if unknown:
        raise ValueError(f"unknown cache kind(s) {unknown}; choose from {', '.join(CACHE_KINDS)}.")
    entries = []
    for kind in kinds:
        for folder, lock, foreign in _entry_folders(kind, root):
            try:
                entries.append(CacheEntry(kind, folder, _size(folder), _last_used(folder, lock), lock, foreign))
            except OSError:  # removed while being listed
                continue
    return sorted(entries, key=lambda e: e.last_used)


def cache_usage(root: str | Path | None = None) -> list[dict[str, object]]:
    """One row per kind: entries, bytes, days since the oldest and the newest use, and the folder."""
    root = Path(root) if root is not None else cache_root()
    rows = []
    for kind, (name, _) in CACHE_KINDS.items():
        entries = cache_entries([kind], root)
        rows.append({"kind": kind, "entries": len(entries), "bytes": sum(e.bytes for e in entries),
                     "oldest_use_days": round(max((e.age_days for e in entries), default=0.0), 1),
                     "newest_use_days": round(min((e.age_days for e in entries), default=0.0), 1),
                     "folder": str(root / name)})
    return rows


class PruneResult(NamedTuple):
    """What :func:`prune_cache` did: ``removed``, kept as ``in_use`` by a running process, kept as ``foreign`` (not embedtune's)."""

    removed: list[CacheEntry]
    in_use: list[CacheEntry]
    foreign: list[CacheEntry]


def prune_cache(older_than_days: float, kinds: Sequence[str] | None = None, dry_run: bool = False,
                root: str | Path | None = None) -> PruneResult:
    """Remove the entries of ``kinds`` last used more than ``older_than_days`` ago; ``(removed, in_use, foreign)``.

    Only entries the cache recorded writing are removed (see the module's docstring); a folder
    that is not one, or a link, is kept and returned in ``foreign`` (with ``CacheEntry.foreign``
    saying why). An entry is removed while holding its lock, taken only if free: an entry a running
    process holds (an encode, an export, a plan's sweep) is skipped and returned as in use. A reader
    of an entry being removed keeps its open files (POSIX), and the next use rebuilds it. With
    ``dry_run`` nothing is removed.
    """
    if older_than_days < 0:
        raise ValueError(f"older_than_days must be >= 0; got {older_than_days}.")
    cutoff = time.time() - older_than_days * 86400.0
    removed, in_use, foreign = [], [], []
    for entry in cache_entries(kinds, root):
        if entry.last_used > cutoff:
            continue
        if entry.foreign:
            foreign.append(entry)
            continue
        if entry.lock is None:
            if not dry_run:
                _remove_entry(entry)
            removed.append(entry)
            continue
        with lock_if_free(entry.lock) as free:
            if not free:
                in_use.append(entry)
                continue
            if not dry_run:
                _remove_entry(entry)
                entry.lock.unlink(missing_ok=True)
        removed.append(entry)
    return PruneResult(removed, in_use, foreign)


def _remove_entry(entry: CacheEntry) -> None:
    """Remove an entry's folder; links inside it are removed as links (``rmtree`` never follows them)."""
    if entry.path.is_symlink():  # checked when listed; a link put there since is not followed either
        return
    shutil.rmtree(entry.path, ignore_errors=True)
