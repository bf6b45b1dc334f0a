"""Facts verified of a read-only corpus are remembered, so a command's layers do not each re-scan it; nothing else is."""

from __future__ import annotations

import numpy as np
import pytest

from embedtune.array_facts import known, remember
from embedtune.errors import NonFiniteError, check_finite
from embedtune.evaluate.search import unit_rows


def _mapped(tmp_path, x, name="x.npy"):
    np.save(tmp_path / name, x)
    return np.load(tmp_path / name, mmap_mode="r")


def test_a_read_only_mapped_corpus_is_checked_once_and_its_views_share_the_fact(tmp_path):
    x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    mapped = _mapped(tmp_path, x / np.linalg.norm(x, axis=1, keepdims=True))
    assert not known(mapped, "finite")
    check_finite(mapped, "x.npy")
    assert known(mapped, "finite") and known(np.asarray(mapped), "finite") and known(np.ascontiguousarray(mapped), "finite")
    assert not known(mapped[1:], "finite")  # another view of other rows: checked on its own
    kept = unit_rows(mapped)
    assert np.shares_memory(kept, mapped) and known(mapped, "unit")  # unit rows: no copy, and the next call skips the pass
    assert unit_rows(mapped).__array_interface__["data"][0] == mapped.__array_interface__["data"][0]


def test_a_writeable_or_owned_array_is_never_remembered():
    x = np.ones((4, 3), dtype=np.float32)
    check_finite(x, "x")
    assert not known(x, "finite")
    x.flags.writeable = False  # can be made writeable again: not remembered either
    remember(x, "finite")
    assert not known(x, "finite")
    x.flags.writeable = True
    x[0, 0] = np.nan
    with pytest.raises(NonFiniteError):
        check_finite(x, "x")


def test_a_corpus_with_nan_is_refused_every_time(tmp_path):
    x = np.ones((20, 4), dtype=np.float32)
    x[7, 2] = np.nan
    mapped = _mapped(tmp_path, x)
    for _ in range(2):
        with pytest.raises(NonFiniteError, match="row 7"):
            check_finite(mapped, "x.npy")
    assert not known(mapped, "finite")


def test_a_fact_dies_with_the_array_it_was_learned_on():
    buffer = np.ones(12, dtype=np.float32).tobytes()  # read-only memory that outlives the arrays over it
    x = np.frombuffer(buffer, dtype=np.float32).reshape(4, 3)
    remember(x, "finite")
    assert known(np.frombuffer(buffer, dtype=np.float32).reshape(4, 3), "finite")  # same memory, layout, dtype: x is alive
    del x
    same_place = np.frombuffer(buffer, dtype=np.float32).reshape(4, 3)
    assert not known(same_place, "finite")  # the array it was learned on is gone: checked again
