"""Advisory file locks between embedtune processes on one machine (POSIX ``flock``).

A cache entry, an exported ONNX graph or a plan's sweep folder is written by one process at a time:
the writer holds :func:`exclusive_lock` on a lock file beside it, and a second process waits
(and says so) instead of doing the same work twice or interleaving files. :func:`is_locked` lets
``embedtune cache prune`` skip what a running job holds. Where ``fcntl`` does not exist (Windows)
both are no-ops: the writes stay atomic, only the deduplication is lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

__all__ = ["exclusive_lock", "is_locked", "lock_if_free", "touch"]


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, waiting: str | None = None) -> Iterator[None]:
    """Hold the exclusive lock of ``path`` (created if missing) for the block; wait while another process holds it.

    ``waiting`` is logged (INFO) once if the lock is busy, so a user sees why the command pauses.
    The lock file's mtime is set to now: it records the last use of what it guards.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting:
                logger.info("%s", waiting)
            fcntl.flock(handle, fcntl.LOCK_EX)
        touch(path)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def lock_if_free(path: str | os.PathLike) -> Iterator[bool]:
    """Take the exclusive lock of ``path`` only if nobody holds it: yields whether it was taken (never waits).

    A missing lock file counts as free (and is not created).
    """
    path = Path(path)
    if fcntl is None or not path.is_file():  # pragma: no cover - Windows
        yield True
        return
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_locked(path: str | os.PathLike) -> bool:
    """Whether another process holds :func:`exclusive_lock` on ``path`` now (False when there is no such file)."""
    if fcntl is None or not Path(path).is_file():  # pragma: no cover - Windows
        return False
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def touch(path: str | os.PathLike) -> None:
    """Set ``path``'s mtime to now (its last use, read by ``embedtune cache``); a read-only cache is left as it is."""
    with contextlib.suppress(OSError):
        os.utime(path)
