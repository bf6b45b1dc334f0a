"""Every file embedtune writes is checked before it is used again.

One test per defect: damaged adapter weights and config, newer version stamps, non-deterministic
safetensors bytes, unchecked FAISS index files, unchecked cache ids/meta, unchecked run records,
0600 files, and concurrent processes encoding the same cache entry twice.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import embedtune
from embedtune.bench.grid import RunStore, make_spec, run_grid
from embedtune.compress import load_compressor, make_compressor
from embedtune.compress.base import TrainingData
from embedtune.encoders.cache import EmbeddingCache, cache_key
from embedtune.index import build_index, load_index
from embedtune.io import DIGEST_KEY, IntegrityError, atomic_write_bytes, read_json_verified, save_weights, write_json_with_digest


def _fit_pca(dim: int = 4, d: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(40, d)).astype(np.float32)
    ids = [f"x{i}" for i in range(len(X))]
    return make_compressor("pca", dim=dim).fit(TrainingData(ids, X, ids, X, {})), X


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# -- adapters ---------------------------------------------------------------------------------
def test_overwritten_tensor_bytes_are_refused_before_use(tmp_path):
    """The defect: bytes overwritten in the tensor data (header intact) loaded fine and gave NaN rows."""
    compressor, X = _fit_pca()
    compressor.save(tmp_path / "a")
    weights = tmp_path / "a" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = np.array([np.nan, np.nan], np.float32).tobytes()  # the last float32 values, header untouched
    weights.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"model\.safetensors: sha256 mismatch: expected [0-9a-f]{64}, got [0-9a-f]{64}.*re-train"):
        load_compressor(tmp_path / "a").transform(X)


def test_an_edited_config_value_is_refused(tmp_path):
    compressor, _ = _fit_pca()
    compressor.save(tmp_path / "a")
    config = tmp_path / "a" / "config.json"
    config.write_text(config.read_text().replace('"seed": 2027', '"seed": 2028'))
    with pytest.raises(IntegrityError, match=r"config\.json: content sha256 mismatch"):
        load_compressor(tmp_path / "a")


def test_an_adapter_saved_before_digests_loads_with_a_note(tmp_path, caplog):
    compressor, X = _fit_pca()
    compressor.save(tmp_path / "a")
    config = tmp_path / "a" / "config.json"
    values = json.loads(config.read_text())
    del values[DIGEST_KEY], values["weights_sha256"]
    values["embedtune_version"] = "0.0.9"  # an embedtune that wrote no digests
    config.write_text(json.dumps(values))
    with caplog.at_level(logging.INFO, logger="embedtune.compress.base"):
        loaded = load_compressor(tmp_path / "a")
    np.testing.assert_array_equal(loaded.transform(X), compressor.transform(X))
    notes = [r.getMessage() for r in caplog.records if "without integrity digests" in r.getMessage()]
    assert len(notes) == 1 and "\n" not in notes[0]


def test_an_adapter_of_this_version_with_both_digests_removed_is_refused(tmp_path):
    """The defect: removing both digest fields made an edited adapter load "unchecked", exit 0."""
    compressor, X = _fit_pca()
    compressor.save(tmp_path / "a")
    config = tmp_path / "a" / "config.json"
    values = json.loads(config.read_text())
    del values[DIGEST_KEY], values["weights_sha256"]
    values["config"]["seed"] = 1
    config.write_text(json.dumps(values))
    with pytest.raises(IntegrityError, match=r"config\.json: fields 'weights_sha256' and 'content_sha256' are missing, which embedtune .* always writes"):
        load_compressor(tmp_path / "a")
    del values["embedtune_version"]
    config.write_text(json.dumps(values))
    with pytest.raises(IntegrityError, match="no version stamp"):
        load_compressor(tmp_path / "a")


@pytest.mark.parametrize("field, value, message", [
    ("input_dim", "8", "field 'input_dim' must be a positive integer; got '8'"),
    ("config", [4], "field 'config' must be a JSON object; got list"),
    ("input_normalization", "l1", "field 'input_normalization' is 'l1'"),
])
def test_a_config_json_with_wrong_types_names_the_file_and_field(tmp_path, field, value, message):
    compressor, _ = _fit_pca()
    compressor.save(tmp_path / "a")
    values, _ = read_json_verified(tmp_path / "a" / "config.json", "")
    write_json_with_digest(tmp_path / "a" / "config.json", {**values, field: value})  # digests recomputed: only the types are wrong
    with pytest.raises(ValueError, match=rf"config\.json: {message}"):
        load_compressor(tmp_path / "a")


def _restamp(folder: Path, version: str) -> None:
    config = folder / "config.json"
    values, _ = read_json_verified(config, "")
    write_json_with_digest(config, {**values, "embedtune_version": version})


def test_an_adapter_from_a_newer_embedtune_gets_a_warning_naming_both_versions(tmp_path):
    compressor, _ = _fit_pca()
    compressor.save(tmp_path / "a")
    major, minor = (int(part) for part in embedtune.__version__.split(".")[:2])
    _restamp(tmp_path / "a", f"{major}.{minor + 1}.0")
    with pytest.warns(UserWarning, match=rf"embedtune {major}\.{minor + 1}\.0, newer than the installed embedtune {embedtune.__version__}"):
        load_compressor(tmp_path / "a")
    _restamp(tmp_path / "a", f"{major + 1}.0.0")
    with pytest.raises(ValueError, match=rf"embedtune {major + 1}\.0\.0, a newer major version than the installed embedtune"):
        load_compressor(tmp_path / "a")
    _restamp(tmp_path / "a", embedtune.__version__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_compressor(tmp_path / "a")


def test_identical_fits_write_identical_bytes(tmp_path):
    """safetensors writes its metadata in hash-map order; embedtune sorts it."""
    folders = []
    for run in range(2):
        compressor, _ = _fit_pca(seed=0)
        for copy in range(6):  # several saves: an unsorted header differs between saves with high probability
            folders.append(compressor.save(tmp_path / f"run{run}-{copy}"))
    for name in ("model.safetensors", "config.json"):
        contents = {(folder / name).read_bytes() for folder in folders}
        assert len(contents) == 1, name


def test_save_weights_sorts_a_larger_metadata(tmp_path):
    metadata = {f"key{i}": str(i) for i in range(8)}
    paths = [save_weights(tmp_path / f"w{i}.safetensors", {"w": np.ones(3, np.float32)}, metadata=metadata) for i in range(4)]
    assert len({path.read_bytes() for path in paths}) == 1
    header = paths[0].read_bytes()[8:]
    assert header.index(b'"key0"') < header.index(b'"key7"')


# -- FAISS index ------------------------------------------------------------------------------
def test_a_damaged_faiss_index_is_refused_before_faiss_reads_it(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(30, 8)).astype(np.float32))
    out = build_index(tmp_path / "x.npy", tmp_path / "index", ids=[f"d{i}" for i in range(30)])
    assert load_index(out).faiss_index.ntotal == 30
    index_file = out / "index.faiss"
    _flip(index_file, index_file.stat().st_size - 5)  # inside the float data: FAISS would load it silently
    with pytest.raises(IntegrityError, match=r"index\.faiss: xxh3_128 mismatch.*embedtune index build"):
        load_index(out)


def test_an_index_folder_of_format_1_is_checked_with_its_sha256(tmp_path):
    """Folders built before the XXH3 digests (format 1, ``manifest["sha256"]``) still load, and are still checked."""
    import json

    from embedtune.io import sha256_file, write_json_with_digest, xxh3_file

    np.save(tmp_path / "x.npy", np.random.default_rng(1).normal(size=(12, 4)).astype(np.float32))
    out = build_index(tmp_path / "x.npy", tmp_path / "index", ids=[f"d{i}" for i in range(12)])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    assert manifest["xxh3_128"] == {name: xxh3_file(out / name) for name in ("index.faiss", "ids.txt")}
    manifest.pop("content_sha256")
    digests = manifest.pop("xxh3_128")
    write_json_with_digest(out / "manifest.json", {**manifest, "format_version": 1, "sha256": {n: sha256_file(out / n) for n in digests}})
    assert load_index(out).faiss_index.ntotal == 12
    _flip(out / "index.faiss", (out / "index.faiss").stat().st_size - 5)
    with pytest.raises(IntegrityError, match=r"index\.faiss: sha256 mismatch"):
        load_index(out)


def test_a_damaged_index_manifest_or_ids_file_is_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32))
    out = build_index(tmp_path / "x.npy", tmp_path / "index", ids=[f"d{i}" for i in range(10)])
    (out / "ids.txt").write_text((out / "ids.txt").read_text().replace("d3\n", "d8\n"))
    with pytest.raises(IntegrityError, match=r"ids\.txt: xxh3_128 mismatch"):
        load_index(out)


# -- embedding cache --------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["ids", "meta"])
def test_a_damaged_cache_entry_is_rebuilt_even_without_expected_ids(tmp_path, damage):
    cache = EmbeddingCache(tmp_path / "cache")
    key = cache_key({"test": 1})
    ids = ["a1", "b2", "c3"]
    cache.store(key, ids, np.eye(3, dtype=np.float32), {"parts": {"recipe": "x"}})
    folder = cache.entry(key)
    if damage == "ids":
        (folder / "ids.json").write_text((folder / "ids.json").read_text().replace("b2", "b3"))
    else:
        (folder / "meta.json").write_text((folder / "meta.json").read_text().replace('"recipe": "x"', '"recipe": "y"'))
    assert cache.load(key) is None
    assert not folder.exists()


_LOCK_WORKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np
    from embedtune.encoders.cache import EmbeddingCache

    root, folder, role = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

    def compute(lo, hi):
        with open(folder / "calls.txt", "a") as handle:
            handle.write(role + "\\n")
        for _ in range(1200):  # hold the entry until the other process is about to ask for it
            if (folder / "second-ready").exists():
                break
            time.sleep(0.05)
        time.sleep(1.0)
        return np.arange(lo * 4, hi * 4, dtype=np.float32).reshape(hi - lo, 4)

    if role == "second":
        (folder / "second-ready").touch()
    embeddings, hit = EmbeddingCache(root).get_or_compute({"entry": "shared"}, [f"d{i}" for i in range(6)], compute)
    print("hit" if hit else "miss", float(np.asarray(embeddings).sum()))
""")


def test_a_second_process_waits_for_the_entry_and_reuses_it(tmp_path):
    """Two processes want the same entry: one encodes, the other waits for it and reuses the result."""
    command = [sys.executable, "-c", _LOCK_WORKER, str(tmp_path / "cache"), str(tmp_path)]
    first = subprocess.Popen([*command, "first"], stdout=subprocess.PIPE, text=True)
    for _ in range(1200):  # the second starts once the first is encoding (holding the entry)
        if (tmp_path / "calls.txt").exists() or first.poll() is not None:
            break
        time.sleep(0.05)
    second = subprocess.run([*command, "second"], capture_output=True, text=True, timeout=120)
    out_first, _ = first.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    assert (tmp_path / "calls.txt").read_text().split() == ["first"], "the second process encoded the entry again"
    assert out_first.split()[0] == "miss" and second.stdout.split()[0] == "hit"
    assert out_first.split()[1] == second.stdout.split()[1]


# -- benchmark run records --------------------------------------------------------------------
def test_a_run_record_whose_digest_fails_is_redone_with_a_warning(tmp_path, caplog):
    spec = make_spec("toy", "x", "b", "m", "test", "pca", 8, 2027)
    store = RunStore(tmp_path)
    store.save(spec, {"metrics": {"ndcg@10": 0.5}})
    path = store.path(spec)
    path.write_text(path.read_text().replace("0.5", "0.9"))
    executed = []

    def execute(run):
        executed.append(run.key)
        return {"metrics": {"ndcg@10": 0.5}}

    with caplog.at_level(logging.WARNING, logger="embedtune.bench.grid"):
        records = run_grid([spec], store, execute, progress=False)
    assert executed == [spec.key] and records[spec.key]["metrics"]["ndcg@10"] == 0.5
    assert any("content sha256 mismatch" in r.getMessage() and "redone" in r.getMessage() for r in caplog.records)
    assert store.load(spec)["metrics"]["ndcg@10"] == 0.5


def test_a_run_record_written_before_digests_is_still_finished(tmp_path):
    spec = make_spec("toy", "x", "b", "m", "test", "pca", 8, 2027)
    store = RunStore(tmp_path)
    store.path(spec).parent.mkdir(parents=True)
    store.path(spec).write_text(json.dumps({"spec": spec.to_dict(), "metrics": {"ndcg@10": 0.25}}))
    assert store.load(spec)["metrics"]["ndcg@10"] == 0.25


# -- permissions ------------------------------------------------------------------------------
def test_written_files_get_the_permissions_the_umask_allows(tmp_path):
    previous = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "plain.bin", b"x")
        compressor, _ = _fit_pca()
        compressor.save(tmp_path / "adapter")
        os.umask(0o077)
        atomic_write_bytes(tmp_path / "private.bin", b"x")
    finally:
        os.umask(previous)
    assert (tmp_path / "plain.bin").stat().st_mode & 0o777 == 0o644
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "adapter").iterdir()} == {"config.json": 0o644, "model.safetensors": 0o644}
    assert (tmp_path / "private.bin").stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="folder ownership is a POSIX notion")
def test_atomic_writes_create_their_file_in_a_private_folder_and_reserve_it_in_a_shared_one(tmp_path):
    """In a folder only its owner can write to, the writer creates the temporary file (ext4 writes back a file
    truncated by its writer as it closes it, which doubled a large index's write time); in a folder others may
    write to, the name is held by an empty file until the writer replaces it."""
    from embedtune.io import atomic_write

    seen = {}

    def writer(tmp: Path) -> None:
        seen[tmp.parent.name] = tmp.exists()
        tmp.write_bytes(b"payload")

    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir(mode=0o700)
    shared.mkdir()
    shared.chmod(0o777)
    for folder in (private, shared):
        atomic_write(folder / "out.bin", writer)
        assert (folder / "out.bin").read_bytes() == b"payload"
        assert [p.name for p in folder.iterdir()] == ["out.bin"]
    assert seen == {"private": False, "shared": True}
    # A writer that writes nothing still leaves the empty file it would have found.
    atomic_write(private / "empty.bin", lambda tmp: None)
    assert (private / "empty.bin").read_bytes() == b""
    # A failing writer leaves nothing behind, in either kind of folder.
    for folder in (private, shared):
        with pytest.raises(RuntimeError):
            atomic_write(folder / "failed.bin", lambda tmp: (tmp.write_bytes(b"half"), (_ for _ in ()).throw(RuntimeError("x"))))
        assert not (folder / "failed.bin").exists() and not list(folder.glob(".*.tmp"))


def test_a_saved_config_from_a_newer_embedtune_gets_a_warning(tmp_path):
    from dataclasses import dataclass

    from embedtune.io import load_config, save_config

    @dataclass
    class Settings:
        steps: int = 3

    save_config(Settings(), tmp_path)
    values = json.loads((tmp_path / "config.json").read_text())
    major = int(embedtune.__version__.split(".")[0])
    (tmp_path / "config.json").write_text(json.dumps({**values, "embedtune_version": f"{major}.999.0"}))
    with pytest.warns(UserWarning, match=rf"{major}\.999\.0, newer than the installed embedtune {embedtune.__version__}"):
        assert load_config(Settings, tmp_path).steps == 3
