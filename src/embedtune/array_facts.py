"""What has been verified of a read-only array's rows (every value finite, every row of unit norm), so a pass is not repeated.

A command on a large memory-mapped corpus checks it in several layers (the loader, the training data, the compressor),
each on its own and each over every row: at 3,000,000 x 384 every such pass is about a second. A fact learned about an
array that cannot change is remembered here, keyed by its memory (address, shape, strides, dtype), and holds while the
array it was learned on is alive (a weak reference: freed memory, reused by another array, never matches). Only
arrays over read-only memory are remembered (a memory-mapped ``.npy`` opened for reading, and views of it): an array
that owns its memory, or views a writeable one, may change after the check (even one marked read-only can be marked
writeable again).

    >>> import numpy as np
    >>> x = np.frombuffer(np.ones(12, dtype=np.float32).tobytes(), dtype=np.float32).reshape(4, 3)  # read-only memory
    >>> remember(x, "finite"); known(x, "finite"), known(x[1:], "finite"), known(np.ones((4, 3)), "finite")
    (True, False, False)
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

__all__ = ["known", "remember"]

#: (fact, address, shape, strides, dtype) -> a weak reference to an array the fact was verified on.
_FACTS: dict[tuple[Any, ...], weakref.ref] = {}
#: More entries than this and the dead ones are dropped (a long-lived process sees many arrays).
_PRUNE_AT = 256


def _over_read_only_memory(array: np.ndarray) -> bool:
    """Whether no array in ``array``'s chain of bases can be written, nor made writeable: the memory under it is read-only."""
    root = array
    while isinstance(root, np.ndarray):
        if root.flags.writeable:
            return False
        root = root.base
    if root is None:  # an array that owns its memory can be made writeable again
        return False
    try:
        return memoryview(root).readonly  # a read-only mmap or bytes
    except TypeError:
        return False


def _key(array: Any, fact: str) -> tuple[Any, ...] | None:
    if not isinstance(array, np.ndarray) or array.size == 0 or not _over_read_only_memory(array):
        return None
    return (fact, array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)


def remember(array: Any, fact: str) -> None:
    """Record that ``fact`` holds of ``array`` (a no-op unless it is a read-only NumPy array)."""
    key = _key(array, fact)
    if key is None:
        return
    try:
        _FACTS[key] = weakref.ref(array)
    except TypeError:  # an array type without weak references: nothing remembered
        return
    if len(_FACTS) > _PRUNE_AT:
        for stale in [k for k, ref in _FACTS.items() if ref() is None]:
            del _FACTS[stale]


def known(array: Any, fact: str) -> bool:
    """Whether ``fact`` was verified of an array with the same read-only memory, layout and dtype that is still alive."""
    key = _key(array, fact)
    if key is None:
        return False
    ref = _FACTS.get(key)
    return ref is not None and ref() is not None
