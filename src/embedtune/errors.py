"""The errors embedtune raises on purpose, and the finiteness check every number goes through.

Every error here is a :class:`ValueError` (so ``except ValueError`` keeps working) whose message
names the file or object, the row or field, and the fix. The CLI prints such a message as one
line and exits non-zero; ``embedtune -v`` shows the traceback too.

:func:`check_finite` is the one place where arrays are checked for NaN and infinity: at load
time (precomputed vectors, ``compress apply`` input) and after every transform, so that no
metric or file is ever computed from a non-finite value.
"""

from __future__ import annotations

import errno
from typing import Any

import numpy as np

from embedtune.array_facts import known, remember

__all__ = ["EmbedtuneError", "NonFiniteError", "NoQueriesError", "NoSpaceError", "check_finite", "VECTORS_FIX"]

#: The fix every reader of vector files names for a NaN or infinite value.
VECTORS_FIX = "drop or re-encode the rows holding NaN or infinity; every score would be computed from them"

# Rows per isfinite() pass: bounded temporaries on a memory-mapped corpus of any size.
_BLAS_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_FINITE_BLOCK_BYTES = 64 << 20


class EmbedtuneError(ValueError):
    """Base class of the errors embedtune raises for bad input, data or state.

    The message is complete on its own: what is wrong, where (file, row or field), and the fix.
    """


class NonFiniteError(EmbedtuneError):
    """An array holds NaN or infinite values.

    Attributes:
        source: the file or object the array came from.
        row: the first row (0-based, counted in ``source``) holding a non-finite value.
        column: the first non-finite column of that row.
        value: that value (``nan``, ``inf`` or ``-inf``).
        count: how many rows hold a non-finite value.
    """

    def __init__(self, source: str, what: str, row: int, column: int, value: float, count: int, fix: str, partial: bool = False) -> None:
        self.source, self.what, self.row, self.column, self.value, self.count, self.fix = source, what, row, column, value, count, fix
        self.partial = partial
        more = (f"; at least {count} rows are not finite" if partial else f"; {count} rows in all are not finite") if count > 1 else ""
        super().__init__(
            f"{source}: {what} row {row} (0-based) holds {value!r} at column {column}{more}. Fix: {fix}"
        )

    def __reduce__(self) -> tuple:
        # Pickled whole (a Ray actor's error reaches the driver this way): the default would call __init__ with the message only.
        return type(self), (self.source, self.what, self.row, self.column, self.value, self.count, self.fix, self.partial)

    def shifted(self, offset: int, source: str | None = None, what: str | None = None) -> "NonFiniteError":
        """The same first bad row, counted ``offset`` further on (a block of a larger array), optionally renamed.

        The count is dropped: a padded or partial block cannot say how many rows of the whole are bad.
        """
        return NonFiniteError(source or self.source, what or self.what, self.row + offset, self.column, self.value, 1, self.fix)


class NoSpaceError(EmbedtuneError, OSError):
    """A write failed because the disk is full (or a quota or size limit is met); the message names the file and the fix.

    An :class:`OSError` too (``errno`` is ``ENOSPC``), so code that tolerates a failed best-effort
    write (``except OSError``) still does.

    Attributes:
        path: the file or folder being written.
        reason: what was met (the disk full, the quota, a size limit).
        detail: the operating system's or the writer's own words.
        fix: what the user should do.
    """

    def __init__(self, path: str, reason: str, detail: str, fix: str) -> None:
        self.path, self.reason, self.detail, self.fix = path, reason, detail, fix
        super().__init__(f"{path}: could not write it: {reason} ({detail}); nothing was written there. Fix: {fix}")
        self.errno = errno.ENOSPC


class NoQueriesError(EmbedtuneError):
    """Nothing is left to score or train on; the message says which step left nothing."""


def check_finite(
    array: Any,
    source: str,
    what: str = "vectors",
    *,
    row_offset: int = 0,
    fix: str = "drop or repair those rows (e.g. re-encode them) before using the file",
    partial: bool = False,
) -> None:
    """Raise :class:`NonFiniteError` if ``array`` holds NaN or infinity, naming the first bad row.

    Works block by block, so a memory-mapped array of any size is scanned with bounded memory.
    Integer and boolean arrays are always finite; other non-float dtypes are left to the caller.

    Args:
        array: an array of shape (n,) or (n, ...); rows are the first axis.
        source: where the array came from, e.g. the file path (the message starts with it).
        what: what the rows are, e.g. ``"doc vectors"`` or ``"output of pca"``.
        row_offset: added to reported rows, for a block that starts at row ``row_offset`` of ``source``.
        fix: what the user should do about it.
        partial: ``array`` is one block of ``source``, so the count of bad rows is a lower bound.
    """
    values = np.asarray(array) if not isinstance(array, np.ndarray) else array
    if values.dtype.kind not in "fc" or values.size == 0 or known(values, "finite"):  # a read-only array checked before
        return
    rows = values.reshape(len(values), -1) if values.ndim >= 1 else values.reshape(1, 1)
    step = max(1, _FINITE_BLOCK_BYTES // max(1, rows.shape[1] * rows.itemsize))
    first: tuple[int, int, float] | None = None
    count = 0
    for lo in range(0, len(rows), step):
        block = rows[lo : lo + step]
        # Fast path: NaN and infinity propagate through a row's sum, which reads the block once with no
        # temporary (~6x faster than isfinite().all()); a finite row can only sum to infinity by
        # overflow, and such blocks get the exact check below. For float32/float64 rows the sum is a
        # BLAS matrix-vector product with ones, twice as fast again as numpy's sum.
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow or inf - inf here only sends the block to the exact check
            sums = block @ np.ones(block.shape[1], block.dtype) if block.dtype in _BLAS_FLOATS else block.sum(axis=1)
        if np.isfinite(sums).all():
            continue
        finite = np.isfinite(block)
        bad_rows = ~finite.all(axis=1)
        if not bad_rows.any():
            continue
        count += int(bad_rows.sum())
        if first is None:
            row = int(np.argmax(bad_rows))
            column = int(np.argmin(finite[row]))
            first = (lo + row, column, block[row, column].item())
    if first is not None:
        row, column, value = first
        raise NonFiniteError(source, what, row + row_offset, column, value, count, fix, partial=partial)
    remember(values, "finite")
