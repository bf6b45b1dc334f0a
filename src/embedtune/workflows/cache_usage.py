"""What embedtune keeps in its user cache, and removing what has not been used for a while.

The cache (``$EMBEDTUNE_CACHE``, else ``~/.cache/embedtune``) grows with every corpus, model and
plan: encoded corpora (``embeddings/``), exported ONNX graphs (``onnx/``), the fits of plan sweeps
(``plan-sweeps/``) and models unpacked from their packages (``models/``). Nothing in it is ever
the only copy: every entry is rebuilt on its next use. :func:`cache_usage` lists it by kind;
:func:`prune_cache` removes the entries not used for a number of days. An entry's last use is the
newest mtime of its folder, its lock file and its top-level files: a cache hit touches the entry,
a plan touches its sweep's lock. An entry whose lock a running process holds is never removed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from embedtune.encoders.paths import cache_root
from embedtune.locks import lock_if_free
from embedtune.workflows.plan import SWEEP_CACHE, SWEEP_LOCK

__all__ = ["CACHE_KINDS", "CacheEntry", "cache_entries", "cache_usage", "prune_cache"]

#: Kind -> (folder under the cache root, entries nested by a two-character key prefix).
CACHE_KINDS: dict[str, tuple[str, bool]] = {
    "embeddings": ("embeddings", True),
    "onnx": ("onnx", True),
    "plan-sweeps": (SWEEP_CACHE, False),
    "models": ("models", False),
}


@dataclass(frozen=True)
class CacheEntry:
    """One entry of the cache: its kind, folder, size on disk, last use (epoch seconds) and lock file."""

    kind: str
    path: Path
    bytes: int
    last_used: float
    lock: Path | None

    @property
    def age_days(self) -> float:
        return max(0.0, (time.time() - self.last_used) / 86400.0)


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:  # removed meanwhile
            continue
    return total


def _last_used(folder: Path, lock: Path | None) -> float:
    stamps = [folder]
    if lock is not None:
        stamps.append(lock)
    stamps += [p for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
    return max((p.stat().st_mtime for p in stamps if p.exists()), default=0.0)


def _entry_folders(kind: str, root: Path) -> Iterator[tuple[Path, Path | None]]:
    name, nested = CACHE_KINDS[kind]
    base = root / name
    if not base.is_dir():
        return
    parents = sorted(p for p in base.iterdir() if p.is_dir()) if nested else [base]
    for parent in parents:
        for folder in sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if kind in ("embeddings", "onnx"):
                yield folder, parent / f"{folder.name}.lock"
            elif kind == "plan-sweeps":
                yield folder, folder / SWEEP_LOCK
            else:
                yield folder, None


def cache_entries(kinds: Sequence[str] | None = None, root: str | Path | None = None) -> list[CacheEntry]:
    """Every entry of the cache of ``kinds`` (default: all of :data:`CACHE_KINDS`), oldest use first."""
    root = Path(root) if root is not None else cache_root()
    kinds = list(kinds) if kinds else list(CACHE_KINDS)
    unknown = sorted(set(kinds) - set(CACHE_KINDS))
    if unknown:
        raise ValueError(f"unknown cache kind(s) {unknown}; choose from {', '.join(CACHE_KINDS)}.")
    entries = []
    for kind in kinds:
        for folder, lock in _entry_folders(kind, root):
            try:
                entries.append(CacheEntry(kind, folder, _size(folder), _last_used(folder, lock), lock))
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


def prune_cache(older_than_days: float, kinds: Sequence[str] | None = None, dry_run: bool = False,
                root: str | Path | None = None) -> tuple[list[CacheEntry], list[CacheEntry]]:
    """Remove the entries of ``kinds`` last used more than ``older_than_days`` ago; ``(removed, skipped as in use)``.

    An entry is removed while holding its lock, taken only if free: an entry a running process
    holds (an encode, an export, a plan's sweep) is skipped and returned as in use. A reader of an
    entry being removed keeps its open files (POSIX), and the next use rebuilds it. With
    ``dry_run`` nothing is removed.
    """
    if older_than_days < 0:
        raise ValueError(f"older_than_days must be >= 0; got {older_than_days}.")
    cutoff = time.time() - older_than_days * 86400.0
    removed, in_use = [], []
    for entry in cache_entries(kinds, root):
        if entry.last_used > cutoff:
            continue
        if entry.lock is None:
            if not dry_run:
                shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry)
            continue
        with lock_if_free(entry.lock) as free:
            if not free:
                in_use.append(entry)
                continue
            if not dry_run:
                shutil.rmtree(entry.path, ignore_errors=True)
                entry.lock.unlink(missing_ok=True)
        removed.append(entry)
    return removed, in_use
