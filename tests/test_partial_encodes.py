"""benchmarks/partial_encodes.py carries an unfinished encode to a new cache, and the cache resumes from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from embedtune.encoders.cache import EmbeddingCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import partial_encodes  # noqa: E402

IDS = [f"d{i}" for i in range(10)]
PARTS = {"model": "test-model", "data": "test-data", "kind": "document"}


def _rows(lo: int, hi: int) -> np.ndarray:
    return np.arange(lo * 3, hi * 3, dtype=np.float32).reshape(hi - lo, 3)


def _interrupted_encode(cache: EmbeddingCache) -> None:
    def compute(lo: int, hi: int) -> np.ndarray:
        if lo >= 4:
            raise KeyboardInterrupt  # the session ends after the first shard
        return _rows(lo, hi)

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_compute(PARTS, IDS, compute, shard_size=4)


def test_a_saved_partial_encode_resumes_in_a_new_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partial_encodes, "STORE", tmp_path / "store")
    monkeypatch.setenv("EMBEDTUNE_CACHE", str(tmp_path / "old-cache"))
    _interrupted_encode(EmbeddingCache())
    assert partial_encodes.save([""]) == 0

    monkeypatch.setenv("EMBEDTUNE_CACHE", str(tmp_path / "new-cache"))
    assert partial_encodes.restore() == 0
    encoded: list[tuple[int, int]] = []

    def compute(lo: int, hi: int) -> np.ndarray:
        encoded.append((lo, hi))
        return _rows(lo, hi)

    vectors, hit = EmbeddingCache().get_or_compute(PARTS, IDS, compute, shard_size=4)
    assert not hit
    assert encoded == [(4, 8), (8, 10)]  # the restored first shard is reused, not encoded again
    np.testing.assert_array_equal(vectors, _rows(0, 10))


def _stored_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder of a store entry (key ``ab...``), the store and the cache under ``tmp_path``."""
    store = tmp_path / "store"
    monkeypatch.setattr(partial_encodes, "STORE", store)
    monkeypatch.setenv("EMBEDTUNE_CACHE", str(tmp_path / "cache"))
    entry = store / ("ab" * 32)
    entry.mkdir(parents=True)
    return entry


def test_a_store_without_the_shards_records_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    entry = _stored_entry(tmp_path, monkeypatch)
    np.save(entry / "0000000000-0000000004.npy", _rows(0, 4))
    (entry / "manifest.json").write_text(json.dumps({"key": "ab" * 32, "shards": {"0000000000-0000000004.npy": "0" * 64}}))
    assert partial_encodes.restore() == 1
    assert "saved without the shards' records" in capsys.readouterr().err


def test_a_manifest_naming_a_file_outside_the_partial_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    entry = _stored_entry(tmp_path, monkeypatch)
    (entry / "manifest.json").write_text(json.dumps({"key": "ab" * 32, "shards": {"../../escape.npy": "0" * 64}, "records": {}}))
    assert partial_encodes.restore() == 1
    assert "'../../escape.npy' is not a cache key or a shard file name" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()
